package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/internal/benchkeys"
)

// serveLoop runs handle b.N times the way Caddy calls a handler (see
// serveN), timing only the requests.
func serveLoop(b *testing.B, handle func(w http.ResponseWriter, r *http.Request) error) {
	b.ReportAllocs()
	serveN(b, len(firstSeen), handle, firstSeen)
	serveN(b, b.N, handle, keys)
}

// keys are 100k distinct X-Key values, and firstSeen the same
// in another order: the benchmarks show the store each key first in
// firstSeen's order and then ask in keys', as a gateway's clients
// arrive in no order the store laid their state out in.
var keys, firstSeen = benchkeys.Orders(100_000)

// serveN runs handle n times the way Caddy calls a handler: a fresh
// request with its own replacer, keyed by X-Key over keys in turn, writing
// into one recorder; the setup is the same for tollgate and its floor.
func serveN(b *testing.B, n int, handle func(w http.ResponseWriter, r *http.Request) error, keys []string) {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	b.ResetTimer()
	for i := 0; i < n; i++ {
		r := req.Clone(req.Context())
		r.Header = http.Header{"X-Key": {keys[i%len(keys)]}}
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
		clear(w.Header())
		if err := handle(w, r); err != nil {
			b.Fatal(err)
		}
	}
}

// provisioned returns a handler with one policy of 100,000 a minute per
// X-Key (algorithm alg), default headers, the memory store.
func provisioned(b *testing.B, alg string) *Handler {
	h := &Handler{Policies: []*PolicyConfig{{Policy: config.Policy{Name: "p", Key: "{http.request.header.X-Key}",
		Limits: []config.Limit{{Count: 100_000, Window: algo.Duration(60e9), Algorithm: alg}}}}}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = h.Cleanup() })
	return h
}

var nextNothing = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })

// BenchmarkServeHTTP measures the handler in-process (no network): the
// per-request cost tollgate adds to Caddy, allowed requests on 100k keys.
func BenchmarkServeHTTP(b *testing.B) {
	for _, alg := range []string{"sliding_counter", "sliding_log"} {
		b.Run(alg, func(b *testing.B) {
			h := provisioned(b, alg)
			serveLoop(b, func(w http.ResponseWriter, r *http.Request) error { return h.ServeHTTP(w, r, nextNothing) })
		})
	}
}

// floorHeaders are the headers tollgate's handler sends an allowed
// request of provisioned's policy (100,000 a minute).
var floorHeaders = benchkeys.NewHeaderFloor(100_000, 60)

// BenchmarkServeHTTPFloor is the same chain with a handler that only sets
// floorHeaders: the floor tollgate's handler is compared with.
func BenchmarkServeHTTPFloor(b *testing.B) {
	serveLoop(b, func(w http.ResponseWriter, r *http.Request) error {
		floorHeaders.Set(w.Header())
		return nextNothing(w, r)
	})
}

// BenchmarkVsFloor measures the handler (sliding_counter) and two floors
// in the same run, in 30 rounds of 20,000 requests that alternate them
// (benchkeys.Interleaved; the medians of the rounds' differences and
// ratios count; allocations by testing.AllocsPerRun),
// for 1,000 keys, whose states stay in the CPU's caches, and for 100,000
// asked in random order, where reaching a key's state misses them. The
// header floor only sets the headers tollgate sends; the state floor also
// reaches each key's state (benchkeys.StateFloor: the memory latency any
// limiter in memory pays, without its pipeline). It prints `vs
// header-floor caddy-in-process-<n>-keys <factor>` and `vs state-floor
// caddy-in-process-<n>-keys <factor>` (floor ns / tollgate ns, the
// rounds' median: above 1 would mean tollgate costs less than the floor)
// with the median difference in ns per request, its quartiles over the
// rounds, and the difference in allocations. make bench runs it.
func BenchmarkVsFloor(b *testing.B) {
	if b.N > 1 {
		return // measured once, at b.N == 1, by its own rounds
	}
	for _, set := range benchkeys.Sets() {
		vsFloor(b, set.Name, set.Asked, set.FirstSeen)
	}
}

// vsFloor is BenchmarkVsFloor for one key set, on a handler of its own.
func vsFloor(b *testing.B, name string, keys, firstSeen []string) {
	h := provisioned(b, "sliding_counter")
	state := benchkeys.NewStateFloor(len(keys))
	headerFloor := func(w http.ResponseWriter, r *http.Request) error {
		floorHeaders.Set(w.Header())
		return nextNothing(w, r)
	}
	contenders := []func(w http.ResponseWriter, r *http.Request) error{
		headerFloor,
		func(w http.ResponseWriter, r *http.Request) error {
			state.Touch(r.Header.Get("X-Key"))
			return headerFloor(w, r)
		},
		func(w http.ResponseWriter, r *http.Request) error { return h.ServeHTTP(w, r, nextNothing) },
	}
	serveN(b, len(firstSeen), contenders[2], firstSeen)
	ns := benchkeys.Interleaved(len(contenders), benchkeys.FloorRounds, benchkeys.FloorRoundRequests, func(i, n int) { serveN(b, n, contenders[i], keys) })
	var allocs [3]float64
	for i, handle := range contenders {
		allocs[i] = testing.AllocsPerRun(5, func() { serveN(b, 10_000, handle, keys) }) / 10_000
	}
	benchkeys.PrintVsFloors(name, "tollgate", "caddy-in-process-"+name+"-keys", ns, allocs)
}
