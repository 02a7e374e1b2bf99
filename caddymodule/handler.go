// Package caddymodule is tollgate as a Caddy v2 HTTP handler
// (http.handlers.tollgate, Caddyfile directive tollgate). It turns a Caddy
// request into core decisions and a decision into Caddy's response; the
// algorithms, stores and headers live in core.
package caddymodule

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/admin"
	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/metrics"
	"github.com/tollgate/tollgate/core/openstore"
	"github.com/tollgate/tollgate/core/usage"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// ErrRateLimited is the error a denial hands to Caddy's handle_errors routes
// when Handler.HandleErrors is set.
var ErrRateLimited = errors.New("rate limit exceeded")

// Handler limits the rate of requests by policies over one store.
type Handler struct {
	// Store holds the counters; default memory.
	Store *config.Store `json:"store,omitempty"`
	// Policies are applied in order; a request must pass every policy that
	// matches it.
	Policies []*PolicyConfig `json:"policies"`
	// Response holds headers ("both" by default), status, body, jitter
	// and log_denials, as core reads them.
	config.Response
	// HandleErrors hands a denial to Caddy's handle_errors routes (with
	// the status and the rate-limit headers set) instead of writing Body.
	HandleErrors bool `json:"handle_errors,omitempty"`

	policies []*policy
	gate     *gate.Gate
	store    *openstore.Handle
	stopLog  func()
	compiled *config.Compiled // the policies, built and checked once
	metrics  *metrics.Set
	logger   *zap.Logger
	sampler  *gate.DenialSampler // nil unless log_denials
	offAdmin func()              // takes the policies out of the operators' API
	// unreported is set once an answer charged by its tokens reported
	// none, and Caddy's log told (made in Provision).
	unreported *atomic.Bool
}

// policy is a provisioned PolicyConfig.
type policy struct {
	compiled *config.CompiledPolicy // the policy, its empty-key handling and cost
	matchers caddyhttp.MatcherSets
	key      *keyTemplate
	plan     *keyTemplate // the template naming the request's plan; nil: none
	priority *keyTemplate // the template giving the request's priority; nil: none
	empties  emptyKeys    // how often the key came out empty, at first
}

// emptyKeyWindow is how many of a policy's first requests are watched for
// an empty key: when more than half of them have none, the log says so
// once (a key whose placeholder nothing sets, such as {http.auth.user.id}
// read before authentication, puts every client in its fallback bucket).
const emptyKeyWindow = 100

// emptyKeys counts a policy's first requests and those without a key.
type emptyKeys struct {
	seen, empty atomic.Int64
}

// note counts one request; it returns true once, for the request that
// ends the window with most keys empty. Past the window it costs one
// atomic load.
func (e *emptyKeys) note(empty bool) bool {
	if e.seen.Load() >= emptyKeyWindow {
		return false
	}
	if empty {
		e.empty.Add(1)
	}
	return e.seen.Add(1) == emptyKeyWindow && 2*e.empty.Load() > emptyKeyWindow
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.tollgate", New: func() caddy.Module { return new(Handler) }}
}

// Provision validates the config, opens (or joins) the store and loads the
// matchers. Errors name the field and value at fault.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.unreported = new(atomic.Bool)
	// Keyed like the counters, so a reload keeps an adaptive factor.
	var err error
	if h.compiled, err = config.Compile(h.setup("caddy")); err != nil {
		return err
	}
	h.sampler = gate.NewDenialSampler(h.compiled.LogDenials)
	for i, pc := range h.Policies {
		p, err := provisionPolicy(ctx, pc, &h.compiled.Policies[i])
		if err != nil {
			return err
		}
		h.policies = append(h.policies, p)
	}
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		if why := spoofableClientIP(srv, h.policies); why != "" {
			return errors.New(why)
		}
		if why := unsetPlaceholder(srv, h.policies); why != "" {
			return errors.New(why)
		}
		// A policy reading {http.auth.*} is checked against where the
		// authentication handler runs once every handler is provisioned:
		// the authOrder app, which Caddy starts with the config.
		if h.readsAuth() {
			if _, err := ctx.App("tollgate"); err != nil {
				return err
			}
		}
	}
	opened, err := h.compiled.Open("")
	if err != nil {
		return err
	}
	h.gate, h.store = opened.Gate, opened.Store
	h.stopLog = h.store.OnStateChange(func(open bool, err error) {
		if open {
			h.logger.Warn("rate-limit store failing; its failure policy decides until it answers again",
				zap.String("on_error", h.compiled.Store.OnError.String()), zap.Error(err))
		} else {
			h.logger.Warn("rate-limit store answering again")
		}
	})
	if h.metrics, err = metrics.New(ctx.GetMetricsRegistry(), h.gate, h.store); err != nil {
		return err
	}
	// The metrics registry is the config's own: it tells this config's
	// handlers from those of the config a reload replaces.
	h.offAdmin, err = admin.Register(h.gate, h.store, ctx.GetMetricsRegistry())
	return err
}

// setup is the handler's config as the one maker of gate configs takes
// it, its adaptive controllers shared under owner.
func (h *Handler) setup(owner string) config.Setup {
	specs := make([]*config.Policy, len(h.Policies))
	for i, pc := range h.Policies {
		if pc != nil {
			specs[i] = &pc.Policy
		}
	}
	return config.Setup{Owner: owner, Policies: specs, Store: h.Store,
		Response: h.Response, DefaultStyle: headers.Both, StyleNames: styleNames}
}

// provisionPolicy loads what Caddy adds to a compiled policy: its key,
// plan and priority templates and its matchers.
func provisionPolicy(ctx caddy.Context, pc *PolicyConfig, compiled *config.CompiledPolicy) (*policy, error) {
	p := &policy{compiled: compiled}
	var err error
	if p.key, err = parseKeyTemplate(cmp.Or(pc.Key, DefaultKey)); err != nil {
		return nil, fmt.Errorf("policy %q key: %w", pc.Name, err)
	}
	if pc.Plan != "" {
		if p.plan, err = parseKeyTemplate(pc.Plan); err != nil {
			return nil, fmt.Errorf("policy %q plan: %w", pc.Name, err)
		}
	}
	if pc.Priority != "" {
		if p.priority, err = parseKeyTemplate(pc.Priority); err != nil {
			return nil, fmt.Errorf("policy %q priority: %w", pc.Name, err)
		}
	}
	if pc.MatcherSetsRaw != nil {
		mods, err := ctx.LoadModule(pc, "MatcherSetsRaw")
		if err != nil {
			return nil, fmt.Errorf("policy %q match: %w", pc.Name, err)
		}
		if err := p.matchers.FromInterface(mods); err != nil {
			return nil, fmt.Errorf("policy %q match: %w", pc.Name, err)
		}
	}
	return p, nil
}

// Validate is done by Provision, which must build the policies to check
// them; it is here for Caddy's interface and rejects an unprovisioned
// handler.
func (h *Handler) Validate() error {
	if len(h.policies) == 0 {
		return fmt.Errorf("policies: need at least one policy")
	}
	return nil
}

// Cleanup releases the store: the last handler using it closes it.
func (h *Handler) Cleanup() error {
	if h.stopLog != nil {
		h.stopLog()
	}
	if h.metrics != nil {
		h.metrics.Close()
	}
	if h.offAdmin != nil {
		h.offAdmin()
	}
	if h.compiled != nil {
		h.compiled.Release()
	}
	if h.store == nil {
		return nil
	}
	err := h.store.Release()
	h.store = nil
	return err
}

// PlaceholderPrefix starts the placeholders set on every request:
// http.tollgate.<field> for each field of the decision the response shows
// (policy, limit, remaining, denied, retry_after, decided_at, store; see
// core.Decision.Fields), each empty when no policy applies.
const PlaceholderPrefix = "http.tollgate."

// request is one Caddy request as the gate sees it.
type request struct {
	h      *Handler
	r      *http.Request
	repl   *caddy.Replacer
	fields core.Fields // the shown decision's, for placeholders
}

// Input is policy i's view of the request: its matchers and its key.
func (q *request) Input(i int) (gate.Input, error) {
	p := q.h.policies[i]
	match, err := p.matchers.AnyMatchWithError(q.r)
	if err != nil || !match {
		return gate.Input{}, err
	}
	key := p.key.eval(q.r, q.repl)
	in := gate.Input{Covered: true, Key: key, Empty: key == p.key.literal && !p.key.constant, Cost: p.compiled.Cost}
	if p.empties.note(in.Empty) {
		q.h.logger.Warn("most requests have no key: their key's placeholders were empty, so they were handled as empty_key says",
			zap.String("policy", p.compiled.Policy.Name()), zap.String("key", p.key.source), zap.String("empty_key", p.compiled.EmptyKey.String()),
			zap.Int64("empty", p.empties.empty.Load()), zap.Int("of_first_requests", emptyKeyWindow))
	}
	if in.Empty && p.compiled.EmptyKey == gate.EmptyKeyClient {
		in.Client = clientAddress(q.r) // the default key's own value
	}
	if p.plan != nil {
		in.Plan = p.plan.eval(q.r, q.repl)
	}
	if p.priority != nil {
		in.Priority = config.ParsePriority(p.priority.eval(q.r, q.repl))
	}
	return in, nil
}

// Decided counts policy i's decision in its metrics.
func (q *request) Decided(i int, d *core.Decision, err error, took time.Duration) {
	q.h.metrics.Observe(i, d, err, took)
}

// ServeHTTP runs the gate, then denies, holds or passes the request on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	var outcome gate.Outcome // on the stack: only a request that holds something moves it (serveHeld)
	q := &request{h: h, r: r, repl: repl}
	if err := h.gate.Decide(r.Context(), q, &outcome); err != nil {
		var failed *gate.StoreError
		switch {
		case r.Context().Err() != nil:
			return r.Context().Err()
		case errors.As(err, &failed):
			// Only on_error fail gets here: the store could not decide. Its
			// state changes are logged once each (Provision's OnStateChange);
			// a line per request would flood the log during an outage.
			if h.HandleErrors {
				return caddyhttp.Error(http.StatusServiceUnavailable, err)
			}
			return writeText(w, http.StatusServiceUnavailable, "rate limiter unavailable\n")
		}
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	if !outcome.Covered() {
		repl.Map(uncovered) // no policy applies: the placeholders read empty, not as written
		return next.ServeHTTP(w, r)
	}
	shown := &outcome.Decision
	q.setPlaceholders(shown)
	h.gate.WriteHeaders(w.Header(), &outcome)
	if !outcome.Passes() {
		if ok, dropped := h.sampler.Sample(); ok { // log_denials lines a second at most
			h.logger.Info("rate limited", zap.String("policy", shown.Policy.Name()), zap.String("limit", shown.DecidingLimit().Label()),
				zap.String("key", shown.Policy.ShowKey(outcome.Key)), zap.Duration("retry_after", shown.RetryAfter), zap.Int64("not_logged", dropped))
		}
		if h.HandleErrors {
			return caddyhttp.Error(h.gate.Status(), ErrRateLimited)
		}
		return writeText(w, h.gate.Status(), h.gate.Body())
	}
	if outcome.Plain() {
		return next.ServeHTTP(w, r)
	}
	held := new(gate.Outcome)
	*held = outcome
	return h.serveHeld(held, w, r, next)
}

// serveHeld passes on an allowed request that holds something past its
// decision (see gate.Outcome.Plain): it is delayed, holds in-flight slots,
// is charged after its response or is heard by adaptive rules. The plain
// request's outcome stays on ServeHTTP's stack.
func (h *Handler) serveHeld(outcome *gate.Outcome, w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// In-flight slots go back when the chain returns: after the response,
	// on a panic, or when the client left.
	defer outcome.HoldLeases(0)()
	if !gate.Hold(r.Context(), outcome.Delay) {
		outcome.CancelShaped() // the client left while its request was held: its place goes to the next
		return r.Context().Err()
	}
	serve := func(w http.ResponseWriter) error {
		if outcome.Watching() {
			return observeUpstream(outcome, w, r, next)
		}
		return next.ServeHTTP(w, r)
	}
	if outcome.Charges() {
		return h.serveCharged(outcome, w, r, serve)
	}
	return serve(w)
}

// serveCharged serves the request and charges its response to the
// policies charged after the response, setting the rate-limit headers
// from what the charge left before the status goes out. An error a later
// handler returns (such as reverse_proxy's 502) is charged with its
// status. A store that fails to charge is not logged here: its state
// changes are (Provision's OnStateChange).
func (h *Handler) serveCharged(outcome *gate.Outcome, w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter) error) (err error) {
	defer h.tellUnreported(outcome) // a stream cut short panics through
	_ = h.gate.ServeCharged(r.Context(), outcome, w, func(w http.ResponseWriter) int {
		if err = serve(w); err == nil {
			return 0
		}
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode != 0 {
			return he.StatusCode
		}
		return http.StatusInternalServerError
	})
	return err
}

// tellUnreported logs, once per config, that an answer charged by its
// tokens reported none and was charged its policy's cost: a budget that
// counts estimates should be seen. After the first, one atomic load.
func (h *Handler) tellUnreported(outcome *gate.Outcome) {
	if !outcome.UsageUnreported() || h.unreported.Load() || h.unreported.Swap(true) {
		return
	}
	var names []string
	var costs []int64
	for _, p := range h.compiled.Policies {
		if p.Charge != nil && p.Charge.Usage != usage.None {
			names, costs = append(names, p.Policy.Name()), append(costs, p.Charge.Fixed)
		}
	}
	h.logger.Warn("an answer charged by its tokens reported no usage, and was charged its policy's charge cost instead "+
		"(an error page, a compressed answer: remove Accept-Encoding upstream; a stream cut short, or whose client did not ask for its usage); said once",
		zap.Strings("policies", names), zap.Int64s("costs", costs))
}

// writeText answers with status and a plain-text body, as Caddy's
// respond does: net/http adds Content-Length for a body this short.
func writeText(w http.ResponseWriter, status int, body string) error {
	w.Header()["Content-Type"] = []string{"text/plain; charset=utf-8"} // canonical: no Set
	w.WriteHeader(status)
	_, err := io.WriteString(w, body)
	return err
}

// observeUpstream serves the request and reports its status and latency
// to the adaptive controllers. An error a later handler returns (such as
// reverse_proxy's 502 or 504) counts with its status. The latency is
// reverse_proxy's own measure of the upstream, the time to its response
// header ({http.reverse_proxy.upstream.latency}), when the request went
// through reverse_proxy: not Caddy's time before it, nor the client's
// while the body streams. Otherwise it is the time to the first byte.
func observeUpstream(outcome *gate.Outcome, w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) (err error) {
	outcome.ServeObserved(w, func(w http.ResponseWriter) (int, time.Duration) {
		err = next.ServeHTTP(w, r)
		var upstream time.Duration
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			if v, ok := repl.Get(upstreamLatency); ok {
				upstream, _ = v.(time.Duration)
			}
		}
		if err == nil {
			return 0, upstream
		}
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode != 0 {
			return he.StatusCode, upstream
		}
		return http.StatusInternalServerError, upstream
	})
	return err
}

// upstreamLatency is the placeholder reverse_proxy sets to how long the
// upstream took to write its response header (a time.Duration).
const upstreamLatency = "http.reverse_proxy.upstream.latency"

// setPlaceholders offers d's fields to the replacer (q.placeholder looks
// them up), computed when a placeholder is used: most requests use none.
// They live in q, which the request allocated anyway.
func (q *request) setPlaceholders(d *core.Decision) { d.FieldsTo(&q.fields); q.repl.Map(q.placeholder) }

// uncovered fills the placeholders of a request no policy applies to:
// every field empty.
func uncovered(key string) (any, bool) {
	if name, ok := strings.CutPrefix(key, PlaceholderPrefix); ok {
		if _, known := (&core.Fields{}).Field(name); known {
			return "", true
		}
	}
	return nil, false
}

func (q *request) placeholder(key string) (any, bool) {
	if name, ok := strings.CutPrefix(key, PlaceholderPrefix); ok {
		return q.fields.Field(name)
	}
	return nil, false
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// readsAuth reports whether a policy reads an authentication placeholder.
func (h *Handler) readsAuth() bool {
	for _, pc := range h.Policies {
		for _, tmpl := range []string{pc.Key, pc.Plan, pc.Priority} {
			if authPlaceholder(tmpl) != "" {
				return true
			}
		}
	}
	return false
}
