package kongplugin

import (
	"context"
	_ "embed" // response_ratelimiting.json
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Kong/go-pdk"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/kongplugin/internal/command"
	"github.com/tollgate/tollgate/kongplugin/internal/keys"
	"github.com/tollgate/tollgate/kongplugin/internal/kongdb"
	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
	"github.com/tollgate/tollgate/kongplugin/internal/pluginserver"
)

// ResponseLimitsPriority runs tollgate-response-ratelimiting where Kong runs
// response-ratelimiting (kong/plugins/response-ratelimiting/handler.lua:
// 900).
const ResponseLimitsPriority = 900

// responseLimitsJSON declares ResponseLimitsConfig in Kong's schema
// language: Kong 3.9.3's kong/plugins/response-ratelimiting/schema.lua,
// field for field, with tollgate's redis record (Cluster and Sentinel
// beside Kong's fields).
//
//go:embed response_ratelimiting.json
var responseLimitsJSON []byte

// responseLimitsSchema and responseLimitsDBless are parsed at first
// use, as schemas are.
var (
	responseLimitsSchema = sync.OnceValue(func() *kongschema.Schema { return kongschema.MustParse(responseLimitsJSON) })
	responseLimitsDBless = sync.OnceValue(func() *kongschema.Schema { return kongschema.MustParse(withoutCluster(responseLimitsJSON)) })
)

// MainResponseLimits runs the plugin server of
// tollgate-response-ratelimiting, the drop-in for Kong's bundled
// response-ratelimiting, on the command line args, as Main does
// tollgate's: its access phase reads each resource's usage (and refuses
// with block_on_first_violation), its response phase reads the
// upstream's usage header, refuses a response that takes from a spent
// resource, and charges the rest.
func MainResponseLimits(args []string, adminSocket string) int {
	return command.Main(args, command.Program{
		Schema: responseLimitsSchema,
		Info: kongschema.Info{Version: Version, Priority: ResponseLimitsPriority, Phases: []string{"access", "response"},
			ForKong: forKong(responseLimitsSchema, responseLimitsDBless)},
		Serve: serveWith(startResponseLimits), Keys: ResponseLimitsKeysTarget, AdminSocket: adminSocket, Check: checker(ResponseLimitsKeysTarget),
	}, os.Stdout, os.Stderr)
}

// startResponseLimits starts an instance from the config Kong sends, as
// Variant.start does tollgate's.
func startResponseLimits(raw []byte) (any, error) {
	return startOrRefuse("tollgate-response-ratelimiting", func() (any, string, error) {
		var c ResponseLimitsConfig
		if err := c.decode(raw); err != nil {
			return nil, scopeOf(raw), err
		}
		rl := c.compiled
		var err error
		rl.opened, err = openGate(rl.scope, rl.built)
		if err != nil {
			rl.built.Release()
			return nil, rl.scope.Name, err
		}
		return &c, "", nil
	})
}

// Close gives back what the instance holds (see Config.Close).
func (c *ResponseLimitsConfig) Close() {
	c.compiled.opened.close()
	c.compiled.built.Release()
}

// ResponseLimitsConfig is tollgate-response-ratelimiting's config as Kong
// sends it: Kong's response-ratelimiting's, so renaming the plugin keeps
// a config's meaning. Each resource of Limits is limited per period by
// what the upstream reports it cost, in the HeaderName response header
// ("video=2, image=4").
type ResponseLimitsConfig struct {
	HeaderName string `json:"header_name"`
	// LimitBy picks the identifier: consumer, credential or ip.
	LimitBy string `json:"limit_by"`
	// Policy is local (this node's memory), cluster (Kong's database) or
	// redis.
	Policy string `json:"policy"`
	// FaultTolerant proxies while Redis fails, unlimited and without
	// headers; false answers 500.
	FaultTolerant bool `json:"fault_tolerant"`
	// BlockOnFirstViolation refuses a request, in the access phase, once
	// any period of any resource is spent.
	BlockOnFirstViolation bool `json:"block_on_first_violation"`
	HideClientHeaders     bool `json:"hide_client_headers"`
	// Limits are the periods of each resource, by its name in HeaderName.
	Limits map[string]Periods `json:"limits"`
	RedisSettings

	attached struct {
		RouteID   string `json:"route_id"`
		ServiceID string `json:"service_id"`
	}
	compiled *responseLimits
}

// responseLimits is a validated ResponseLimitsConfig, ready for requests.
type responseLimits struct {
	*ResponseLimitsConfig
	// resources are the names of Limits in order; built.Policies[i]
	// counts resources[i] (fixed windows, charged after the response what
	// its entry of the usage header says).
	resources []string
	built     *config.Compiled // a policy per resource, charged by the usage header
	policies  []*core.Policy   // built's
	scope     gate.Scope
	warnings  warnings // told Kong's log at the first request

	opened // the gate over the store, from start to Close
}

// decode checks a config against the schema as Kong's Admin API does and
// fills Kong's defaults, then compiles it (c.compiled); errors name the
// field and value.
func (c *ResponseLimitsConfig) decode(b []byte) error {
	*c = ResponseLimitsConfig{}
	err := responseLimitsSchema().Decode(b, c, &c.attached)
	if err == nil {
		c.compiled, err = c.compile()
	}
	if err != nil {
		return fmt.Errorf("tollgate-response-ratelimiting config: %w", err)
	}
	return nil
}

// compile builds one policy per resource: its periods as fixed windows
// (Kong's counters: second to day aligned to the epoch, month and year
// calendar periods in UTC), all charged after the response what the
// usage header's entry of the resource says, 0 when it says nothing.
func (c *ResponseLimitsConfig) compile() (*responseLimits, error) {
	rl := &responseLimits{ResponseLimitsConfig: c}
	for name := range c.Limits {
		rl.resources = append(rl.resources, name)
	}
	slices.Sort(rl.resources)
	// Counters are per route and service, as Kong's (policies/init.lua,
	// get_local_key): a plugin on a service shares them across its routes.
	rl.scope = instanceScope(c.attached.RouteID, c.attached.ServiceID, "")
	zero := int64(0)
	specs := make([]*config.Policy, len(rl.resources))
	fields := make([][]string, len(rl.resources))
	for i, name := range rl.resources {
		periods := c.Limits[name]
		field := "limits." + name + "."
		warnPeriodOrder(&periods, "limits."+name+": ", &rl.warnings)
		limits, names, err := periods.limits(nil, algo.FixedWindow.String(), field)
		if err != nil {
			return nil, err
		}
		fields[i] = names
		specs[i] = &config.Policy{Name: name, Limits: limits, Shadow: !c.BlockOnFirstViolation,
			Charge: &config.Charge{CostHeader: c.HeaderName, CostEntry: name, Cost: &zero}}
	}
	var err error
	cs := clusterScope{table: kongdb.ResponseRateLimiting, prefix: rl.scope.Prefix, serviceID: c.attached.ServiceID, routeID: c.attached.RouteID}
	sc, err := storeOf(c.Policy, c.FaultTolerant, "", -1, &c.RedisSettings, cs)
	if err != nil {
		return nil, err
	}
	rl.warnings.lines = append(rl.warnings.lines, c.RedisSettings.notes...)
	// Fixed windows only, which every store decides.
	// The headers are the plugin's own (see setUsage): none from the gate.
	if rl.built, err = config.Compile(config.Setup{Owner: "kong-response|" + rl.scope.Prefix, Policies: specs,
		StoreConfig: sc, DefaultStyle: headers.None}); err != nil {
		var ce *config.Error
		if errors.As(err, &ce) && ce.Policy >= 0 {
			if named := limitField(err, fields[ce.Policy], nil); named != err {
				return nil, named
			}
			return nil, fmt.Errorf("limits.%s: %w", rl.resources[ce.Policy], ce.Err)
		}
		return nil, err
	}
	for _, cp := range rl.built.Policies {
		rl.policies = append(rl.policies, cp.Policy)
	}
	return rl, nil
}

// usageSeen hears each resource's decision of a request: seen[i] is
// what the access phase saw of resources[i], kept for the response phase.
type usageSeen struct {
	in   gate.Input
	seen []core.Decision
}

func (u *usageSeen) Input(int) (gate.Input, error) { return u.in, nil }

func (u *usageSeen) Decided(rule int, d *core.Decision, err error, _ time.Duration) {
	if err == nil {
		u.seen[rule] = *d
	}
}

// spent reports whether the resource of decision d had no unit left in
// some period when the request arrived (Kong: a remaining of 0 or less).
func spent(d *core.Decision) bool { return d.Policy != nil && (!d.Allowed || d.Shadowed) }

// Access is AccessEvent for a caller that knows no event end (go-pdk's
// test environment, which the unit tests drive): a denial's call is made
// as any other.
func (c *ResponseLimitsConfig) Access(kong *pdk.PDK) {
	var ev pluginserver.Event
	c.AccessEvent(kong, &ev)
	_ = ev.Flush(kong)
}

// AccessEvent reads each resource's usage as Kong's response-ratelimiting's
// access.lua does: X-RateLimit-Remaining-<resource> (the least any
// period has left) on the response, and with block_on_first_violation a
// 429 in Kong's words ("API rate limit exceeded for '<resource>'") once a
// resource is spent. Nothing is charged here.
func (c *ResponseLimitsConfig) AccessEvent(kong *pdk.PDK, ev *pluginserver.Event) {
	rl := c.compiled
	rl.warnings.tell(kong, "tollgate-response-ratelimiting ("+rl.scope.Name+"): ")
	rl.news.tell(kong, "tollgate-response-ratelimiting ("+rl.scope.Name+"): ")
	seen := make([]core.Decision, len(rl.resources))
	var outcome gate.Outcome
	id, _ := identifier(kong, rl.LimitBy, "", "")
	req := &usageSeen{in: gate.Input{Covered: true, Key: rl.scope.Key(id), Cost: 1}, seen: seen} // passes while a unit is left
	if err := rl.gate.Decide(context.Background(), req, &outcome); err != nil {
		fail(ev) // the store failed with fault_tolerant false
		return
	}
	if !outcome.Passes() {
		deny(ev, 429, "API rate limit exceeded for '"+outcome.Decision.Policy.Name()+"'", nil)
		return
	}
	grpc := isGRPC(kong)
	if !rl.HideClientHeaders {
		h := map[string][]string{}
		for i, name := range rl.resources {
			if d := &seen[i]; d.Policy != nil && !d.Fallback {
				h["X-RateLimit-Remaining-"+name] = []string{strconv.FormatInt(max(0, d.Remaining), 10)}
				if grpc {
					rl.setUsage(h, name, d) // what Kong's header_filter shows for a response that reports no usage
				}
			}
		}
		if len(h) > 0 {
			_ = kong.Response.SetHeaders(h)
		}
	}
	if grpc {
		// Kong proxies a request through its buffered path (Kong.response,
		// kong/init.lua) when a plugin on it has a response handler
		// (kong/runloop/plugins_iterator.lua), and that path cannot carry
		// gRPC: every gRPC request would get a 500. Turned off, the
		// response event does not run for this request, so its response is
		// not charged (a Go plugin sees no gRPC response before the log
		// phase: see docs/kong.md).
		_ = ev.SetCtxAtEnd("buffered_proxying", false)
		return
	}
	if id := parkCharges(&outcome, seen); id != "" {
		_ = kong.Ctx.SetShared(chargeKey, id) // the response phase charges
	}
}

// Response does what Kong's response-ratelimiting's header_filter.lua
// and log.lua do once the upstream has answered (Kong's response phase,
// which buffers the response): it reads the usage header's entries
// ("video=2, image=1", over every line of the header) and removes the
// header; a response that takes from a resource spent when the request
// arrived is replaced by a bodiless 429 and charged nothing; any other is
// charged its entries, and X-RateLimit-Limit-<resource>-<period> and
// X-RateLimit-Remaining-<resource>-<period> show each period as the
// charge left it.
func (c *ResponseLimitsConfig) Response(kong *pdk.PDK) {
	rl := c.compiled
	id, err := kong.Ctx.GetSharedString(chargeKey)
	if err != nil || id == "" {
		return // the access phase read no usage (its store failed, fault tolerant)
	}
	parked := takeParkedCharges(id)
	if parked == nil {
		return
	}
	// This request's own copy, parked by its access phase: the charges
	// overwrite the resources they charge, for the headers.
	shown, _ := parked.seen.([]core.Decision)
	if len(shown) != len(rl.resources) {
		return
	}
	// Kong sets the upstream's headers on the response before its
	// response phase runs plugins (kong/init.lua, Kong.response), so
	// kong.response.get_headers has every line of them; the
	// kong.service.response table there answers lookups but iterates
	// empty (kong/pdk/service/response.lua, attach_buffered_headers_mt).
	all, _ := kong.Response.GetHeaders(-1)
	values := headerValues(all, rl.HeaderName)
	header := func(string) string { return values }
	_ = kong.Response.ClearHeader(rl.HeaderName)

	stop := false
	for i := range rl.resources {
		if cost, _ := rl.built.Policies[i].Charge.Cost(0, header); cost > 0 && spent(&shown[i]) {
			stop = true
		}
	}
	if !stop {
		_ = parked.outcome.ChargeEach(context.Background(), 0, header, func(p *core.Policy, d *core.Decision) {
			if i := slices.Index(rl.policies, p); i >= 0 {
				shown[i] = *d
			}
		}) // a store that fails is logged when it starts failing
	}
	h := map[string][]string{}
	if !rl.HideClientHeaders {
		for i, name := range rl.resources {
			rl.setUsage(h, name, &shown[i])
		}
	}
	if stop {
		kong.Response.Exit(429, nil, h) // Kong: kong.response.exit(429), no body
		return
	}
	if len(h) > 0 {
		_ = kong.Response.SetHeaders(h)
	}
}

// setUsage sets resource's X-RateLimit-Limit-<resource>-<period> and
// X-RateLimit-Remaining-<resource>-<period> from d's limits.
func (rl *responseLimits) setUsage(h map[string][]string, resource string, d *core.Decision) {
	if d.Policy == nil || d.Fallback {
		return
	}
	limits := d.Policy.Limits()
	for i := 0; i < d.N; i++ {
		suffix := "-" + resource + "-" + limits[i].Name
		h["X-RateLimit-Limit"+suffix] = []string{strconv.FormatInt(d.Results[i].Quota, 10)}
		h["X-RateLimit-Remaining"+suffix] = []string{strconv.FormatInt(max(0, d.Results[i].Remaining), 10)}
	}
}

// headerValues joins every value of the header name (any case) with
// commas: the lines of a repeated header read as one field.
func headerValues(all map[string][]string, name string) string {
	var out []string
	for k, v := range all {
		if strings.EqualFold(k, name) {
			out = append(out, v...)
		}
	}
	return gate.JoinFieldLines(out)
}

// ResponseLimitsKeysTarget compiles a tollgate-response-ratelimiting
// config as Kong sends it for the keys command: one policy per resource,
// which --policy picks by the resource's name; prefix as for
// Variant.KeysTarget.
func ResponseLimitsKeysTarget(prefix string, b []byte) (keys.Target, error) {
	if prefix != "" {
		kongPrefix.Store(&prefix)
	}
	var c ResponseLimitsConfig
	if err := c.decode(b); err != nil {
		return keys.Target{}, err
	}
	rl := c.compiled
	return keys.Target{Scope: rl.scope, Policies: rl.policies, Store: rl.built.Store}, nil
}

// isGRPC reports whether the request is gRPC: its Content-Type starts
// with application/grpc, the test kong.response.exit makes
// (kong/pdk/response.lua).
func isGRPC(kong *pdk.PDK) bool {
	ct, _ := kong.Request.GetHeader("Content-Type")
	return strings.HasPrefix(strings.ToLower(ct), "application/grpc")
}
