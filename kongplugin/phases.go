package kongplugin

import (
	"bytes"
	"encoding/json"
	"slices"
	"sync"

	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
)

// Variant is which of Kong's phases a plugin server asks Kong for. Kong
// runs a plugin's declared phases for every request on every route that
// uses it, whatever the instance's config (kong/runloop/plugins_iterator.lua
// keys them by the plugin's handler, not its config), and a Go plugin's log
// phase is not free: kong/runloop/plugin_servers/plugin.lua starts a timer,
// serializes the request with kong.log.serialize and makes a socket round
// trip for it. So the plugin comes as two commands, each named by its
// executable as Kong names a Go plugin: tollgate, the access phase only, and
// tollgate-response, which also runs in the log phase for what needs the
// finished response.
type Variant int

const (
	// AccessOnly (command tollgate) decides in Kong's access phase and
	// nothing else: one socket event per request, as Kong's own
	// rate-limiting (its handler has access only). Its schema has no
	// adaptive or charge record and no in_flight algorithm, so Kong's
	// Admin API refuses configs that need the response.
	AccessOnly Variant = iota
	// WithResponse (command tollgate-response) adds Kong's log phase:
	// in-flight limits give their slots back there, adaptive limits read
	// the upstream's status and time, and limits charged after the
	// response are charged what it cost.
	WithResponse
)

// name is the command, and so the plugin, of variant v.
func (v Variant) name() string {
	if v == WithResponse {
		return "tollgate-response"
	}
	return "tollgate"
}

// phases lists the Kong phases v asks for, in -dump's words.
func (v Variant) phases() []string {
	if v == WithResponse {
		return []string{"access", "log"}
	}
	return []string{"access"}
}

// schemas are the declarations of each variant: schema.json is
// WithResponse's; AccessOnly's is derived from it. Each is parsed at its
// first use, not when the program starts: parsing them all took 17 ms
// before a plugin server listened, and Kong 3.9.3 answers 500 to a
// request that reaches a Go plugin before its socket exists
// (kong/runloop/plugin_servers/plugin.lua: a failed start_instance is an
// error, not retried), which Kong's own specs send right after starting
// Kong.
var schemas = [...]func() *kongschema.Schema{
	AccessOnly:   sync.OnceValue(func() *kongschema.Schema { return kongschema.MustParse(accessOnly(schemaJSON)) }),
	WithResponse: sync.OnceValue(func() *kongschema.Schema { return kongschema.MustParse(schemaJSON) }),
}

// dblessSchemas are schemas without policy cluster, for a Kong with no
// database (see forKong), parsed at first use as schemas are.
var dblessSchemas = [...]func() *kongschema.Schema{
	AccessOnly:   sync.OnceValue(func() *kongschema.Schema { return kongschema.MustParse(accessOnly(withoutCluster(schemaJSON))) }),
	WithResponse: sync.OnceValue(func() *kongschema.Schema { return kongschema.MustParse(withoutCluster(schemaJSON)) }),
}

// needsResponse are what AccessOnly leaves out of the declaration: the
// adaptive and charge records, and in_flight among the algorithms.
const (
	adaptiveField = "adaptive"
	chargeField   = "charge"
	inFlight      = "in_flight"
)

// accessOnly derives AccessOnly's declaration from the full one: the
// same, without the adaptive record and the in_flight algorithm.
func accessOnly(full []byte) []byte {
	var decl any
	dec := json.NewDecoder(bytes.NewReader(full))
	dec.UseNumber() // numbers as declared
	if err := dec.Decode(&decl); err != nil {
		panic(err) // schema.json is compiled in; MustParse reports its errors
	}
	var strip func(v any) any
	strip = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if k == "fields" {
					fields, _ := e.([]any)
					v[k] = slices.DeleteFunc(fields, func(f any) bool {
						m, _ := f.(map[string]any)
						_, adaptive := m[adaptiveField]
						_, charge := m[chargeField]
						return adaptive || charge
					})
				}
				if k == "algorithm" {
					if f, ok := e.(map[string]any); ok {
						if list, ok := f["one_of"].([]any); ok {
							f["one_of"] = slices.DeleteFunc(list, func(a any) bool { return a == inFlight })
						}
					}
				}
				v[k] = strip(v[k])
			}
		case []any:
			for i := range v {
				v[i] = strip(v[i])
			}
		}
		return v
	}
	// Entity checks that name the adaptive record go with it.
	if top, ok := decl.(map[string]any); ok {
		if checks, ok := top["entity_checks"].([]any); ok {
			top["entity_checks"] = slices.DeleteFunc(checks, func(c any) bool {
				b, _ := json.Marshal(c)
				return bytes.Contains(b, []byte(`"config.`+adaptiveField+`.`))
			})
		}
	}
	out, err := json.Marshal(strip(decl))
	if err != nil {
		panic(err)
	}
	return out
}
