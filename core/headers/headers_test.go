package headers

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/internal/headercheck"
)

func TestHeadersExact(t *testing.T) {
	p := core.MustPolicy("api", core.PolicyOptions{},
		algo.Limit{Count: 600, Window: time.Minute, Algorithm: algo.FixedWindow},
		algo.Limit{Count: 3600, Window: time.Hour, Algorithm: algo.SlidingCounter})
	allowed := core.Decision{Policy: p, N: 2, Allowed: true, Index: 0, Quota: 600, Remaining: 599, Reset: 59500 * time.Millisecond}
	allowed.Results[0].Remaining, allowed.Results[1].Remaining = 599, 0
	denied := core.Decision{Policy: p, N: 2, Index: 1, Quota: 3600, Remaining: 0, Reset: 2 * time.Hour, RetryAfter: 1500 * time.Millisecond}
	denied.Results[0].Remaining, denied.Results[1].Remaining = 599, -1
	cases := []struct {
		style Style
		d     core.Decision
		want  http.Header
	}{
		{IETF, allowed, http.Header{
			"Ratelimit-Policy": {`"api-1m";q=600;w=60, "api-1h";q=3600;w=3600`},
			"Ratelimit":        {`"api-1m";r=599;t=60`},
		}},
		{XRateLimit, allowed, http.Header{
			"X-Ratelimit-Limit": {"600"}, "X-Ratelimit-Remaining": {"599"}, "X-Ratelimit-Reset": {"60"},
		}},
		{Both, denied, http.Header{
			"Ratelimit-Policy": {`"api-1m";q=600;w=60, "api-1h";q=3600;w=3600`},
			// Denied: t is when this request would pass (the retry), so
			// Retry-After is never before it.
			"Ratelimit":         {`"api-1h";r=0;t=2`},
			"X-Ratelimit-Limit": {"3600"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"2"},
			"Retry-After": {"2"},
		}},
		{None, denied, http.Header{}},
		{AI, allowed, http.Header{
			"X-Ai-Ratelimit-Limit-60": {"600"}, "X-Ai-Ratelimit-Remaining-60": {"599"},
			"X-Ai-Ratelimit-Limit-3600": {"3600"}, "X-Ai-Ratelimit-Remaining-3600": {"0"},
			"X-Ai-Ratelimit-Reset": {"60"},
		}},
		{AI, denied, http.Header{
			"X-Ai-Ratelimit-Limit-60": {"600"}, "X-Ai-Ratelimit-Remaining-60": {"599"},
			"X-Ai-Ratelimit-Limit-3600": {"3600"}, "X-Ai-Ratelimit-Remaining-3600": {"0"},
			// the deciding limit's, as when this request would pass
			"X-Ai-Ratelimit-Reset": {"2"}, "X-Ai-Ratelimit-Retry-After": {"2"},
			"X-Ai-Ratelimit-Retry-After-3600": {"2"}, "X-Ai-Ratelimit-Reset-3600": {"2"},
			"Retry-After": {"2"},
		}},
	}
	for _, c := range cases {
		h := http.Header{}
		Write(h, &c.d, Options{Style: c.style})
		headercheck.Consistent(t, c.style.String(), h, 0)
		if !reflect.DeepEqual(h, c.want) {
			t.Errorf("%v: got %v, want %v", c.style, h, c.want)
		}
	}
}

func TestRetryAfterJitter(t *testing.T) {
	d := core.Decision{RetryAfter: 10 * time.Second}
	for _, c := range []struct {
		jitter, rand float64
		want         int64
	}{{0, 0.9, 10}, {0.2, 0, 10}, {0.2, 0.5, 11}, {0.2, 0.99, 12}, {5, 0.99, 20}} {
		o := Options{Jitter: c.jitter, Rand: func() float64 { return c.rand }}
		if got := o.RetryAfterSeconds(&d); got != c.want {
			t.Errorf("jitter %v rand %v: %d, want %d", c.jitter, c.rand, got, c.want)
		}
	}
	if got := (Options{}).RetryAfterSeconds(&core.Decision{RetryAfter: time.Millisecond}); got != 1 {
		t.Errorf("1ms retry: %d, want 1 (rounded up)", got)
	}
}

func TestSingleLimitUsesPolicyNameAndEscapes(t *testing.T) {
	p := core.MustPolicy(`a "b"\c`, core.PolicyOptions{}, algo.Limit{Count: 5, Window: 500 * time.Millisecond})
	// 5 per 500ms is advertised as 10 per second: the rate, in whole seconds.
	if f := fieldsOf(p, nil); f.policy != `"a \"b\"\\c";q=10;w=1` {
		t.Fatalf("got %s", f.policy)
	}
}

// Long names spill out of the rendering buffer's fixed space: the values
// must come out whole and in order all the same.
func TestHeadersLongNames(t *testing.T) {
	name := strings.Repeat("n", 300)
	p := core.MustPolicy(name, core.PolicyOptions{}, algo.Limit{Count: 1234567, Window: time.Minute})
	d := core.Decision{Policy: p, N: 1, Index: 0, Quota: 1234567, Remaining: 0, Reset: time.Minute, RetryAfter: 90 * time.Second}
	h := http.Header{}
	Write(h, &d, Options{Style: Both})
	want := http.Header{
		"Ratelimit-Policy":  {`"` + name + `";q=1234567;w=60`},
		"Ratelimit":         {`"` + name + `";r=0;t=90`},
		"X-Ratelimit-Limit": {"1234567"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"90"},
		"Retry-After": {"90"},
	}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("got %v, want %v", h, want)
	}
}

// A Renderer writing a decision's headers allocates their values once and
// the header map's slices once, whatever the number of headers: the
// policy's fields are derived once, for every decision after.
func TestWriteHeadersAllocatesTwice(t *testing.T) {
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 100000, Window: time.Minute})
	d := core.Decision{Policy: p, N: 1, Allowed: true, Quota: 100000, Remaining: 99999, Reset: time.Minute}
	r := NewRenderer(Options{}, p)
	h := http.Header{}
	r.Write(h, &d) // the map's buckets, the policy's fields
	if n := testing.AllocsPerRun(100, func() { r.Write(h, &d) }); n != 2 {
		t.Fatalf("%v allocations, want 2", n)
	}
	other := core.MustPolicy("other", core.PolicyOptions{}, algo.Limit{Count: 100000, Window: time.Minute})
	d.Policy = other
	h2 := http.Header{}
	Write(h2, &d, Options{})
	r.Write(h, &d) // a policy it does not keep: the same headers, derived for it
	if !reflect.DeepEqual(h, h2) {
		t.Errorf("a policy the renderer does not keep: %v, want %v", h, h2)
	}
}

// TestPolicyFieldFollowsAdaptiveFactor: RateLimit-Policy advertises the
// limits in force, derived again when the adaptive factor moves.
func TestPolicyFieldFollowsAdaptiveFactor(t *testing.T) {
	a, err := adaptive.NewJudged(adaptive.Options{Controller: adaptive.ControllerAIMD, MinFactor: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	p := core.MustPolicy("adapt", core.PolicyOptions{Adaptive: a}, algo.Limit{Count: 10, Window: time.Second, Algorithm: algo.SlidingLog})
	cache := NewRenderer(Options{}, p).cache
	if h := fieldsOf(p, cache).policy; h != `"adapt";q=10;w=1` {
		t.Fatalf("RateLimit-Policy %q, want the configured quota", h)
	}
	for j := 0; j < 100; j++ {
		a.Observe(503, time.Millisecond)
	}
	a.Judge() // factor 0.7: count 7
	if h := fieldsOf(p, cache).policy; h != `"adapt";q=7;w=1` {
		t.Fatalf("RateLimit-Policy %q, want the tightened quota", h)
	}
}

// TestParseStyle: core's names always read; an adapter's names only when
// it passes them, so what a name means never depends on what is linked.
func TestParseStyle(t *testing.T) {
	for _, s := range []Style{Both, IETF, XRateLimit, None, PerLimit, AI} {
		if got, err := ParseStyle(s.String(), nil); err != nil || got != s {
			t.Errorf("%v: %v %v", s, got, err)
		}
	}
	names := map[string]Style{"gateway": PerLimit}
	if got, err := ParseStyle("gateway", names); err != nil || got != PerLimit {
		t.Errorf("an adapter's name: %v %v", got, err)
	}
	if _, err := ParseStyle("gateway", nil); err == nil || err.Error() != `headers: unknown style "gateway" (want ietf, xratelimit, both, none, per_limit or ai)` {
		t.Errorf("an adapter's name not passed: %v", err)
	}
	if _, err := ParseStyle("x", names); err == nil || err.Error() != `headers: unknown style "x" (want ietf, xratelimit, both, none, per_limit, ai or gateway)` {
		t.Errorf("an unknown name, with the adapter's: %v", err)
	}
}

// TestRetryAfterIsWhenARetryPasses: in every style, a denied token bucket
// (20 per 10 s, burst 20, emptied) says Retry-After 1, when its next token
// comes, not 10, when it is full again; and its limit header is its
// burst, the same figure RateLimit-Policy gives as q, so the remaining is
// never above it. A fixed window says its end.
func TestRetryAfterIsWhenARetryPasses(t *testing.T) {
	clock := &core.ManualClock{Micros: 1_700_000_040_000_000} // a minute's start
	store := memory.MustNew(memory.Options{Clock: clock})
	bucket := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 20, Window: 10 * time.Second, Algorithm: algo.TokenBucket, Burst: 20})
	window := core.MustPolicy("win", core.PolicyOptions{}, algo.Limit{Name: "minute", Count: 2, Window: time.Minute, Algorithm: algo.FixedWindow})
	for _, tc := range []struct {
		p          *core.Policy
		n          int
		retry      string
		limitField string
		limit      string
		aiField    string
	}{
		{bucket, 21, "1", "X-RateLimit-Limit-20/10s", "20", "X-AI-RateLimit-Limit-10"},
		{window, 3, "60", "X-Ratelimit-Limit-Minute", "2", "X-AI-RateLimit-Limit-60-minute"},
	} {
		var d core.Decision
		for i := 0; i < tc.n; i++ {
			if err := store.Decide(context.Background(), tc.p, "k", 1, &d); err != nil {
				t.Fatal(err)
			}
		}
		if d.Allowed {
			t.Fatalf("%s: request %d allowed", tc.p.Name(), tc.n)
		}
		for _, style := range []Style{Both, IETF, XRateLimit, PerLimit, AI} {
			h := http.Header{}
			Write(h, &d, Options{Style: style})
			headercheck.Consistent(t, tc.p.Name()+" "+style.String(), h, 0)
			if got := h.Get("Retry-After"); got != tc.retry {
				t.Errorf("%s %v: Retry-After %s, want %s", tc.p.Name(), style, got, tc.retry)
			}
			if style == PerLimit && (h.Get(tc.limitField) != tc.limit || h.Get("Ratelimit-Limit") != tc.limit) {
				t.Errorf("%s per_limit: %s %q, RateLimit-Limit %q; want %s (%v)", tc.p.Name(), tc.limitField, h.Get(tc.limitField), h.Get("Ratelimit-Limit"), tc.limit, h)
			}
			if style == AI && (h.Get(tc.aiField) != tc.limit || h.Get("X-AI-RateLimit-Retry-After") != tc.retry) {
				t.Errorf("%s ai: %s %q, X-AI-RateLimit-Retry-After %q; want %s, %s (%v)", tc.p.Name(), tc.aiField, h.Get(tc.aiField), h.Get("X-AI-RateLimit-Retry-After"), tc.limit, tc.retry, h)
			}
			if style == XRateLimit && h.Get("X-Ratelimit-Limit") != tc.limit {
				t.Errorf("%s xratelimit: X-RateLimit-Limit %q, want %s", tc.p.Name(), h.Get("X-Ratelimit-Limit"), tc.limit)
			}
		}
	}
}
