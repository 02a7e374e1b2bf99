package kongplugin

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/tollgate/tollgate/internal/kongproc"
)

// kongRateLimiting is Kong 3.x's rate-limiting config schema (its
// schema.lua, kong/tools/redis/schema.lua and the typedefs they use),
// field by field, with the attributes Kong declares that a JSON dump can
// carry. Custom validators (Lua functions) are listed in kongRefuses.
var kongRateLimiting = map[string]map[string]any{
	"second": {"type": "number", "gt": 0}, "minute": {"type": "number", "gt": 0}, "hour": {"type": "number", "gt": 0},
	"day": {"type": "number", "gt": 0}, "month": {"type": "number", "gt": 0}, "year": {"type": "number", "gt": 0},
	"limit_by":            {"type": "string", "default": "consumer", "one_of": []any{"consumer", "credential", "ip", "service", "header", "path"}},
	"header_name":         {"type": "string"},
	"path":                {"type": "string", "starts_with": "/"},
	"policy":              {"type": "string", "default": "local", "len_min": 0, "one_of": []any{"local", "cluster", "redis"}},
	"fault_tolerant":      {"type": "boolean", "required": true, "default": true},
	"redis":               {"type": "record"},
	"redis.host":          {"type": "string"},
	"redis.port":          {"type": "integer", "between": []any{0, 65535}},
	"redis.timeout":       {"type": "integer", "between": []any{0, 2147483646}, "default": 2000},
	"redis.username":      {"type": "string", "referenceable": true},
	"redis.password":      {"type": "string", "referenceable": true, "encrypted": true, "len_min": 0},
	"redis.database":      {"type": "integer", "default": 0},
	"redis.ssl":           {"type": "boolean", "default": false},
	"redis.ssl_verify":    {"type": "boolean", "default": false},
	"redis.server_name":   {"type": "string"},
	"hide_client_headers": {"type": "boolean", "required": true, "default": false},
	"error_code":          {"type": "number", "default": 429, "gt": 0},
	"error_message":       {"type": "string", "default": "API rate limit exceeded"},
	"sync_rate":           {"type": "number", "required": true, "default": -1},
}

// deliberate lists where tollgate's declaration differs from Kong's, and
// why; README's migration table says the same.
var deliberate = map[string]string{
	"policy.one_of":      "cluster keeps counters in Kong's database, which a Go plugin cannot reach: refused at the Admin API, as Kong's own DB-less declaration does",
	"error_code.type":    "a status is a whole number (and tollgate adds between 400 and 599: a denial is a 4xx or 5xx)",
	"error_code.between": "a denial is a 4xx or 5xx",
	// Kong's typedefs check these with Lua custom validators
	// (kong/db/schema/typedefs.lua: validate_path, header_name, validate_host,
	// validate_sni); a dump carries their rules as patterns.
	"path.match_all":               "Kong's path typedef, as a pattern",
	"path.match_none":              "Kong's path typedef, as patterns",
	"header_name.match_all":        "Kong's header_name typedef, as a pattern",
	"redis.host.match_none":        "Kong's host typedef, as patterns",
	"redis.server_name.match_none": "Kong's sni typedef, as patterns",
	// tollgate's own bounds.
	"second.between":         "at most 15 digits, the largest count a RateLimit header carries (RFC 9651); larger would fail every request when the instance starts",
	"minute.between":         "as second",
	"hour.between":           "as second",
	"day.between":            "as second",
	"month.between":          "as second",
	"year.between":           "as second",
	"redis.database.between": "a Redis database number is not negative (Kong's schema takes -1, which fails at SELECT on every request); 2^20 is far above any server's databases setting",
}

// isValidator says whether a field attribute refuses values.
func isValidator(attr string) bool {
	switch attr {
	case "between", "eq", "ne", "gt", "len_eq", "len_min", "len_max", "match", "not_match", "match_all", "match_none",
		"starts_with", "one_of", "not_one_of", "contains", "is_regex", "timestamp", "uuid":
		return true
	}
	return false
}

// TestKongSchemaHasKongsFields: every field of Kong's rate-limiting schema
// is declared with Kong's type, default and constraints, in the dump the
// real plugin binary prints.
func TestKongSchemaHasKongsFields(t *testing.T) {
	config := dumpedConfig(t)
	for path, attrs := range kongRateLimiting {
		ours := fieldAt(config, path)
		if ours == nil {
			t.Errorf("%s: not declared", path)
			continue
		}
		for attr, want := range attrs {
			if got := normalize(ours[attr]); !reflect.DeepEqual(got, normalize(want)) {
				if why, ok := deliberate[path+"."+attr]; ok {
					t.Logf("%s.%s: %v where Kong has %v, on purpose: %s", path, attr, got, want, why)
					continue
				}
				t.Errorf("%s.%s: %v, Kong declares %v", path, attr, got, want)
			}
		}
		// A check Kong does not make refuses configs Kong takes.
		for attr := range ours {
			if _, kongs := attrs[attr]; kongs || !isValidator(attr) {
				continue
			}
			if why, ok := deliberate[path+"."+attr]; ok {
				t.Logf("%s.%s: %v where Kong has none, on purpose: %s", path, attr, ours[attr], why)
				continue
			}
			t.Errorf("%s.%s: %v, a check Kong's declaration does not make", path, attr, ours[attr])
		}
	}
	// typedefs.path's empty-segment rule and typedefs.header_name's
	// characters travel as patterns.
	if m := fmt.Sprint(fieldAt(config, "path")["match_none"]); !strings.Contains(m, "must not have empty segments") {
		t.Errorf("path: match_none %s lacks Kong's empty-segment rule", m)
	}
	if fieldAt(config, "header_name")["match_all"] == nil {
		t.Error("header_name: no pattern for Kong's allowed characters")
	}
}

// kongRefuses are the configs Kong's rate-limiting refuses (its schema
// spec and the rules of schema.lua and the typedefs), with the words the
// refusal carries; the dump carries every one of them, so Kong's Admin API
// refuses them before any instance could start.
var kongRefuses = []struct {
	config string
	want   string
}{
	{`{}`, "at least one of these fields must be non-empty: 'config.second'"},
	{`{"second": 0}`, "config.second: value must be greater than 0"},
	{`{"minute": -3}`, "config.minute: value must be greater than 0"},
	{`{"second": 10, "limit_by": "header"}`, "config.header_name: required field missing"},
	{`{"second": 10, "limit_by": "path"}`, "config.path: required field missing"},
	{`{"second": 10, "limit_by": "cookie"}`, "config.limit_by: expected one of"},
	{`{"second": 10, "policy": "carrier-pigeon"}`, "config.policy: expected one of"},
	{`{"second": 10, "policy": "redis"}`, "must set one of 'config.redis.host'"},
	{`{"second": 10, "sync_rate": 1}`, "sync_rate can only be used with the redis policy"},
	{`{"second": 10, "policy": "redis", "redis": {"host": "h"}, "sync_rate": 0.01}`, "sync_rate must be greater than 0.02, or -1 to disable"},
	{`{"second": 10, "policy": "redis", "redis": {"host": "h"}, "sync_rate": 0}`, "sync_rate must be greater than 0.02, or -1 to disable"},
	{`{"second": 10, "policy": "redis", "redis": {"host": "h"}, "sync_rate": -3}`, "sync_rate must be greater than 0.02, or -1 to disable"},
	{`{"second": 10, "header_name": "bad header"}`, "config.header_name: bad header name"},
	{`{"second": 10, "path": "login"}`, "config.path: should start with: /"},
	{`{"second": 10, "path": "/a//b"}`, "config.path: must not have empty segments"},
	{`{"second": 10, "path": "/a b"}`, "config.path: invalid path"},
	{`{"second": 10, "path": "/a%zz"}`, "config.path: invalid url-encoded value"},
	{`{"second": 10, "redis": {"port": 65536}}`, "config.redis.port: value should be between 0 and 65535"},
	{`{"second": 10, "redis": {"timeout": -1}}`, "config.redis.timeout: value should be between 0 and 2147483646"},
	{`{"second": 10, "redis": {"database": 1.5}}`, "config.redis.database: expected an integer"},
	{`{"second": 10, "error_code": 0}`, "config.error_code: value must be greater than 0"},
	{`{"second": 10, "fault_tolerant": "yes"}`, "config.fault_tolerant: expected a boolean"},
	{`{"second": 10, "error_message": ""}`, "config.error_message: length must be at least 1"},
	{`{"second": "ten"}`, "config.second: expected a number"},
	{`{"second": 10, "adaptive": {"controller": "vegas"}}`, "config.adaptive.controller: expected one of: gradient, aimd"},
	// tollgate's rule: Kong's default algorithm, fixed_window, cannot adapt.
	{`{"second": 10, "adaptive": {"enabled": true}}`, "config.adaptive.enabled: adaptive limits need algorithm gcra, token_bucket or leaky_bucket"},
	{`{"second": 10, "adaptive": {"tolerance": 0.5}}`, "config.adaptive.tolerance: value must be greater than 1"},
	{`{"second": 10, "colour": "blue"}`, "config.colour: unknown field"},
	// Counts above a header's 15 digits are refused at the Admin API
	// (tollgate's bound: Kong's own plugin takes them), so Kong never
	// stores a config the plugin could not start.
	{`{"minute": 1e30}`, "config.minute: value should be between 0 and 999999999999999 (got 1e+30)"},
	{`{"minute": 9223372036854775808}`, "config.minute: value should be between 0 and 999999999999999"},
	{`{"plans": [{"name": "free", "hour": 1e16}], "default_plan": "free"}`, "config.plans[0].hour: value should be between 0 and 999999999999999"},
	{`{"minute": 5, "policy": "redis", "redis": {"host": "h"}, "sync_rate": 1e300}`, "config.sync_rate: sync_rate must be at most a day (86400 seconds)"},
	{`{"second": 10, "redis": {"hots": "h"}}`, "config.redis.hots: unknown field"},
	// Kong's host and sni typedefs (kong/db/schema/typedefs.lua,
	// validate_host and validate_sni), as patterns a dump can carry.
	{`{"minute": 5, "policy": "redis", "redis": {"host": "redis:6379"}}`, "config.redis.host: must not have a port"},
	{`{"minute": 5, "policy": "redis", "redis": {"host": "[::1]:6379"}}`, "config.redis.host: must not have a port"},
	{`{"minute": 5, "policy": "redis", "redis_host": "redis:6379"}`, "config.redis_host: must not have a port"},
	{`{"minute": 5, "policy": "redis", "redis": {"host": ":::not a host:::"}}`, "config.redis.host: invalid value"},
	{`{"minute": 5, "policy": "redis", "redis": {"host": "h", "server_name": "10.0.0.1"}}`, "config.redis.server_name: must not be an IP"},
	{`{"minute": 5, "policy": "redis", "redis": {"host": "h", "server_name": "::1"}}`, "config.redis.server_name: must not be an IP"},
	{`{"minute": 5, "policy": "redis", "redis": {"host": "h", "server_name": "redis.example.com:443"}}`, "config.redis.server_name: must not have a port"},
	{`{"limits": [{"count": 5, "window": "1m", "brust": 3}]}`, "config.limits[0].brust: unknown field"},
	// What the declaration can say of a duration (a Lua pattern): a typo is
	// refused at the Admin API, not on the route's first request.
	{`{"limits": [{"count": 5, "window": "10x"}]}`, "config.limits[0].window: not a duration (want e.g. 250ms, 10s, 1m30s, 1.5h, 1d, 1mo or 1y)"},
	{`{"limits": [{"count": 5, "window": "1m", "algorithm": "leaky_bucket", "max_delay": "soon"}]}`, "config.limits[0].max_delay: not a duration"},
	{`{"plans": [{"name": "p", "limits": [{"count": 5, "window": "m"}]}], "default_plan": "p"}`, "config.plans[0].limits[0].window: not a duration"},
	// An option the limit's algorithm ignores, refused at the Admin API as
	// Kong 3.9.3's schema code refuses it on the dump (../shared/kong-schema:
	// config.limits.1.burst "value must be 0" and the entry's @entity
	// message). A limit that inherits config.algorithm is checked when the
	// plugin starts it (an entity check sees its own record only).
	{`{"limits": [{"count": 5, "window": "1m", "algorithm": "sliding_log", "burst": 3}]}`, "config.limits[0].burst: burst means nothing to fixed_window, sliding_log, sliding_counter or in_flight"},
	{`{"plans": [{"name": "p", "limits": [{"count": 5, "window": "1m", "algorithm": "fixed_window", "burst": 3}]}], "default_plan": "p"}`, "config.plans[0].limits[0].burst: burst means nothing"},
	{`{"limits": [{"count": 5, "window": "1m", "algorithm": "gcra", "max_delay": "1s"}]}`, "config.limits[0].max_delay: max_delay means nothing to fixed_window, sliding_log, sliding_counter, token_bucket or gcra"},
	// tollgate-response's charge record, as Kong 3.9.3's schema code
	// refuses it on the dump (../shared/kong-schema).
	{`{"minute": 5, "charge": {"status": ["hello"]}}`, "want a status code (401), a class (4xx) or a range (500-599)"}, // Kong: config.charge.status; the plugin names the element
	{`{"minute": 5, "charge": {"header": "a b"}}`, "config.charge.header: bad header name"},
	{`{"minute": 5, "charge": {"cost": -1}}`, "config.charge.cost: value should be between 0 and 999999999999999"},
	// The penalty record, as Kong 3.9.3's schema code refuses it on the dump.
	{`{"minute": 5, "penalty": {"denials": 3, "within": 600}}`, "config.penalty.duration: required field missing"},
	{`{"minute": 5, "penalty": {"denials": 0, "within": 600, "duration": 60}}`, "config.penalty.denials: value must be greater than 0"},
	// The reserve record, likewise.
	{`{"minute": 5, "reserve": {"share": 0.2}}`, "config.reserve.priority_header: required field missing"},
	{`{"minute": 5, "reserve": {"share": 0, "priority_header": "X-Priority"}}`, "config.reserve.share: value must be greater than 0"},
	{`{"minute": 5, "reserve": {"share": 0.2, "priority_header": "a b"}}`, "config.reserve.priority_header: bad header name"},
	{`{"minute": 5, "reserve": {"share": 1, "priority_header": "X-Priority"}}`, "config.reserve.share: value must not be 1"},
}

// kongAccepts are configs Kong's rate-limiting accepts; tollgate's schema
// and plugin accept them too.
var kongAccepts = []string{
	`{"second": 10}`,
	`{"second": 10, "minute": 20, "hour": 30, "day": 40, "month": 50, "year": 60}`,
	`{"second": 10, "limit_by": "header", "header_name": "X-App-Version"}`,
	`{"minute": 2.5, "hour": 2.5}`,
	`{"minute": 5, "limit_by": "path", "path": "/login/v1.2_~%41"}`,
	// Kong's path typedef (kong/db/schema/typedefs.lua, validate_path)
	// allows RFC 3986's sub-delims, ':' and '@'.
	`{"minute": 5, "limit_by": "path", "path": "/v1/users:search"}`,
	`{"minute": 5, "limit_by": "path", "path": "/a;b=c@d!$&'()*+,"}`,
	`{"minute": 5, "policy": "redis", "redis": {"host": "h", "port": 0, "timeout": 0}}`,
	`{"minute": 5, "policy": "redis", "redis": {"host": "h", "password": ""}, "sync_rate": 0.02}`,
	`{"minute": 5, "policy": "redis", "redis_host": "h"}`,
	`{"minute": 5, "policy": "redis", "redis": {"host": "::1"}}`,
	`{"minute": 5, "policy": "redis", "redis": {"host": "10.0.0.7", "server_name": "redis.example.com"}}`,
	`{"minute": 5, "policy": "local", "sync_rate": -1, "fault_tolerant": false, "hide_client_headers": true}`,
	// tollgate-response only (Kong 3.9.3's schema code takes both on the dump).
	`{"minute": 5, "charge": {"status": ["401", "4xx", "500-599"]}}`,
	`{"minute": 5, "charge": {"cost_header": "X-Usage", "cost_entry": "total", "cost": 0}}`,
	`{"minute": 5, "penalty": {"denials": 3, "within": 600, "duration": 3600}}`,
	`{"minute": 5, "reserve": {"share": 0.2, "priority_header": "X-Priority"}}`,
	`{"limits": [{"count": 5, "window": "1m", "algorithm": "gcra", "burst": 3, "max_delay": "0s"}]}`,
	`{"algorithm": "token_bucket", "limits": [{"count": 5, "window": "1m", "burst": 3}]}`,
	// An entry naming an algorithm without a burst or max_delay: Kong's
	// validate_field would refuse a null an `eq` match wants (so the check
	// matches with between [0, 0], which a null passes).
	`{"limits": [{"count": 5, "window": "1m", "algorithm": "fixed_window"}, {"count": 50, "window": "1h", "algorithm": "sliding_log", "burst": 0}]}`,
}

// kongRefusesTollgateTakes are configs Kong's rate-limiting refuses with
// Lua that no dump can carry (schema.lua's validate_periods_order, a
// custom_validator): Kong's Admin API would store them for tollgate. The
// plugin takes them, enforcing each period on its own as it always does,
// and logs that Kong's plugin would refuse the order; refusing them when
// Kong starts the instance would answer 500 to every request of the route.
var kongRefusesTollgateTakes = []string{
	`{"second": 20, "hour": 10}`,
	`{"second": 10, "minute": 20, "hour": 30, "day": 40, "month": 60, "year": 50}`,
	`{"plans": [{"name": "free", "minute": 60, "hour": 10}], "default_plan": "free"}`,
}

// needsResponse says whether a config uses what only tollgate-response
// serves (adaptive, in-flight or charged limits).
func needsResponse(config string) bool {
	return strings.Contains(config, `"adaptive"`) || strings.Contains(config, `"in_flight"`) || strings.Contains(config, `"charge"`)
}

// TestKongSchemaRefusesWhatKongRefuses checks each config as Kong's Admin
// API would (the declaration alone) and as the plugin does when Kong
// starts an instance, for both plugins: tollgate refuses the adaptive
// record and in_flight at the Admin API (they need tollgate-response).
func TestKongSchemaRefusesWhatKongRefuses(t *testing.T) {
	for _, v := range []Variant{AccessOnly, WithResponse} {
		for _, tc := range kongRefuses {
			want := tc.want
			if v == AccessOnly && needsResponse(tc.config) {
				want = "config.adaptive: unknown field"
				if strings.Contains(tc.config, `"charge"`) {
					want = "config.charge: unknown field"
				}
			}
			if err := schemas[v]().Check(object(t, tc.config)); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("variant %d: %s: at the Admin API %v, want %q", v, tc.config, err, want)
			}
			var c Config
			if err := c.decode([]byte(tc.config), v); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("variant %d: %s: the plugin says %v, want %q", v, tc.config, err, want)
			}
		}
		for _, config := range append(kongAccepts, kongRefusesTollgateTakes...) {
			if v == AccessOnly && needsResponse(config) {
				continue // TestKongAccessOnlyRefusesWhatNeedsTheResponse
			}
			if err := schemas[v]().Check(object(t, config)); err != nil {
				t.Errorf("variant %d: %s: refused at the Admin API: %v", v, config, err)
			}
			var c Config
			if err := c.decode([]byte(config), v); err != nil {
				t.Errorf("variant %d: %s: the plugin refuses it: %v", v, config, err)
			}
		}
	}
}

// TestKongAccessOnlyRefusesWhatNeedsTheResponse: tollgate (access phase
// only) refuses at the Admin API what would need Kong's log phase, naming
// the field; tollgate-response takes the same configs.
func TestKongAccessOnlyRefusesWhatNeedsTheResponse(t *testing.T) {
	for config, want := range map[string]string{
		`{"second": 10, "algorithm": "gcra", "adaptive": {"enabled": true}}`:                                                  "config.adaptive: unknown field",
		`{"limits": [{"count": 2, "window": "1m", "algorithm": "in_flight"}]}`:                                                "config.limits[0].algorithm: expected one of: fixed_window, sliding_log, sliding_counter, token_bucket, gcra, leaky_bucket",
		`{"plans": [{"name": "p", "limits": [{"count": 2, "window": "1m", "algorithm": "in_flight"}]}], "default_plan": "p"}`: "config.plans[0].limits[0].algorithm: expected one of",
		`{"minute": 5, "charge": {"status": ["401"]}}`:                                                                        "config.charge: unknown field",
	} {
		var c Config
		if err := c.decode([]byte(config), AccessOnly); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("tollgate: %s: %v, want %q", config, err, want)
		}
		if err := c.decode([]byte(config), WithResponse); err != nil {
			t.Errorf("tollgate-response: %s: %v", config, err)
		}
	}
}

// TestKongSchemaPassesMetaschema checks the real binary's dump against the
// rules of Kong's metaschema (kong/db/schema/metaschema.lua, MetaSubSchema)
// that Kong applies when it loads a plugin's schema: the attributes a field
// may carry and their kinds, the types an attribute is allowed on, the
// attributes a type requires, the entity checkers and their arguments.
func TestKongSchemaPassesMetaschema(t *testing.T) {
	var info struct {
		Plugins []struct{ Schema map[string]any }
	}
	if err := json.Unmarshal(kongproc.Dump(t), &info); err != nil {
		t.Fatal(err)
	}
	s := info.Plugins[0].Schema
	for key := range s {
		if !slices.Contains([]string{"name", "fields", "entity_checks", "shorthand_fields", "transformations"}, key) {
			t.Errorf("schema key %q: not in MetaSubSchema", key)
		}
	}
	if name, _ := s["name"].(string); name != "tollgate" {
		t.Errorf("schema name %q", name)
	}
	var errs []string
	metaFields(s["fields"], "", &errs)
	metaChecks(s["entity_checks"], "", &errs)
	for _, e := range errs {
		t.Error(e)
	}
}

// fieldAttributes are the attributes Kong's metaschema allows on a field,
// with the kind of value each takes.
var fieldAttributes = map[string]string{
	"type": "string", "required": "boolean", "reference": "string", "description": "description", "examples": "array",
	"auto": "boolean", "unique": "boolean", "unique_across_ws": "boolean", "on_delete": "string", "default": "any",
	"abstract": "boolean", "generate_admin_api": "boolean", "immutable": "boolean", "err": "string",
	"encrypted": "boolean", "referenceable": "boolean",
	// validators
	"between": "range", "eq": "any", "ne": "any", "gt": "number", "len_eq": "integer", "len_min": "integer",
	"len_max": "integer", "match": "string", "not_match": "string", "match_all": "patterns", "match_none": "patterns",
	"starts_with": "string", "one_of": "array", "not_one_of": "array", "contains": "any", "is_regex": "boolean",
	"timestamp": "boolean", "uuid": "boolean",
	// nested
	"elements": "field", "keys": "field", "values": "field", "fields": "fields", "entity_checks": "checks",
}

// attributeTypes restricts attributes to field types (metaschema's
// attribute_types); requiredAttributes are what a type must declare.
var (
	attributeTypes = map[string][]string{
		"between": {"integer", "number"}, "len_eq": {"array", "set", "string", "map"}, "match": {"string"},
		"one_of": {"string", "number", "integer"}, "contains": {"array", "set"}, "is_regex": {"string"},
		"timestamp": {"number", "integer"}, "uuid": {"string"}, "unique": {"string", "number", "integer", "foreign"},
		"unique_across_ws": {"string", "number", "integer", "foreign"},
	}
	requiredAttributes = map[string][]string{"array": {"elements"}, "set": {"elements"}, "map": {"keys", "values"}, "record": {"fields"}}
	validTypes         = []string{"array", "set", "string", "number", "boolean", "integer", "foreign", "map", "record", "json"}
)

func metaFields(v any, path string, errs *[]string) {
	list, ok := v.([]any)
	if !ok {
		*errs = append(*errs, path+": fields must be an array")
		return
	}
	for _, entry := range list {
		m, ok := entry.(map[string]any)
		if !ok || len(m) != 1 {
			*errs = append(*errs, path+": each entry in fields must be a table with one key")
			continue
		}
		for name, decl := range m {
			metaField(decl, join(path, name), errs)
		}
	}
}

func metaField(v any, path string, errs *[]string) {
	f, ok := v.(map[string]any)
	if !ok {
		*errs = append(*errs, path+": a field must be a table")
		return
	}
	typ, _ := f["type"].(string)
	if !slices.Contains(validTypes, typ) {
		*errs = append(*errs, fmt.Sprintf("%s: type %q", path, f["type"]))
	}
	for _, req := range requiredAttributes[typ] {
		if f[req] == nil {
			*errs = append(*errs, fmt.Sprintf("%s: field of type '%s' must declare '%s'", path, typ, req))
		}
	}
	for attr, val := range f {
		kind, known := fieldAttributes[attr]
		if !known {
			*errs = append(*errs, fmt.Sprintf("%s: attribute %q is not in the metaschema", path, attr))
			continue
		}
		if allowed, restricted := attributeTypes[attr]; restricted && !slices.Contains(allowed, typ) {
			*errs = append(*errs, fmt.Sprintf("%s: field of type '%s' cannot have attribute '%s'", path, typ, attr))
		}
		sub := path + "." + attr
		if attr == "fields" || attr == "entity_checks" {
			sub = path // its members name themselves
		}
		if !metaKind(kind, val, sub, errs) {
			*errs = append(*errs, fmt.Sprintf("%s.%s: %v is not a %s", path, attr, val, kind))
		}
	}
	if f["unique_across_ws"] == true && f["unique"] != true {
		*errs = append(*errs, path+": unique_across_ws needs unique")
	}
}

// metaKind checks a value's kind; nested kinds report their own errors.
func metaKind(kind string, v any, path string, errs *[]string) bool {
	n, isNumber := v.(float64)
	switch kind {
	case "string":
		_, ok := v.(string)
		return ok
	case "description":
		s, ok := v.(string)
		return ok && len(s) >= 10 && len(s) <= 500
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "number":
		return isNumber
	case "integer":
		return isNumber && n == float64(int64(n))
	case "array":
		_, ok := v.([]any)
		return ok
	case "any":
		return v != nil // cjson would make a JSON null a userdata Kong cannot compare
	case "range":
		// Integers: older Kong 3.x metaschemas declare between's elements so.
		r, ok := v.([]any)
		return ok && len(r) == 2 && metaKind("integer", r[0], path, errs) && metaKind("integer", r[1], path, errs)
	case "patterns":
		list, ok := v.([]any)
		for _, p := range list {
			m, isMap := p.(map[string]any)
			pattern, _ := m["pattern"].(string)
			_, errIsString := m["err"].(string)
			ok = ok && isMap && pattern != "" && (m["err"] == nil || errIsString) && len(m) <= 2
		}
		return ok
	case "field":
		metaField(v, path, errs)
		return true
	case "fields":
		metaFields(v, path, errs)
		return true
	case "checks":
		metaChecks(v, path, errs)
		return true
	}
	return false
}

// checkArguments are Kong's entity checkers and their argument fields
// (custom_entity_check needs a Lua function: no dump can carry one).
var checkArguments = map[string][]string{
	"at_least_one_of": nil, "only_one_of": nil, "distinct": nil, "mutually_required": nil, "mutually_exclusive": nil,
	"conditional":                 {"if_field", "if_match", "then_field", "then_match", "then_err"},
	"conditional_at_least_one_of": {"if_field", "if_match", "then_at_least_one_of", "then_err", "else_match", "else_then_at_least_one_of", "else_then_err"},
	"mutually_exclusive_sets":     {"set1", "set2"},
}

func metaChecks(v any, path string, errs *[]string) {
	if v == nil {
		return
	}
	list, ok := v.([]any)
	if !ok {
		*errs = append(*errs, path+": entity_checks must be an array")
		return
	}
	for i, c := range list {
		m, _ := c.(map[string]any)
		if len(m) != 1 {
			*errs = append(*errs, fmt.Sprintf("%s entity_checks[%d]: only one checker per entry", path, i))
			continue
		}
		for name, arg := range m {
			fields, known := checkArguments[name]
			switch rec, isRecord := arg.(map[string]any); {
			case !known:
				*errs = append(*errs, fmt.Sprintf("%s entity_checks[%d]: %q is not an entity checker", path, i, name))
			case fields == nil:
				if !metaKind("array", arg, path, errs) {
					*errs = append(*errs, fmt.Sprintf("%s entity_checks[%d].%s: want an array of field names", path, i, name))
				}
			case !isRecord:
				*errs = append(*errs, fmt.Sprintf("%s entity_checks[%d].%s: want a record", path, i, name))
			default:
				for key, val := range rec {
					if !slices.Contains(fields, key) {
						*errs = append(*errs, fmt.Sprintf("%s entity_checks[%d].%s: %q is not an argument", path, i, name, key))
					}
					if strings.HasSuffix(key, "_match") {
						metaConditionalMatch(val, fmt.Sprintf("%s entity_checks[%d].%s.%s", path, i, name, key), errs)
					}
				}
			}
		}
	}
}

// metaConditionalMatch: a match table takes required, the validators and
// the nested attributes (metaschema's conditional_validators), no type.
func metaConditionalMatch(v any, path string, errs *[]string) {
	m, _ := v.(map[string]any)
	for attr, val := range m {
		kind, known := fieldAttributes[attr]
		if !known || slices.Contains([]string{"type", "default", "description", "referenceable", "encrypted"}, attr) {
			*errs = append(*errs, fmt.Sprintf("%s: %q is not a conditional validator", path, attr))
		} else if !metaKind(kind, val, path, errs) {
			*errs = append(*errs, fmt.Sprintf("%s.%s: %v is not a %s", path, attr, val, kind))
		}
	}
}

// dumpedConfig is the config record of the real binary's dump, as a map.
func dumpedConfig(t *testing.T) map[string]any {
	var info struct {
		Plugins []struct {
			Schema struct{ Fields []map[string]map[string]any }
		}
	}
	if err := json.Unmarshal(kongproc.Dump(t), &info); err != nil {
		t.Fatal(err)
	}
	return info.Plugins[0].Schema.Fields[0]["config"]
}

// fieldAt finds a dotted path's declaration in a record declaration.
func fieldAt(record map[string]any, path string) map[string]any {
	head, rest, nested := strings.Cut(path, ".")
	list, _ := record["fields"].([]any)
	for _, entry := range list {
		if f, ok := entry.(map[string]any)[head].(map[string]any); ok {
			if nested {
				return fieldAt(f, rest)
			}
			return f
		}
	}
	return nil
}

// normalize makes Go literals compare with decoded JSON.
func normalize(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

func object(t *testing.T, s string) map[string]any {
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// TestKongYmlExampleValidates: every tollgate config in kong.yml.example
// passes the schema, as Kong would check it when it loads the file, and
// starts in the plugin.
func TestKongYmlExampleValidates(t *testing.T) {
	b, err := os.ReadFile("../kong.yml.example")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Services []struct {
			Plugins []struct {
				Name   string
				Config map[string]any
			}
		}
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range file.Services {
		for _, p := range s.Plugins {
			if p.Name != "tollgate" {
				continue
			}
			n++
			config := normalize(p.Config).(map[string]any) // YAML ints as JSON numbers
			raw, _ := json.Marshal(config)
			if err := schemas[AccessOnly]().Check(config); err != nil {
				t.Errorf("%s: %v", raw, err)
			}
			var c Config
			if err := json.Unmarshal(raw, &c); err != nil {
				t.Errorf("%s: %v", raw, err)
			}
		}
	}
	if n == 0 {
		t.Fatal("no tollgate plugin in kong.yml.example")
	}
}

// kongStoresForMinute5 is what Kong 3.9.3 stores for the config
// {"minute": 5} of each plugin: its plugins entity's
// process_auto_fields("insert") then validate_insert, with the schema read
// from -dump and built by Entity.new_subschema (kong/db/schema/entity.lua,
// make_records_required), as ../shared/kong-schema printed it for this
// tree (TOLLGATE_CMD and TOLLGATE_NAME tollgate-response for the second).
// A record that does not say "required": false is filled from its
// defaults there, so tollgate-response's "adaptive" must say it, or Kong
// stores it switched on; tollgate has no adaptive record.
var kongStoresForMinute5 = [...]string{
	AccessOnly:   `{"algorithm":"fixed_window","clear_keys":false,"cost":1,"day":null,"default_plan":null,"error_code":429,"error_message":"API rate limit exceeded","fault_tolerant":true,"header_name":null,"headers":"kong","hide_client_headers":false,"hour":null,"limit_by":"consumer","limits":null,"log_denials":0,"minute":5,"month":null,"namespace":null,"on_error":null,"path":null,"penalty":null,"plan_by":"consumer_tag","plan_header":null,"plans":null,"policy":"local","redis":{"cluster_addresses":null,"database":0,"host":null,"password":null,"port":6379,"sentinel_addresses":null,"sentinel_master":null,"sentinel_password":null,"sentinel_role":null,"sentinel_username":null,"server_name":null,"ssl":false,"ssl_verify":false,"timeout":2000,"username":null},"redis_database":null,"redis_host":null,"redis_password":null,"redis_port":null,"redis_server_name":null,"redis_ssl":null,"redis_ssl_verify":null,"redis_timeout":null,"redis_username":null,"reserve":null,"second":null,"shadow":false,"sync_rate":-1,"year":null}`,
	WithResponse: `{"adaptive":null,"algorithm":"fixed_window","charge":null,"clear_keys":false,"cost":1,"day":null,"default_plan":null,"error_code":429,"error_message":"API rate limit exceeded","fault_tolerant":true,"header_name":null,"headers":"kong","hide_client_headers":false,"hour":null,"limit_by":"consumer","limits":null,"log_denials":0,"minute":5,"month":null,"namespace":null,"on_error":null,"path":null,"penalty":null,"plan_by":"consumer_tag","plan_header":null,"plans":null,"policy":"local","redis":{"cluster_addresses":null,"database":0,"host":null,"password":null,"port":6379,"sentinel_addresses":null,"sentinel_master":null,"sentinel_password":null,"sentinel_role":null,"sentinel_username":null,"server_name":null,"ssl":false,"ssl_verify":false,"timeout":2000,"username":null},"redis_database":null,"redis_host":null,"redis_password":null,"redis_port":null,"redis_server_name":null,"redis_ssl":null,"redis_ssl_verify":null,"redis_timeout":null,"redis_username":null,"reserve":null,"second":null,"shadow":false,"sync_rate":-1,"year":null}`,
}

// TestKongStoresAsKong: the plugin's own schema processing stores what
// Kong stores, and a config that never names adaptive limiting starts an
// instance that does not adapt.
func TestKongStoresAsKong(t *testing.T) {
	for v, stored := range kongStoresForMinute5 {
		config := object(t, `{"minute": 5}`)
		if err := schemas[v]().Check(config); err != nil {
			t.Fatal(err)
		}
		// Kong writes null for every field it leaves unset; the plugin leaves
		// them out, which it reads the same.
		if want := withoutNulls(object(t, stored)); !reflect.DeepEqual(config, want) {
			got, _ := json.Marshal(config)
			t.Errorf("variant %d: stored config differs from Kong's:\n got %s\nwant %s", v, got, stored)
		}
		var c Config
		if err := c.decode([]byte(stored), Variant(v)); err != nil {
			t.Fatal(err)
		}
		if c.compiled.policy.Adaptive() != nil {
			t.Errorf("variant %d: the config Kong stores for {\"minute\": 5} adapts its limits", v)
		}
	}
}

// withoutNulls drops the null members of m, at every depth of records.
func withoutNulls(m map[string]any) map[string]any {
	for k, v := range m {
		switch v := v.(type) {
		case nil:
			delete(m, k)
		case map[string]any:
			withoutNulls(v)
		}
	}
	return m
}

// TestKongSchemaProtocols: the dump declares protocols as Kong's
// rate-limiting does (typedefs.protocols_http, kong/db/schema/typedefs.lua):
// a set of grpc, grpcs, http and https, all by default, so Kong's Admin
// API refuses the plugin on a tcp, tls or udp route, as it refuses its own.
func TestKongSchemaProtocols(t *testing.T) {
	var info struct {
		Plugins []struct {
			Schema struct{ Fields []map[string]map[string]any }
		}
	}
	if err := json.Unmarshal(kongproc.Dump(t), &info); err != nil {
		t.Fatal(err)
	}
	var protocols map[string]any
	for _, f := range info.Plugins[0].Schema.Fields {
		if p, ok := f["protocols"]; ok {
			protocols = p
		}
	}
	http := []any{"grpc", "grpcs", "http", "https"}
	want := map[string]any{"type": "set", "required": true, "default": http, "elements": map[string]any{"type": "string", "one_of": http}}
	if !reflect.DeepEqual(protocols, want) {
		t.Fatalf("protocols: %v, want %v", protocols, want)
	}
}

// TestKongAtLeastOneLimitInKongsWords: a config with no limit is refused
// with exactly Kong's message under @entity (01-schema_spec.lua "invalid
// limit" compares it whole), though limits and plans satisfy it too; an
// entry of limits or plans alone is a limit.
func TestKongAtLeastOneLimitInKongsWords(t *testing.T) {
	const kongs = "at least one of these fields must be non-empty: 'config.second', 'config.minute', 'config.hour', 'config.day', 'config.month', 'config.year'"
	for _, v := range []Variant{AccessOnly, WithResponse} {
		for _, config := range []string{`{}`, `{"limits": []}`, `{"policy": "local"}`} {
			if err := schemas[v]().Check(object(t, config)); err == nil || !strings.HasSuffix(err.Error(), kongs) {
				t.Errorf("variant %d: %s: %v, want exactly %q", v, config, err, kongs)
			}
		}
		for _, config := range []string{`{"limits": [{"count": 1, "window": "1m"}]}`, `{"plans": [{"name": "p", "minute": 1}], "default_plan": "p"}`} {
			if err := schemas[v]().Check(object(t, config)); err != nil {
				t.Errorf("variant %d: %s: %v", v, config, err)
			}
		}
	}
}
