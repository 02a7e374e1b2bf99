// Package httplimit is tollgate as net/http middleware: each rule picks the
// requests it covers, derives a key from them and applies its policy; a
// request any rule denies gets the configured status, body and headers.
package httplimit

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/core"
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

// EmptyKey says what a rule does with a request its KeyFunc finds no key for.
type EmptyKey uint8

const (
	// SkipEmpty lets the request through this rule unlimited (the default).
	SkipEmpty EmptyKey = iota
	// SharedEmpty puts every keyless request in one shared bucket, keyed "".
	SharedEmpty
)

// Rule applies one limiter to the requests it matches.
type Rule struct {
	// Limiter holds the policy and store.
	Limiter *core.Limiter
	// Match selects the requests the rule covers; nil means all.
	Match func(*http.Request) bool
	// Key derives the key; nil means ClientIP.
	Key KeyFunc
	// EmptyKey handles requests without a key.
	EmptyKey EmptyKey
	// Cost returns the request's cost in units; nil means 1.
	Cost func(*http.Request) int64
}

// Config configures the middleware.
type Config struct {
	// Rules are applied in order; a request must pass every rule it matches.
	Rules []Rule
	// Headers selects the rate-limit headers.
	Headers core.HeaderOptions
	// Status is the denial status; 0 means 429.
	Status int
	// Body is the denial body; empty means "rate limit exceeded\n".
	Body string
	// DenyOnError answers 503 when a store fails; by default the request is
	// let through (the store's own failure policy decides first).
	DenyOnError bool
	// OnDecision, if set, is called with every decision (for logs, metrics).
	OnDecision func(r *http.Request, d *core.Decision)
}

// New returns the middleware for cfg.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	if len(cfg.Rules) == 0 {
		return nil, fmt.Errorf("rules: need at least one")
	}
	for i, r := range cfg.Rules {
		if r.Limiter == nil {
			return nil, fmt.Errorf("rules[%d].Limiter: must be set", i)
		}
	}
	if cfg.Status == 0 {
		cfg.Status = http.StatusTooManyRequests
	}
	if cfg.Status < 400 || cfg.Status > 599 {
		return nil, fmt.Errorf("status: %d is not a 4xx or 5xx code", cfg.Status)
	}
	if cfg.Body == "" {
		cfg.Body = "rate limit exceeded\n"
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			serve(&cfg, next, w, r)
		})
	}, nil
}

func serve(cfg *Config, next http.Handler, w http.ResponseWriter, r *http.Request) {
	var shown core.Decision // the decision whose headers the response carries
	var delay time.Duration
	for i := range cfg.Rules {
		rule := &cfg.Rules[i]
		if rule.Match != nil && !rule.Match(r) {
			continue
		}
		keyOf := rule.Key
		if keyOf == nil {
			keyOf = ClientIP
		}
		key, ok := keyOf(r)
		if !ok && rule.EmptyKey == SkipEmpty {
			continue
		}
		cost := int64(1)
		if rule.Cost != nil {
			cost = rule.Cost(r)
		}
		var d core.Decision
		if err := rule.Limiter.Decide(r.Context(), key, cost, &d); err != nil {
			if cfg.DenyOnError {
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
				return
			}
			continue
		}
		if cfg.OnDecision != nil {
			cfg.OnDecision(r, &d)
		}
		if shown.Policy == nil || core.MoreRestrictive(&d, &shown) {
			shown = d
		}
		if !d.Allowed {
			break
		}
		delay = max(delay, d.Delay)
	}
	if shown.Policy != nil {
		core.WriteHeaders(w.Header(), &shown, cfg.Headers)
	}
	if shown.Policy != nil && !shown.Allowed {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(cfg.Body)))
		w.WriteHeader(cfg.Status)
		_, _ = w.Write([]byte(cfg.Body))
		return
	}
	if delay > 0 && !Sleep(r.Context(), delay) {
		return // the client went away while its request was being shaped
	}
	next.ServeHTTP(w, r)
}

// Sleep waits d or until ctx ends, and reports whether the whole d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
