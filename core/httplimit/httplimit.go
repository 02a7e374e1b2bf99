// Package httplimit is tollgate as net/http middleware, an adapter beside
// the gateway plugins: each rule picks the requests it
// covers and derives a key from them; a gate.Gate decides, and a denied
// request gets the configured status, body and headers. It imports no other
// adapter and no store: the caller builds the limiters over a store.
package httplimit

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/usage"
)

// KeyFunc derives a rate-limit key from a request; ok false means the
// request has no key for this rule (see Rule.EmptyKey).
type KeyFunc func(r *http.Request) (key string, ok bool)

// ClientIP keys on the peer address of the connection (RemoteAddr's host).
// It never reads X-Forwarded-For: behind a proxy, put the proxy's own
// trusted-client logic in front (net/http has none), or key on a header the
// proxy sets and the client cannot.
func ClientIP(r *http.Request) (string, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr, r.RemoteAddr != ""
	}
	return host, true
}

// Header keys on the value of the named request header.
func Header(name string) KeyFunc {
	return func(r *http.Request) (string, bool) {
		v := r.Header.Get(name)
		return v, v != ""
	}
}

// Rule applies one limiter to the requests it matches.
type Rule struct {
	// Limiter holds the policy and store.
	Limiter *core.Limiter
	// Match selects the requests the rule covers; nil means all.
	Match func(*http.Request) bool
	// Key derives the key; nil means ClientIP.
	Key KeyFunc
	// EmptyKey handles requests without a key: gate.EmptyKeyClient (the
	// default) keys them by ClientIP, so leaving a key out gets no client
	// out of the limit; gate.EmptyKeySkip lets them through unlimited;
	// gate.EmptyKeyShared counts them in one bucket keyed "".
	EmptyKey gate.EmptyKey
	// Cost returns the request's cost in units; nil means 1.
	Cost func(*http.Request) int64
	// Charge, for a policy with limits charged after the response
	// (algo.Limit.AfterResponse), is what each response costs them, from
	// config.Charge.Compile.
	Charge *gate.ResponseCost
}

// Config configures the middleware.
type Config struct {
	// Rules are applied in order; a request must pass every rule it matches.
	Rules []Rule
	// Headers selects the rate-limit headers.
	Headers headers.Options
	// Status is the denial status; 0 means 429.
	Status int
	// Body is the denial body; empty means gate.DefaultDenyBody.
	Body string
	// DenyOnError answers 503 when a store fails; by default the rule is
	// skipped and the request passes it unlimited. A store wrapped in
	// failover.New decides on its fallback instead, and fails only with
	// on_error fail.
	DenyOnError bool
	// OnDecision, if set, is called with every decision (for logs, metrics).
	OnDecision func(r *http.Request, d *core.Decision)
	// OnError, if set, is called with every store error: the request, the
	// rule's policy name and the error (the client's own cancellations are
	// not store errors and are not reported).
	OnError func(r *http.Request, policy string, err error)
	// Logger hears when a rule's store starts failing, when its failure
	// policy (failover) starts deciding in its place, and when it answers
	// again: one line per change, never one per request; and, once, when
	// an answer charged by its tokens reported none. nil means
	// slog.Default().
	Logger *slog.Logger
}

// New returns the middleware for cfg; errors name the field and value.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	gc := gate.Config{Status: cfg.Status, Body: cfg.Body, Headers: cfg.Headers, SkipFailed: !cfg.DenyOnError}
	for i, r := range cfg.Rules {
		if r.Limiter == nil {
			return nil, fmt.Errorf("rules[%d]: no Limiter (core.NewLimiter of a policy and a store)", i)
		}
		if r.Limiter.Policy().AfterResponse() && r.Charge == nil {
			return nil, fmt.Errorf("policy %q: its limits are charged after the response, and its rule has no Charge", r.Limiter.Policy().Name())
		}
		gc.Rules = append(gc.Rules, gate.Rule{Limiter: r.Limiter, EmptyKey: r.EmptyKey, Charge: r.Charge})
	}
	g, err := gate.New(gc)
	if err != nil {
		return nil, err
	}
	m := &middleware{cfg: cfg, gate: g, health: make([]atomic.Int32, len(cfg.Rules))}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			serve(m, next, w, r)
		})
	}, nil
}

// middleware is one Config's gate and what it has told its logger.
type middleware struct {
	cfg        Config
	gate       *gate.Gate
	health     []atomic.Int32 // per rule: the storeHealth last logged
	unreported atomic.Bool    // an answer without usage was told
}

// logger is Config.Logger, or slog.Default().
func (m *middleware) logger() *slog.Logger {
	if m.cfg.Logger != nil {
		return m.cfg.Logger
	}
	return slog.Default()
}

// tellUnreported logs, once, that an answer charged by its tokens
// reported none and was charged its rule's fixed cost instead.
func (m *middleware) tellUnreported(outcome *gate.Outcome) {
	if !outcome.UsageUnreported() || m.unreported.Load() || m.unreported.Swap(true) {
		return
	}
	var policies []string
	for _, r := range m.cfg.Rules {
		if r.Charge != nil && r.Charge.Usage != usage.None {
			policies = append(policies, r.Limiter.Policy().Name())
		}
	}
	m.logger().Warn("tollgate: an answer charged by its tokens reported no usage, and was charged its rule's fixed cost instead "+
		"(an error page, a compressed answer, a stream cut short or whose client did not ask for its usage); said once", "policies", policies)
}

// storeHealth is how a rule's store answered its last decision.
type storeHealth int32

const (
	storeAnswering storeHealth = iota
	storeFailing               // the store returned an error
	storeFallback              // failover's failure policy decided in its place
)

// observe logs rule i's store health when it differs from what was last
// logged, so an outage is said once when it starts and once when it ends.
func (m *middleware) observe(i int, now storeHealth, err error) {
	was := storeHealth(m.health[i].Load())
	if was == now || !m.health[i].CompareAndSwap(int32(was), int32(now)) {
		return
	}
	rule := m.cfg.Rules[i].Limiter
	policy, store := rule.Policy().Name(), strings.TrimPrefix(fmt.Sprintf("%T", rule.Store()), "*")
	log := m.logger()
	switch now {
	case storeFailing:
		consequence := "its requests pass unlimited until it answers (Config.DenyOnError answers 503 instead; failover.New keeps a local limit)"
		if m.cfg.DenyOnError {
			consequence = "its requests are answered 503 until it answers"
		}
		log.Error("tollgate: rate-limit store failing; "+consequence, "policy", policy, "store", store, "error", err)
	case storeFallback:
		log.Warn("tollgate: rate-limit store failing; its failure policy decides until it answers again", "policy", policy, "store", store)
	default:
		log.Info("tollgate: rate-limit store answering again", "policy", policy, "store", store)
	}
}

// request is one request as the gate sees it.
type request struct {
	m *middleware
	r *http.Request
}

// Input is rule i's view of the request.
func (q *request) Input(i int) (gate.Input, error) {
	rule, r := &q.m.cfg.Rules[i], q.r
	if rule.Match != nil && !rule.Match(r) {
		return gate.Input{}, nil
	}
	keyOf := rule.Key
	if keyOf == nil {
		keyOf = ClientIP
	}
	key, ok := keyOf(r)
	in := gate.Input{Covered: true, Key: key, Empty: !ok, Cost: 1}
	if !ok && rule.EmptyKey == gate.EmptyKeyClient {
		in.Client, _ = ClientIP(r)
	}
	if rule.Cost != nil {
		in.Cost = rule.Cost(r)
	}
	return in, nil
}

// Decided hands every decision to Config.OnDecision and every store error
// to Config.OnError, and logs a change in the store's health.
func (q *request) Decided(i int, d *core.Decision, err error, _ time.Duration) {
	cfg := &q.m.cfg
	switch {
	case err != nil:
		if q.r.Context().Err() != nil {
			return // the client went away: not the store's failure
		}
		q.m.observe(i, storeFailing, err)
		if cfg.OnError != nil {
			cfg.OnError(q.r, cfg.Rules[i].Limiter.Policy().Name(), err)
		}
		return
	case d.Fallback:
		q.m.observe(i, storeFallback, nil)
	default:
		q.m.observe(i, storeAnswering, nil)
	}
	if cfg.OnDecision != nil {
		cfg.OnDecision(q.r, d)
	}
}

func serve(m *middleware, next http.Handler, w http.ResponseWriter, r *http.Request) {
	g := m.gate
	var outcome gate.Outcome // on the stack: only a request that holds something moves it (serveHeld)
	err := g.Decide(r.Context(), &request{m, r}, &outcome)
	if err != nil {
		if r.Context().Err() == nil {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
		}
		return
	}
	g.WriteHeaders(w.Header(), &outcome)
	if !outcome.Passes() {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(g.Body())))
		w.WriteHeader(g.Status())
		_, _ = w.Write([]byte(g.Body()))
		return
	}
	if outcome.Plain() {
		next.ServeHTTP(w, r)
		return
	}
	held := new(gate.Outcome)
	*held = outcome
	serveHeld(m, next, w, r, held)
}

// serveHeld passes on an allowed request that holds something past its
// decision (see gate.Outcome.Plain): it is delayed, holds in-flight slots,
// is charged after its response or is heard by adaptive rules.
func serveHeld(m *middleware, next http.Handler, w http.ResponseWriter, r *http.Request, outcome *gate.Outcome) {
	defer outcome.HoldLeases(0)() // in-flight slots go back when next returns, even on a panic
	if !gate.Hold(r.Context(), outcome.Delay) {
		outcome.CancelShaped() // the client went away while it was shaped: its place goes to the next
		return
	}
	serveNext := func(w http.ResponseWriter) {
		if outcome.Watching() { // adaptive rules hear how the upstream answered
			outcome.ServeObserved(w, func(w http.ResponseWriter) (int, time.Duration) { next.ServeHTTP(w, r); return 0, 0 })
			return
		}
		next.ServeHTTP(w, r)
	}
	if outcome.Charges() { // the response is charged to the rules that charge after it
		defer m.tellUnreported(outcome) // a stream cut short panics through
		_ = m.gate.ServeCharged(r.Context(), outcome, w, func(w http.ResponseWriter) int { serveNext(w); return 0 })
		return
	}
	serveNext(w)
}
