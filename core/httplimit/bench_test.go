package httplimit

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/internal/benchkeys"
)

// benchKeys are 100k distinct X-Key values, and firstSeen the same
// in another order: the benchmarks show the store each key first in
// firstSeen's order and then ask in benchKeys', as a gateway's clients
// arrive in no order the store laid their state out in.
var benchKeys, firstSeen = benchkeys.Orders(100_000)

// floorHeaders are the five headers the middleware sends an allowed
// request of floorAndMiddleware's policy (100,000 a minute; its default
// style, both), of the same sizes: what a handler that only sets them
// writes.
var floorHeaders = benchkeys.NewHeaderFloor(100_000, 60)

// serveN serves n requests through h, each keyed by X-Key over keys in
// turn, into one recorder: the same setup for the middleware and its
// floor.
func serveN(n int, h http.Handler, keys []string) {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	for i := 0; i < n; i++ {
		r := req.Clone(req.Context())
		r.Header = http.Header{"X-Key": {keys[i%len(keys)]}}
		clear(w.Header())
		h.ServeHTTP(w, r)
	}
}

// BenchmarkVsFloor measures the middleware (one policy of 100,000 a
// minute per X-Key, sliding_counter, on the memory store, allowed
// requests) and two floors in the same run: 30 rounds of 20,000 requests
// that alternate them (benchkeys.Interleaved; the medians of the rounds'
// differences and ratios count), allocations by testing.AllocsPerRun;
// for 1,000 keys, whose states stay in the CPU's caches, and for 100,000
// asked in random order, where reaching a key's state misses them. The
// header floor is a handler that sets the same five headers; the state
// floor also reaches each key's state
// (benchkeys.StateFloor: the memory latency any limiter in memory pays,
// without its pipeline). It prints `vs header-floor httplimit-<n>-keys
// <factor>` and `vs state-floor httplimit-<n>-keys <factor>` (floor ns /
// middleware ns, the rounds' median: 1 would be the floor itself) with
// the median difference per request and its quartiles over the rounds
// (benchkeys.PrintVsFloors). make bench runs it.
func BenchmarkVsFloor(b *testing.B) {
	if b.N > 1 {
		return // measured once, at b.N == 1, by its own rounds
	}
	for _, set := range benchkeys.Sets() {
		floor, middleware := floorAndMiddleware(b, set.FirstSeen)
		state := benchkeys.NewStateFloor(len(set.Asked))
		contenders := []http.Handler{floor, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			state.Touch(r.Header.Get("X-Key"))
			floor.ServeHTTP(w, r)
		}), middleware}
		ns := benchkeys.Interleaved(len(contenders), benchkeys.FloorRounds, benchkeys.FloorRoundRequests, func(i, n int) { serveN(n, contenders[i], set.Asked) })
		var allocs [3]float64
		for i, h := range contenders {
			allocs[i] = testing.AllocsPerRun(5, func() { serveN(10_000, h, set.Asked) }) / 10_000
		}
		benchkeys.PrintVsFloors(set.Name, "httplimit", "httplimit-"+set.Name+"-keys", ns, allocs)
	}
}

// floorAndMiddleware returns the header floor (a handler that sets
// floorHeaders) and the middleware (one policy of 100,000 a minute per
// X-Key, sliding_counter, memory store) before the same empty handler,
// the middleware having seen every key once, in firstSeen's order.
func floorAndMiddleware(b *testing.B, firstSeen []string) (floor, middleware http.Handler) {
	p := core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: 100_000, Window: time.Minute, Algorithm: algo.SlidingCounter})
	mw, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, memory.MustNew(memory.Options{})), Key: Header("X-Key")}}})
	if err != nil {
		b.Fatal(err)
	}
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	floor = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		floorHeaders.Set(w.Header())
		next(w, r)
	})
	middleware = mw(next)
	serveN(len(firstSeen), middleware, firstSeen)
	return floor, middleware
}

// BenchmarkVsFloorHTTP measures the middleware and its floor (as
// BenchmarkVsFloor) over real HTTP: each behind its own net/http server
// on loopback, 16 keep-alive clients in this process sending GETs keyed
// over the 100k keys, in 15 alternating rounds of 30,000 requests each
// (each round starting with the other contender). It prints each round's
// ratio and `vs header-floor httplimit-http <factor>`, the median of the
// rounds' ratios (the middleware's requests/s ÷ the floor's: 1 is the
// floor itself). The clients share the machine with the servers, so a
// ratio compares CPU per request on both sides. make bench runs it.
func BenchmarkVsFloorHTTP(b *testing.B) {
	if b.N > 1 {
		return // measured once, at b.N == 1, by its own rounds
	}
	floor, middleware := floorAndMiddleware(b, firstSeen)
	contenders := []http.Handler{floor, middleware}
	const clients, perRound, rounds = 16, 30_000, 15
	urls := make([]string, len(contenders))
	for i, h := range contenders {
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		urls[i] = srv.URL
	}
	transport := &http.Transport{MaxIdleConnsPerHost: clients}
	b.Cleanup(transport.CloseIdleConnections)
	client := &http.Client{Transport: transport}
	// serve sends perRound requests to url from clients goroutines and
	// returns the requests per second.
	serve := func(url string) float64 {
		var next atomic.Int64
		var wg sync.WaitGroup
		began := time.Now()
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > perRound {
						return
					}
					req, _ := http.NewRequest(http.MethodGet, url, nil)
					req.Header.Set("X-Key", benchKeys[int(i)%len(benchKeys)])
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			}()
		}
		wg.Wait()
		return perRound / time.Since(began).Seconds()
	}
	serve(urls[0]) // opens the connections
	serve(urls[1])
	ratios := make([]float64, rounds)
	turns := make([]string, rounds)
	for r := range rounds {
		var rps [2]float64
		for k := range 2 {
			i := (r + k) % 2
			rps[i] = serve(urls[i])
		}
		ratios[r] = rps[1] / rps[0]
		turns[r] = fmt.Sprintf("%.2f", ratios[r])
	}
	fmt.Printf("httplimit ÷ floor over HTTP by round: %s\n", strings.Join(turns, " "))
	slices.Sort(ratios)
	fmt.Printf("vs header-floor httplimit-http %.2f\n", ratios[rounds/2])
}
