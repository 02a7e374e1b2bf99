// Command rediscompare measures decisions per second on one real
// redis-server it starts on loopback: tollgate's Redis store against
// go-redis/redis_rate (GCRA) and ulule/limiter's Redis store, with 64
// concurrent callers over 10,000 keys, for one limit and for three stacked
// limits (the peers make one call per limit). It prints one line per
// comparison,
//
//	vs <peer> <workload> <factor>
//
// with factor = tollgate's decisions/s ÷ the peer's (> 1: tollgate better),
// and redis-benchmark's EVAL ops/s on the same server as the ceiling.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"
	"github.com/tollgate/tollgate/core"
	tgredis "github.com/tollgate/tollgate/core/store/redis"
	"github.com/tollgate/tollgate/internal/redistest"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

const (
	callers = 64
	keys    = 10_000
)

type decider func(ctx context.Context, key string) bool

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// rate runs decide from callers goroutines for d and returns decisions/s.
func rate(d time.Duration, decide decider) float64 {
	var done atomic.Int64
	var failed atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			ctx := context.Background()
			for i := g * 7919; time.Now().Before(stop); i++ {
				if !decide(ctx, "client-"+strconv.Itoa(i%keys)) {
					failed.Add(1)
				}
				done.Add(1)
			}
		}(g)
	}
	wg.Wait()
	if failed.Load() > 0 {
		fmt.Fprintf(os.Stderr, "warning: %d of %d decisions denied or failed\n", failed.Load(), done.Load())
	}
	return float64(done.Load()) / d.Seconds()
}

func main() {
	dur := flag.Duration("d", 3*time.Second, "duration of each measurement")
	batchFlag := flag.Int("batch", 0, "tollgate's Options.Batch (0: default pipelining, 1: one EVALSHA per decision)")
	flag.Parse()
	dir, err := os.MkdirTemp("", "tollgate-bench-")
	check(err)
	defer os.RemoveAll(dir)
	srv, err := redistest.Start(dir)
	check(err)
	defer srv.Stop()
	client := func() *goredis.Client {
		return goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: callers})
	}

	// Limits that allow every request of the run.
	one := []core.Limit{{Count: 1_000_000, Window: time.Second, Algorithm: core.GCRA, Burst: 1_000_000}}
	three := []core.Limit{
		{Count: 1_000_000, Window: time.Second, Algorithm: core.GCRA, Burst: 1_000_000},
		{Count: 100_000_000, Window: time.Minute, Algorithm: core.FixedWindow},
		{Count: 1_000_000_000, Window: time.Hour, Algorithm: core.SlidingCounter},
	}
	periods := []time.Duration{time.Second, time.Minute, time.Hour}

	batch := *batchFlag
	tollgate := func(limits []core.Limit) decider {
		s := tgredis.NewFromClient(client(), tgredis.Options{Timeout: 2 * time.Second, Batch: batch})
		p := core.MustPolicy("bench"+strconv.Itoa(len(limits)), core.PolicyOptions{}, limits...)
		return func(ctx context.Context, key string) bool {
			var d core.Decision
			return s.Decide(ctx, p, key, 1, &d) == nil && d.Allowed
		}
	}
	redisRate := func(n int) decider {
		l := redis_rate.NewLimiter(client())
		return func(ctx context.Context, key string) bool {
			for i := 0; i < n; i++ {
				res, err := l.Allow(ctx, "rr"+strconv.Itoa(i)+":"+key,
					redis_rate.Limit{Rate: 1_000_000, Burst: 1_000_000, Period: periods[i]})
				if err != nil || res.Allowed == 0 {
					return false
				}
			}
			return true
		}
	}
	ululeStore := func(n int) decider {
		store, err := ululeredis.NewStoreWithOptions(client(), ulule.StoreOptions{Prefix: "ulule", MaxRetry: 1})
		check(err)
		var ls []*ulule.Limiter
		for i := 0; i < n; i++ {
			ls = append(ls, ulule.New(store, ulule.Rate{Period: periods[i], Limit: 1_000_000_000}))
		}
		return func(ctx context.Context, key string) bool {
			for i, l := range ls {
				c, err := l.Get(ctx, strconv.Itoa(i)+":"+key)
				if err != nil || c.Reached {
					return false
				}
			}
			return true
		}
	}

	fmt.Printf("redis-server %s, %d callers, %d keys, %v per measurement\n\n", srv.Addr, callers, keys, *dur)
	fmt.Printf("%-18s %-22s %14s\n", "workload", "limiter", "decisions/s")
	var lines []string
	for _, w := range []struct {
		name   string
		limits []core.Limit
	}{{"1-limit", one}, {"3-stacked-limits", three}} {
		n := len(w.limits)
		ours := rate(*dur, tollgate(w.limits))
		fmt.Printf("%-18s %-22s %14.0f\n", w.name, "tollgate", ours)
		for _, peer := range []struct {
			name string
			d    decider
		}{{"redis_rate", redisRate(n)}, {"ulule/limiter", ululeStore(n)}} {
			theirs := rate(*dur, peer.d)
			fmt.Printf("%-18s %-22s %14.0f\n", w.name, peer.name, theirs)
			lines = append(lines, fmt.Sprintf("vs %s %s %.2f", peer.name, w.name, ours/theirs))
		}
	}
	if ceiling, err := evalCeiling(srv.Port); err == nil {
		fmt.Printf("\nceiling: redis-benchmark EVAL \"return 1\" 0: %s ops/s\n", ceiling)
	} else {
		fmt.Printf("\nceiling: redis-benchmark unavailable: %v\n", err)
	}
	fmt.Println()
	for _, l := range lines {
		fmt.Println(l)
	}
}

// evalCeiling runs redis-benchmark's EVAL of an empty script with the same
// number of clients and returns its ops/s.
func evalCeiling(port int) (string, error) {
	out, err := exec.Command("redis-benchmark", "-p", strconv.Itoa(port), "-c", strconv.Itoa(callers),
		"-n", "200000", "-q", "eval", "return 1", "0").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	// The last line reads "<command>: <ops> requests per second, p50=...".
	text := strings.ReplaceAll(string(out), "\r", "\n")
	if i := strings.LastIndex(text, " requests per second"); i >= 0 {
		fields := strings.Fields(text[:i])
		return fields[len(fields)-1], nil
	}
	return "", fmt.Errorf("no figure in %q", out)
}
