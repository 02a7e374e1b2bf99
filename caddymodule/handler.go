// Package caddymodule is tollgate as a Caddy v2 HTTP handler
// (http.handlers.tollgate, Caddyfile directive tollgate). It turns a Caddy
// request into core decisions and a decision into Caddy's response; the
// algorithms, stores and headers live in core.
package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/httplimit"
	"github.com/tollgate/tollgate/core/store"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// DefaultBody is the body of a denied response when none is configured.
const DefaultBody = "rate limit exceeded\n"

// ErrRateLimited is the error a denial hands to Caddy's handle_errors routes
// when Handler.HandleErrors is set.
var ErrRateLimited = errors.New("rate limit exceeded")

// Handler limits the rate of requests by policies over one store.
type Handler struct {
	// Store holds the counters; default memory.
	Store *StoreConfig `json:"store,omitempty"`
	// Policies are applied in order; a request must pass every policy that
	// matches it.
	Policies []*PolicyConfig `json:"policies"`
	// Headers picks the rate-limit headers: "both" (default), "ietf",
	// "xratelimit" or "none".
	Headers string `json:"headers,omitempty"`
	// Status is the denial status code; default 429.
	Status int `json:"status,omitempty"`
	// Body is the denial body; default DefaultBody.
	Body string `json:"body,omitempty"`
	// Jitter adds up to this fraction of Retry-After at random (0 to 1).
	Jitter float64 `json:"jitter,omitempty"`
	// HandleErrors hands a denial to Caddy's handle_errors routes (with
	// the status and the rate-limit headers set) instead of writing Body.
	HandleErrors bool `json:"handle_errors,omitempty"`

	policies []*policy
	headers  core.HeaderOptions
	store    *store.Handle
	stopLog  func()
	releases []func() // adaptive controllers acquired
	logger   *zap.Logger
}

// policy is a provisioned PolicyConfig.
type policy struct {
	cfg      *PolicyConfig
	pol      *core.Policy
	limiter  *core.Limiter // pol over the store, once it is open
	matchers caddyhttp.MatcherSets
	key      string
	literal  string // key with every placeholder removed: an "empty" key
	constant bool   // key has no placeholder: one bucket, never empty
	shared   bool   // empty keys share one bucket instead of skipping
	cost     int64
	limitIDs []string // limits' labels, for metrics
	metrics  *policyMetrics
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.tollgate",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision validates the config, opens (or joins) the store and loads the
// matchers. Errors name the field and value at fault.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if len(h.Policies) == 0 {
		return fmt.Errorf("policies: need at least one policy")
	}
	style, err := core.ParseHeaderStyle(orDefault(h.Headers, "both"))
	if err != nil {
		return err
	}
	if h.Jitter < 0 || h.Jitter > 1 {
		return fmt.Errorf("jitter: %g must be between 0 and 1", h.Jitter)
	}
	h.headers = core.HeaderOptions{Style: style, Jitter: h.Jitter}
	if h.Status == 0 {
		h.Status = http.StatusTooManyRequests
	}
	if h.Status < 400 || h.Status > 599 {
		return fmt.Errorf("status: %d is not a 4xx or 5xx code", h.Status)
	}
	if h.Body == "" {
		h.Body = DefaultBody
	}
	sc, err := h.Store.storeConfig()
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, pc := range h.Policies {
		if pc == nil {
			return fmt.Errorf("policies: null policy")
		}
		if seen[pc.Name] {
			return fmt.Errorf("policy %q: name used twice", pc.Name)
		}
		seen[pc.Name] = true
		p, err := h.provisionPolicy(ctx, pc)
		if err != nil {
			return err
		}
		h.policies = append(h.policies, p)
	}
	h.store, err = store.Acquire(sc)
	if err != nil {
		return err
	}
	for _, p := range h.policies {
		if err := h.store.CheckPolicy(p.pol); err != nil {
			return err
		}
		p.limiter = core.NewLimiter(p.pol, h.store.Store)
		if a := p.pol.Adaptive(); a != nil {
			// With Redis, every node's controller moves one shared factor.
			a.SetSync(h.store.FactorSync(p.pol.Scope()))
		}
	}
	h.stopLog = h.store.OnStateChange(func(open bool, err error) {
		if open {
			h.logger.Warn("rate-limit store failing; its failure policy decides until it answers again",
				zap.String("on_error", orDefault(h.Store.onError(), "local")), zap.Error(err))
		} else {
			h.logger.Warn("rate-limit store answering again")
		}
	})
	m, err := newMetrics(ctx.GetMetricsRegistry(), h.policies, h.store)
	if err != nil {
		return err
	}
	for _, p := range h.policies {
		p.metrics = m.forPolicy(p)
	}
	return nil
}

func (h *Handler) provisionPolicy(ctx caddy.Context, pc *PolicyConfig) (*policy, error) {
	limits, err := pc.limits()
	if err != nil {
		return nil, err
	}
	opts := core.PolicyOptions{Shadow: pc.Shadow}
	if pc.Adaptive != nil {
		// Keyed like the counters, so a reload keeps the factor.
		scope, err := core.PolicyScope(pc.Name, limits...)
		if err != nil {
			return nil, err
		}
		a, release, err := core.AcquireAdaptive("caddy|"+scope, pc.Adaptive.options())
		if err != nil {
			return nil, fmt.Errorf("policy %q %w", pc.Name, err)
		}
		opts.Adaptive = a
		h.releases = append(h.releases, release)
	}
	cp, err := core.NewPolicy(pc.Name, opts, limits...)
	if err != nil {
		return nil, err
	}
	p := &policy{cfg: pc, pol: cp, key: orDefault(pc.Key, DefaultKey), shared: pc.EmptyKey == "shared", cost: pc.Cost}
	if pc.Cost == 0 {
		p.cost = 1
	}
	p.literal = caddy.NewEmptyReplacer().ReplaceAll(p.key, "")
	p.constant = p.literal == p.key
	for _, l := range cp.Configured() { // stable labels: not the adapted counts
		p.limitIDs = append(p.limitIDs, l.Label())
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

func (c *StoreConfig) onError() string {
	if c == nil {
		return ""
	}
	return c.OnError
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
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
	for _, release := range h.releases {
		release()
	}
	h.releases = nil
	if h.store == nil {
		return nil
	}
	err := h.store.Release()
	h.store = nil
	return err
}

// Placeholders set on every request a policy applies to.
const (
	// PlaceholderPolicy is the name of the policy whose decision the
	// response shows (the denying one, or the most restrictive).
	PlaceholderPolicy = "http.tollgate.policy"
	// PlaceholderLimit is that decision's limit (count per window).
	PlaceholderLimit = "http.tollgate.limit"
	// PlaceholderRemaining is the units left in that limit.
	PlaceholderRemaining = "http.tollgate.remaining"
	// PlaceholderDenied is "true" for a denied request, else "false".
	PlaceholderDenied = "http.tollgate.denied"
	// PlaceholderRetryAfter is the Retry-After in seconds when denied, else 0.
	PlaceholderRetryAfter = "http.tollgate.retry_after"
	// PlaceholderDecidedAt is when the store decided, in µs since the Unix
	// epoch on the store's clock (Redis's TIME for the Redis store).
	PlaceholderDecidedAt = "http.tollgate.decided_at"
	// PlaceholderStore is "shared" when the store decided, or "fallback"
	// when Redis failed and the failure policy decided.
	PlaceholderStore = "http.tollgate.store"
)

// ServeHTTP applies every matching policy, then denies, delays or passes the
// request on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	var shown, d core.Decision
	var delay time.Duration
	var watch []*core.Adaptive // controllers of the policies that applied
	for _, p := range h.policies {
		match, err := p.matchers.AnyMatchWithError(r)
		if err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, err)
		}
		if !match {
			continue
		}
		key := repl.ReplaceKnown(p.key, "")
		if key == p.literal && !p.shared && !p.constant {
			continue
		}
		start := time.Now()
		err = p.limiter.Decide(r.Context(), key, p.cost, &d)
		p.metrics.observe(&d, err, time.Since(start))
		if err != nil {
			if r.Context().Err() != nil {
				return r.Context().Err()
			}
			// Only on_error fail gets here: the store could not decide.
			h.logger.Warn("rate-limit store failed", zap.String("policy", p.cfg.Name), zap.Error(err))
			return caddyhttp.Error(http.StatusServiceUnavailable, err)
		}
		if shown.Policy == nil || core.MoreRestrictive(&d, &shown) {
			shown = d
		}
		if !d.Allowed {
			break
		}
		if a := p.pol.Adaptive(); a != nil {
			watch = append(watch, a)
		}
		delay = max(delay, d.Delay)
	}
	if shown.Policy == nil {
		return next.ServeHTTP(w, r)
	}
	h.setPlaceholders(repl, &shown)
	core.WriteHeaders(w.Header(), &shown, h.headers)
	if !shown.Allowed {
		if ce := h.logger.Check(zap.DebugLevel, "rate limited"); ce != nil {
			ce.Write(zap.String("policy", shown.Policy.Name()), zap.String("limit", shown.DecidingLimit().Label()),
				zap.Duration("retry_after", shown.RetryAfter), zap.String("remote", r.RemoteAddr))
		}
		if h.HandleErrors {
			return caddyhttp.Error(h.Status, ErrRateLimited)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(h.Body)))
		w.WriteHeader(h.Status)
		_, err := w.Write([]byte(h.Body))
		return err
	}
	if delay > 0 && !httplimit.Sleep(r.Context(), delay) {
		return r.Context().Err() // the client left while its request was held
	}
	if len(watch) > 0 {
		return observeUpstream(watch, w, r, next)
	}
	return next.ServeHTTP(w, r)
}

// observeUpstream serves the request and reports its status and duration
// to the adaptive controllers. An error a later handler returns (such as
// reverse_proxy's 502 or 504) counts with its status.
func observeUpstream(watch []*core.Adaptive, w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	rec := &statusRecorder{ResponseWriter: w}
	began := time.Now()
	err := next.ServeHTTP(rec, r)
	took := time.Since(began)
	status := rec.status
	if err != nil {
		status = http.StatusInternalServerError
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode != 0 {
			status = he.StatusCode
		}
	} else if status == 0 {
		status = http.StatusOK
	}
	for _, a := range watch {
		a.Observe(status, took)
	}
	return err
}

// statusRecorder remembers the status a handler writes.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// setPlaceholders offers d's values to the replacer. They are computed when
// a placeholder is used, not per request: most requests use none.
func (h *Handler) setPlaceholders(repl *caddy.Replacer, d *core.Decision) {
	ph := &placeholders{policy: d.Policy.Name(), limit: d.DecidingLimit(), remaining: d.Remaining,
		denied: !d.Allowed, at: d.At, fallback: d.Fallback}
	if !d.Allowed {
		ph.retry = core.Seconds(d.RetryAfter)
	}
	repl.Map(ph.lookup)
}

// placeholders are one decision's values for the http.tollgate.* names.
type placeholders struct {
	policy    string
	limit     *core.Limit
	remaining int64
	retry     int64
	at        int64
	denied    bool
	fallback  bool
}

func (p *placeholders) lookup(key string) (any, bool) {
	switch key {
	case PlaceholderPolicy:
		return p.policy, true
	case PlaceholderLimit:
		return p.limit.Rate(), true
	case PlaceholderRemaining:
		return p.remaining, true
	case PlaceholderDenied:
		return strconv.FormatBool(p.denied), true
	case PlaceholderRetryAfter:
		return p.retry, true
	case PlaceholderDecidedAt:
		return p.at, true
	case PlaceholderStore:
		if p.fallback {
			return "fallback", true
		}
		return "shared", true
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
