// Package kongplugin is tollgate as a Kong Go plugin (run by Kong as a
// plugin server, github.com/Kong/go-pdk). Its config is a superset of Kong's
// bundled rate-limiting plugin; it turns a Kong request into a core decision
// and the decision into Kong's headers or kong.response.exit.
package kongplugin

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/Kong/go-pdk"
	"github.com/Kong/go-pdk/entities"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/admin"
	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/openstore"
	"github.com/tollgate/tollgate/kongplugin/internal/command"
	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
	"github.com/tollgate/tollgate/kongplugin/internal/pluginserver"
)

// Version is the plugin's version, reported to Kong: tollgate's release.
const Version = core.Version

// Priority runs the plugin where Kong runs rate-limiting (910): after
// authentication, so the consumer is known.
const Priority = 910

// Main runs the plugin server of variant v on the command line args
// (os.Args) and returns its exit status (command.Main): as Kong starts
// it, it serves v's instances; with -dump it prints the plugin's info,
// v's phases and v's full schema for Kong's query command; with `keys` it
// is the operators' command. adminSocket is the path of the operators'
// API's Unix socket ("": none).
func Main(args []string, v Variant, adminSocket string) int {
	return command.Main(args, command.Program{
		Schema: schemas[v],
		Info:   kongschema.Info{Version: Version, Priority: Priority, Phases: v.phases(), ForKong: forKong(schemas[v], dblessSchemas[v])},
		Serve:  serveWith(v.start), Keys: v.KeysTarget, AdminSocket: adminSocket, Check: checker(v.KeysTarget),
	}, os.Stdout, os.Stderr)
}

// start starts an instance from the config Kong sends: checked against
// v's schema, compiled, and its store opened (or joined) and registered
// with the operators' API, all once, here. A config it refuses starts as
// a refused instance, which tells Kong's log why at its first request
// (see refusal).
func (v Variant) start(raw []byte) (any, error) {
	return startOrRefuse(v.name(), func() (any, string, error) {
		var c Config
		if err := c.decode(raw, v); err != nil {
			return nil, scopeOf(raw), err
		}
		if err := c.compiled.open(); err != nil {
			c.compiled.built.Release() // the adaptive controller compile took
			return nil, c.compiled.scope.Name, err
		}
		return &c, "", nil
	})
}

// instance is a validated config, ready for requests once open.
type instance struct {
	*Config                   // as checked, with Kong's defaults filled
	built    *config.Compiled // its one policy, released at Close
	policy   *core.Policy     // built's
	scope    gate.Scope       // ns=<namespace> or route=<id>,service=<id> (instanceScope)
	who      string           // "tollgate (<scope>): ", what its lines to Kong's log start with
	sampler  *gate.DenialSampler
	warnings warnings // told Kong's log at the first request
	// unreported tells Kong's log when an answer charged by its tokens
	// reported none.
	unreported unreportedUsage

	opened // the gate over the store, from open to Close
}

// logf logs a line of the instance's, naming it as the keys command and
// the operators' API do (scope="route=<id>,service=<id>" or "ns=<name>").
func (inst *instance) logf(format string, args ...any) {
	log.Printf(format+" scope=%q", append(args, inst.scope.Name)...)
}

// open opens (or joins) the instance's store and builds its gate.
func (inst *instance) open() error {
	var err error
	inst.opened, err = openGate(inst.scope, inst.built)
	return err
}

// Close gives back what the instance holds, when Kong closes it (a new
// config replaced it): its store handle (the store lives on while another
// instance holds it, so a new config of the same store keeps every
// counter; the last one closes it, and eventual mode's syncing with it),
// its operators' API entry and its adaptive controller. Requests it
// admitted give their in-flight slots back and are charged in their log
// phase as before: Kong runs it with the instance of the request's
// config, and parked leases end by id, whichever instance asks.
func (c *Config) Close() {
	c.compiled.opened.close()
	c.compiled.built.Release()
}

// opened is what an open instance holds: its gate, and the handles it
// gives back at close.
type opened struct {
	gate       *gate.Gate
	store      *openstore.Handle
	unregister func()
	news       *storeNews // the store's failures and returns, for Kong's log
}

// close gives back the store handle and the operators' API entry.
func (o *opened) close() {
	if o.store == nil {
		return
	}
	o.unregister()
	o.news.stop()
	_ = o.store.Release()
	o.store = nil
}

// openGate opens (or joins) the store built runs on and makes its gate,
// one rule per policy of built, and registers it with the operators' API
// as scope.Name.
func openGate(scope gate.Scope, built *config.Compiled) (opened, error) {
	o, err := built.Open(scope.Prefix)
	if err != nil {
		return opened{}, err
	}
	g, h := o.Gate, o.Store
	h.LogStateChanges(log.Printf) // the plugin server's output, which Kong logs at info
	news := &storeNews{onError: built.Store.OnError}
	news.stop = h.OnStateChange(news.heard)
	return opened{gate: g, store: h, unregister: admin.RegisterRule(scope, g, h), news: news}, nil
}

// storeNews carries a shared store's failures and returns to Kong's log,
// where its default level shows them: the store hears them in the
// background, and the instance's next request tells the latest, once,
// through kong.log (the plugin server's own output reaches Kong's log at
// info only).
type storeNews struct {
	onError core.OnError
	pending atomic.Pointer[string] // the line to tell at [error], or [notice] when it starts with "+"
	stop    func()                 // unregisters heard
}

func (n *storeNews) heard(failing bool, err error) {
	line := "+rate-limit store answering again"
	if failing {
		line = fmt.Sprintf("rate-limit store failing (%v); its failure policy (on_error %s) decides until it answers again", err, n.onError)
	}
	n.pending.Store(&line)
}

// tell logs what the store went through since the last request, if
// anything: one atomic load otherwise.
func (n *storeNews) tell(kong *pdk.PDK, who string) {
	if n.pending.Load() == nil {
		return
	}
	if line := n.pending.Swap(nil); line != nil {
		if back, ok := strings.CutPrefix(*line, "+"); ok {
			_ = kong.Log.Notice(who + back)
		} else {
			_ = kong.Log.Err(who + *line)
		}
	}
}

// Access is AccessEvent for a caller that knows no event end (go-pdk's
// test environment, which the unit tests drive): a denial's call is made
// as any other.
func (c *Config) Access(kong *pdk.PDK) {
	var ev pluginserver.Event
	c.AccessEvent(kong, &ev)
	_ = ev.Flush(kong)
}

// AccessEvent decides the request in Kong's access phase: headers on the
// way through, or Kong's denial with error_code and error_message (deny).
func (c *Config) AccessEvent(kong *pdk.PDK, ev *pluginserver.Event) {
	inst := c.compiled
	plantedPanic(inst)
	inst.warnings.tell(kong, inst.who)
	inst.news.tell(kong, inst.who)
	g := inst.gate
	// One rule, keyed as Kong's rate-limiting keys, in the instance's scope.
	id, consumer := identifier(kong, inst.LimitBy, inst.HeaderName, inst.Path)
	req := gate.SameInput{Covered: true, Key: inst.scope.Key(id), Cost: inst.Cost, Plan: planOf(kong, inst, consumer)}
	if inst.Reserve != nil { // no PDK call without a reserve
		v, _ := kong.Request.GetHeader(inst.Reserve.PriorityHeader)
		req.Priority = config.ParsePriority(v)
	}
	var outcome gate.Outcome
	if err := g.Decide(context.Background(), &req, &outcome); err != nil {
		// The store failed with fault_tolerant false (logged once when it
		// started failing): Kong's rate-limiting then raises a Lua error,
		// which Kong's error handler answers.
		fail(ev)
		return
	}
	headers := make(pluginserver.Headers, 8)
	g.Headers(&outcome, headers.Set)
	if !outcome.Passes() {
		inst.sampler.Log(&outcome, inst.scope, inst.logf) // log_denials lines a second at most
		deny(ev, g.Status(), inst.denialMessage(&outcome.Decision), headers)
		return
	}
	if len(headers) > 0 {
		_ = pluginserver.SetHeaders(kong, headers)
	}
	if id := parkLeases(&outcome, maxHold); id != "" {
		_ = kong.Ctx.SetShared(leaseKey, id) // the log phase ends them
	}
	if id := parkCharges(&outcome, nil); id != "" {
		_ = kong.Ctx.SetShared(chargeKey, id) // the log phase charges the response
	}
	gate.Hold(context.Background(), outcome.Delay) // Kong proxies when access returns: holding shapes
}

// denialMessage is the message of a denial d: error_message, and with
// headers ai the provider (the name) of the limit that refused, as Kong's
// AI rate limiting says it ("API rate limit exceeded for provider
// azure").
func (inst *instance) denialMessage(d *core.Decision) string {
	if inst.Headers != "ai" || d.Policy == nil {
		return inst.ErrorMessage
	}
	if name := d.Policy.Limits()[d.Index].Name; name != "" {
		return inst.ErrorMessage + " for provider " + name
	}
	return inst.ErrorMessage
}

// leaseKey names the request's parked in-flight leases in kong.ctx.shared,
// chargeKey its parked charges; maxHold bounds a lease whose log phase
// never comes.
const (
	leaseKey  = "tollgate.leases"
	chargeKey = "tollgate.charge"
	maxHold   = time.Hour
)

// Log, in Kong's log phase (the response finished; WithResponse only),
// gives back the request's in-flight slots and reports the upstream's status and
// time to its first byte to an adaptive policy, skipping answers Kong made
// itself (tollgate's denials, other plugins' exits): not the upstream's.
func (c *Config) Log(kong *pdk.PDK) {
	inst := c.compiled
	if inst != nil && inst.policy.HoldsLeases() {
		if id, err := kong.Ctx.GetSharedString(leaseKey); err == nil {
			endParkedLeases(id) // the response is finished: its slots go back
		}
	}
	if inst != nil && inst.built.Policies[0].Charge != nil {
		inst.chargeResponse(kong)
	}
	if inst == nil || inst.policy.Adaptive() == nil {
		return
	}
	source, err := kong.Response.GetSource()
	if err != nil || source == "exit" {
		return
	}
	status, err := kong.Response.GetStatus()
	if err != nil {
		return
	}
	// The log phase runs in a timer, where ngx.var is disabled: the
	// upstream's time to its first byte is read from what Kong saved of
	// ngx.ctx (KONG_WAITING_TIME, milliseconds; kong.log.serialize's
	// latencies.proxy).
	waited, _ := kong.Nginx.GetCtxFloat("KONG_WAITING_TIME")
	inst.policy.Adaptive().Observe(upstreamStatus(source, status), time.Duration(max(0, waited)*float64(time.Millisecond)))
}

// upstreamStatus is the status an adaptive policy observes for a response
// Kong's PDK reports with source ("service" or "error") and status: 0 (no
// answer: a timeout or refusal) when Kong made an error response below 500
// itself.
func upstreamStatus(source string, status int) int {
	if source == "error" && status < 500 {
		return 0
	}
	return status
}

// chargeResponse charges the response its cost (Kong's status, and the
// upstream's headers the charge reads; a language model's tokens, see
// answerUsage) to the limits the request's access phase parked. The
// client already has the response, whose rate-limit headers were set in
// the access phase: the charge shows from the next request on.
func (inst *instance) chargeResponse(kong *pdk.PDK) {
	id, err := kong.Ctx.GetSharedString(chargeKey)
	if err != nil || id == "" {
		return
	}
	parked := takeParkedCharges(id)
	if parked == nil {
		return
	}
	o := &parked.outcome
	status, err := kong.Response.GetStatus()
	if err != nil {
		return
	}
	// The log phase runs in a timer, where kong.service.response is
	// disabled: the headers are the response's as Kong saved them before
	// the timer (kong/runloop/plugin_servers/plugin.lua), every line of a
	// repeated header read as one field (RFC 9110 section 5.3).
	var all map[string][]string
	headers := func() map[string][]string {
		if all == nil {
			all, _ = kong.Response.GetHeaders(-1)
		}
		return all
	}
	_ = o.Charge(context.Background(), status, func(name string) string {
		return headerValues(headers(), name)
	}) // a store that fails is logged when it starts failing
	if !o.ChargesBody() {
		return
	}
	u, found, stream := answerUsage(kong, headers())
	if !found {
		cost := int64(1)
		if c := inst.Charge.Cost; c != nil {
			cost = *c
		}
		inst.unreported.tell(kong, inst.who, stream, cost)
	}
	_ = o.ChargeBody(context.Background(), u, found)
}

// identifier computes the key as Kong's rate-limiting does (limit_by, with
// header_name and path for those), falling back to the client IP (Kong's
// trusted_ips logic) when the identifier is missing. It returns the
// consumer when it asked Kong for it.
func identifier(kong *pdk.PDK, limitBy, headerName, path string) (id string, consumer *entities.Consumer) {
	switch limitBy {
	case "consumer":
		if c, err := kong.Client.GetConsumer(); err == nil && c.Id != "" {
			id, consumer = c.Id, &c
		} else if cr, err := kong.Client.GetCredential(); err == nil {
			id = cr.Id
		}
	case "credential":
		if cr, err := kong.Client.GetCredential(); err == nil {
			id = cr.Id
		}
	case "service":
		if s, err := kong.Router.GetService(); err == nil {
			id = s.Id
		}
	case "header":
		id, _ = kong.Request.GetHeader(headerName)
	case "path":
		if p, err := kong.Request.GetPath(); err == nil && p == path {
			id = p
		}
	}
	if id == "" {
		id, _ = kong.Client.GetForwardedIp()
	}
	return id, consumer
}

// planOf names the request's plan: the plan_header's value, or the first
// of the consumer's tags that names a plan ("" takes the default plan).
func planOf(kong *pdk.PDK, inst *instance, consumer *entities.Consumer) string {
	plans := inst.built.Policies[0].Family
	if plans.Names() == nil {
		return "" // no PDK call without plans
	}
	switch inst.PlanBy {
	case "header":
		v, _ := kong.Request.GetHeader(inst.PlanHeader)
		return v
	case "consumer_tag":
		if consumer != nil { // limit_by consumer asked Kong already
			return plans.First(consumer.Tags)
		}
		if c, err := kong.Client.GetConsumer(); err == nil {
			return plans.First(c.Tags)
		}
	}
	return ""
}

// fail ends a request with a 500 as Kong does when its rate-limiting
// raises an error (Redis down, fault_tolerant false): Kong's plugin
// iterator answers a plugin's error with a delayed 500 "An unexpected error
// occurred" (kong/init.lua, execute_collecting_plugins_iterator), which
// kong.response.error renders in the format the Accept header asks for.
func fail(ev *pluginserver.Event) {
	deny(ev, http.StatusInternalServerError, "An unexpected error occurred", nil)
}

// delayedResponse is the ngx.ctx field Kong's access phase reads after
// each plugin: once set, Kong runs no further plugin's access handler and
// answers with kong.response.error(status_code, content.message, headers)
// (kong/init.lua, flush_delayed_response). It is what kong.response.exit
// itself sets in the access phase, but set from a plugin server it lets
// the event end normally: Kong reads the reply and keeps the connection,
// where kong.response.exit ends the request's Lua thread inside the RPC
// call and with it the connection.
const delayedResponse = "delayed_response"

// deny ends a request in Kong's access phase with status, message and
// headers, rendered by Kong as its own plugins' denials are (body by
// Accept, the request id, gRPC's terms over HTTP/2): one PDK call, sent
// with the event's end.
func deny(ev *pluginserver.Event, status int, message string, headers pluginserver.Headers) {
	h := make(map[string]any, len(headers))
	for name, value := range headers {
		h[name] = value.GetStringValue()
	}
	_ = ev.SetCtxAtEnd(delayedResponse, map[string]any{
		"status_code": status,
		"content":     map[string]any{"message": message},
		"headers":     h,
	})
}

// serveWith serves a plugin's instances, which start makes, on the
// socket of the Kong whose prefix is prefix, whose settings (.kong_env:
// its trust, its database) the instances read.
func serveWith(start func(config []byte) (any, error)) func(prefix, name, socket string) error {
	return func(prefix, name, socket string) error {
		kongPrefix.Store(&prefix)
		return pluginserver.ListenAndServe(name, socket, start)
	}
}
