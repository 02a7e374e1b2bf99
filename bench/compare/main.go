// Command compare measures tollgate's memory store against other Go rate
// limiters on the same workloads in one run, prints a table, and one line
// per comparison:
//
//	vs <peer> <workload> <factor>
//
// where factor is the peer's ns/op divided by tollgate's (> 1: tollgate is
// faster). Each peer runs against tollgate's algorithm closest to its own.
// It lives in its own module so the main module does not depend on peers.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	throttledmem "github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/memory"
)

// huge keeps every decision on the allow path, as in a healthy gateway.
const huge = 1_000_000_000

// decider decides one request for key; each peer and tollgate provide one.
// d is the calling goroutine's own Decision, for tollgate to decide into
// (as a gateway gives each request in flight one); the peers, which
// return their verdicts, do not use it.
type decider func(key string, d *core.Decision) bool

type peer struct {
	name      string
	algorithm algo.Algorithm // tollgate's closest algorithm
	make      func(keys int) decider
}

var peers = []peer{
	{"x/time/rate", algo.TokenBucket, func(int) decider {
		var mu sync.Mutex
		m := map[string]*rate.Limiter{}
		return func(key string, _ *core.Decision) bool {
			mu.Lock()
			l := m[key]
			if l == nil {
				l = rate.NewLimiter(huge, huge)
				m[key] = l
			}
			mu.Unlock()
			return l.Allow()
		}
	}},
	{"sethvargo/go-limiter", algo.TokenBucket, func(int) decider {
		s, err := memorystore.New(&memorystore.Config{Tokens: huge, Interval: time.Second, SweepInterval: time.Hour})
		check(err)
		ctx := context.Background()
		return func(key string, _ *core.Decision) bool {
			_, _, _, ok, _ := s.Take(ctx, key)
			return ok
		}
	}},
	{"ulule/limiter", algo.FixedWindow, func(int) decider {
		l := ulule.New(ululemem.NewStore(), ulule.Rate{Period: time.Second, Limit: huge})
		ctx := context.Background()
		return func(key string, _ *core.Decision) bool {
			c, err := l.Get(ctx, key)
			return err == nil && !c.Reached
		}
	}},
	{"throttled", algo.GCRA, func(keys int) decider {
		s, err := throttledmem.NewCtx(2 * keys)
		check(err)
		rl, err := throttled.NewGCRARateLimiterCtx(s, throttled.RateQuota{MaxRate: throttled.PerSec(huge), MaxBurst: huge})
		check(err)
		ctx := context.Background()
		return func(key string, _ *core.Decision) bool {
			limited, _, _ := rl.RateLimitCtx(ctx, key, 1)
			return !limited
		}
	}},
}

// floorName is the floor every limiter stands on: per decision, read the
// monotonic clock and write one key's state in a mutex-guarded map, with
// no algorithm at all. It is measured with the others, not as a peer.
const floorName = "floor(clock+map+mutex)"

func floor(int) decider {
	var mu sync.Mutex
	m := map[string]*int64{}
	start := time.Now()
	return func(key string, _ *core.Decision) bool {
		now := int64(time.Since(start))
		mu.Lock()
		s := m[key]
		if s == nil {
			s = new(int64)
			m[key] = s
		}
		*s = now
		mu.Unlock()
		return true
	}
}

func tollgate(a algo.Algorithm) func(keys int) decider { return tollgateWith(allowAll(a)) }

// stackedName is tollgate deciding two stacked limits (a token bucket
// under a fixed window), measured in instructions only.
const stackedName = "tollgate-2-stacked"

var tollgateStacked = tollgateWith(allowAll(algo.TokenBucket), allowAll(algo.FixedWindow))

// tollgateWith is tollgate's memory store deciding a policy of limits.
func tollgateWith(limits ...algo.Limit) func(keys int) decider {
	return func(keys int) decider {
		store := memory.MustNew(memory.Options{MaxKeys: 2 * keys})
		p := core.MustPolicy("bench", core.PolicyOptions{}, limits...)
		ctx := context.Background()
		// Into the goroutine's Decision, never zeroed in between: Decide
		// writes every field a reader sees (the gate's pooled decisions
		// are reused so too).
		return func(key string, d *core.Decision) bool {
			_ = store.Decide(ctx, p, key, 1, d)
			return d.Allowed
		}
	}
}

// allowAll returns a limit of algorithm a that allows every request of the
// workloads and keeps every key's state alive through the run.
func allowAll(a algo.Algorithm) algo.Limit {
	switch a {
	case algo.TokenBucket, algo.GCRA:
		return algo.Limit{Count: 1_000_000, Window: time.Second, Algorithm: a, Burst: 2_000_000_000}
	}
	return algo.Limit{Count: huge, Window: time.Hour, Algorithm: a}
}

type workload struct {
	name     string
	keys     int
	parallel bool
}

var workloads = []workload{
	{"serial-1key", 1, false},
	{"parallel-1key", 1, true},
	{"parallel-100k-keys", 100_000, true},
}

func keyNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = "10." + strconv.Itoa(i>>16) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
	}
	return names
}

// rounds is how many times each limiter is measured, alternating with the
// others, each time on a freshly built and warmed store; the median is kept.
// Fresh stores matter: on a virtual machine a workload bound by cache and TLB
// misses runs in a fast or a slow mode depending on where memory landed.
const rounds = 5

// limiter is one contender of a workload.
type limiter struct {
	name      string
	algorithm algo.Algorithm
	make      func(keys int) decider
}

// measureAll measures every contender on w, alternating, and returns the
// median ns/op and allocs/op of each.
func measureAll(w workload, contenders []limiter) (ns []float64, allocs []int64) {
	names := keyNames(w.keys)
	// Each store first sees the keys in another order than the one it is
	// then asked in, as a gateway's clients arrive in no order the store
	// laid their state out in.
	firstSeen := slices.Clone(names)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(firstSeen), func(i, j int) { firstSeen[i], firstSeen[j] = firstSeen[j], firstSeen[i] })
	runs := make([][]testing.BenchmarkResult, len(contenders))
	for range rounds {
		for i, c := range contenders {
			decide := c.make(w.keys)
			d := new(core.Decision)
			for _, k := range firstSeen {
				decide(k, d)
			}
			runtime.GC()
			runs[i] = append(runs[i], run(w, names, decide))
		}
	}
	for _, r := range runs {
		sort.Slice(r, func(i, j int) bool { return nsPerOp(r[i]) < nsPerOp(r[j]) })
		ns = append(ns, nsPerOp(r[rounds/2]))
		allocs = append(allocs, r[rounds/2].AllocsPerOp())
	}
	return ns, allocs
}

func run(w workload, names []string, decide decider) testing.BenchmarkResult {
	return testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		if !w.parallel {
			d := new(core.Decision)
			for i := 0; i < b.N; i++ {
				decide(names[i%len(names)], d)
			}
			return
		}
		var seed atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(seed.Add(7919))
			d := new(core.Decision)
			for pb.Next() {
				i++
				decide(names[i%len(names)], d)
			}
		})
	})
}

func nsPerOp(r testing.BenchmarkResult) float64 { return float64(r.T.Nanoseconds()) / float64(r.N) }

// bytesPerKey tracks n keys under an algorithm and reports the heap growth
// per key.
func bytesPerKey(a algo.Algorithm, n int) float64 {
	names := keyNames(n)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	store := memory.MustNew(memory.Options{MaxKeys: 2 * n})
	l := algo.Limit{Count: 100, Window: time.Minute, Algorithm: a}
	if a.HasMaxDelay() {
		l.MaxDelay = time.Second
	}
	p := core.MustPolicy("mem", core.PolicyOptions{}, l)
	var d core.Decision
	for _, k := range names {
		_ = store.Decide(context.Background(), p, k, 1, &d)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(store)
	keyBytes := 0
	for _, k := range names {
		keyBytes += len(k)
	}
	return (float64(after.HeapAlloc-before.HeapAlloc) - float64(keyBytes)) / float64(n)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	only := flag.String("workload", "", "run only the workload with this name")
	counted := flag.Bool("instructions", false, "count instructions per decision under valgrind's callgrind (serial workloads) instead of timing")
	child := flag.String("child", "", "internal: decide -n requests with this contender, for -instructions")
	n := flag.Int("n", 0, "internal: the decisions -child makes")
	testing.Init()
	flag.Parse()
	if *child != "" {
		runChild(*child, *only, *n)
		return
	}
	if *counted {
		instructions(*only)
		return
	}
	fmt.Printf("GOMAXPROCS=%d %s\n\n", runtime.GOMAXPROCS(0), runtime.Version())
	fmt.Printf("%-22s %-22s %-16s %10s %10s\n", "workload", "limiter", "algorithm", "ns/op", "allocs/op")
	var lines []string
	for _, w := range workloads {
		if *only != "" && w.name != *only {
			continue
		}
		var contenders []limiter
		for _, a := range []algo.Algorithm{algo.TokenBucket, algo.FixedWindow, algo.GCRA, algo.SlidingCounter} {
			contenders = append(contenders, limiter{"tollgate", a, tollgate(a)})
		}
		ourCount := len(contenders)
		for _, p := range peers {
			contenders = append(contenders, limiter(p))
		}
		if !w.parallel { // in parallel its one lock is no floor: tollgate locks per key
			contenders = append(contenders, limiter{floorName, 0, floor})
		}
		ns, allocs := measureAll(w, contenders)
		ours := map[algo.Algorithm]float64{}
		slowest, fastest, fastestName := 0.0, 0.0, ""
		for i, c := range contenders {
			alg := c.algorithm.String()
			if c.name == floorName {
				alg = "-"
			}
			fmt.Printf("%-22s %-22s %-16s %10.1f %10d\n", w.name, c.name, alg, ns[i], allocs[i])
			if i < ourCount {
				ours[c.algorithm] = ns[i]
				slowest = max(slowest, ns[i])
				continue
			}
			if c.name == floorName {
				// What 1.3× the fastest peer would leave above the floor.
				lines = append(lines, fmt.Sprintf("vs %s %s-token_bucket %.2f (tollgate %.0f ns above the floor; 1.3x the fastest peer would leave %.0f ns above it)",
					floorName, w.name, ns[i]/ours[algo.TokenBucket], ours[algo.TokenBucket]-ns[i], fastest/1.3-ns[i]))
				continue
			}
			lines = append(lines, fmt.Sprintf("vs %s %s %.2f", c.name, w.name, ns[i]/ours[c.algorithm]))
			if fastest == 0 || ns[i] < fastest {
				fastest, fastestName = ns[i], c.name
			}
		}
		lines = append(lines, fmt.Sprintf("vs fastest-peer(%s) %s-slowest-tollgate-algorithm %.2f", fastestName, w.name, fastest/slowest))
	}
	fmt.Println()
	fmt.Println("memory per tracked key (1 limit, 1M keys, heap growth less the key bytes):")
	for _, a := range []algo.Algorithm{algo.FixedWindow, algo.SlidingCounter, algo.TokenBucket, algo.GCRA, algo.LeakyBucket} {
		fmt.Printf("  %-16s %6.0f B\n", a, bytesPerKey(a, 1_000_000))
	}
	fmt.Println()
	for _, l := range lines {
		fmt.Println(l)
	}
}
