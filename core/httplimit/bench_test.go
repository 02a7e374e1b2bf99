package httplimit

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/memory"
)

// benchKeys are 100k distinct X-Key values.
var benchKeys = func() []string {
	k := make([]string, 100_000)
	for i := range k {
		k[i] = "k" + strconv.Itoa(i)
	}
	return k
}()

// floorHeaders are the five headers the middleware sends an allowed
// request (its default style, both), of the same sizes: what a handler
// that only sets them writes.
var floorHeaders = [][2]string{
	{"RateLimit-Policy", `"p";q=100000;w=60`},
	{"RateLimit", `"p";r=99999;t=60`},
	{"X-RateLimit-Limit", "100000"},
	{"X-RateLimit-Remaining", "99999"},
	{"X-RateLimit-Reset", "60"},
}

// serveN serves n requests through h, each keyed by X-Key over 100k keys,
// into one recorder: the same setup for the middleware and its floor.
func serveN(n int, h http.Handler) {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	for i := 0; i < n; i++ {
		r := req.Clone(req.Context())
		r.Header = http.Header{"X-Key": {benchKeys[i%len(benchKeys)]}}
		clear(w.Header())
		h.ServeHTTP(w, r)
	}
}

// BenchmarkVsFloor measures the middleware (one policy of 100,000 a
// minute per X-Key, sliding_counter, on the memory store, allowed
// requests) and its floor, a handler that sets the same five headers, in
// the same run: alternating rounds of 200,000 requests, the best of five
// counting for each, allocations by testing.AllocsPerRun. It prints `vs
// header-floor httplimit <factor>` (floor ns / middleware ns: 1 would be
// the floor itself) with the difference per request. make bench runs it.
func BenchmarkVsFloor(b *testing.B) {
	if b.N > 1 {
		return // measured once, at b.N == 1, by its own rounds
	}
	p := core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: 100_000, Window: time.Minute, Algorithm: algo.SlidingCounter})
	mw, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, memory.MustNew(memory.Options{})), Key: Header("X-Key")}}})
	if err != nil {
		b.Fatal(err)
	}
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	contenders := []http.Handler{
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for _, h := range floorHeaders {
				w.Header().Set(h[0], h[1])
			}
			next(w, r)
		}),
		mw(next),
	}
	const n = 200_000
	best := [2]float64{math.MaxFloat64, math.MaxFloat64}
	for round := 0; round < 5; round++ {
		for i, h := range contenders {
			began := time.Now()
			serveN(n, h)
			best[i] = min(best[i], float64(time.Since(began).Nanoseconds())/n)
		}
	}
	var allocs [2]float64
	for i, h := range contenders {
		allocs[i] = testing.AllocsPerRun(5, func() { serveN(10_000, h) }) / 10_000
	}
	fmt.Printf("floor    %.0f ns/op %.1f allocs/op\nhttplimit %.0f ns/op %.1f allocs/op\n", best[0], allocs[0], best[1], allocs[1])
	fmt.Printf("vs header-floor httplimit %.2f (tollgate %.0f ns and %.1f allocs above the floor)\n",
		best[0]/best[1], best[1]-best[0], allocs[1]-allocs[0])
}
