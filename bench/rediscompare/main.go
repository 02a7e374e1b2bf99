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
// p99 latency ratios (the peer's ÷ tollgate's), and tollgate against the
// pipelined ceiling: redis-benchmark -P 16 running the same FCALL. Beside
// each figure, redis-server's CPU time per decision (from /proc). The
// limiters of a workload take turns (-rounds), so the machine's slow spells
// fall on each alike, and a factor against a peer is the median over the
// rounds of the two limiters' ratio in the same round: a slow spell that
// falls on one limiter's turn moves one round's ratio, not the factor.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	tgredis "github.com/tollgate/tollgate/core/store/redis"
	"github.com/tollgate/tollgate/internal/redistest"
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

// result is one measurement: decisions/s, the 99th percentile of one
// decision's latency, and redis-server's CPU time per decision.
type result struct {
	rps      float64
	p99      time.Duration
	redisCPU time.Duration
}

// cpuTime is process pid's user and system CPU time so far (Linux /proc;
// 0 elsewhere).
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th, in clock ticks (100 per second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	user, _ := strconv.ParseInt(f[11], 10, 64)
	sys, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(user+sys) * 10 * time.Millisecond
}

// redisPid is the measured redis-server's process id.
var redisPid int

// tally is one limiter's measurement so far: every decision's latency,
// the time spent, redis-server's CPU time spent.
type tally struct {
	took          []time.Duration
	spent, cpu    time.Duration
	failed, total int64
	rates         []float64 // decisions/s in each turn
}

// turnRatios is a's rate over b's in each turn.
func turnRatios(a, b *tally) []float64 {
	ratios := make([]float64, len(a.rates))
	for r := range ratios {
		ratios[r] = a.rates[r] / b.rates[r]
	}
	return ratios
}

// medianRatio is the median of turnRatios(a, b).
func medianRatio(a, b *tally) float64 {
	ratios := turnRatios(a, b)
	slices.Sort(ratios)
	return ratios[len(ratios)/2]
}

// result is what the tally measured.
func (t *tally) result() result {
	if t.failed > 0 {
		fmt.Fprintf(os.Stderr, "warning: %d of %d decisions denied or failed\n", t.failed, t.total)
	}
	slices.Sort(t.took)
	return result{float64(len(t.took)) / t.spent.Seconds(), t.took[len(t.took)*99/100],
		t.cpu / time.Duration(max(len(t.took), 1))}
}

// rate runs decide from callers goroutines for d, adding to t.
func (t *tally) rate(d time.Duration, decide decider) {
	cpuBefore := cpuTime(redisPid)
	var done atomic.Int64
	var failed atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	took := make([][]time.Duration, callers)
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			ctx := context.Background()
			for i := g * 7919; ; i++ {
				began := time.Now()
				if began.After(stop) {
					return
				}
				if !decide(ctx, "client-"+strconv.Itoa(i%keys)) {
					failed.Add(1)
				}
				took[g] = append(took[g], time.Since(began))
				done.Add(1)
			}
		}(g)
	}
	wg.Wait()
	t.took = append(t.took, slices.Concat(took...)...)
	t.spent += d
	t.cpu += cpuTime(redisPid) - cpuBefore
	t.failed += failed.Load()
	t.total += done.Load()
	t.rates = append(t.rates, float64(done.Load())/d.Seconds())
}

func main() {
	dur := flag.Duration("d", 5*time.Second, "duration of each measurement")
	rounds := flag.Int("rounds", 5, "turns the limiters take, each d/rounds long")
	batchFlag := flag.Int("batch", 0, "tollgate's Options.Batch (0: default pipelining, 1: one call per decision)")
	flag.Parse()
	dir, err := os.MkdirTemp("", "tollgate-bench-")
	check(err)
	defer os.RemoveAll(dir)
	srv, err := redistest.Start(dir)
	check(err)
	defer srv.Stop()
	redisPid = srv.Pid()
	client := func() *goredis.Client {
		return goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: callers})
	}

	// Limits that allow every request of the run.
	one := []algo.Limit{{Count: 1_000_000, Window: time.Second, Algorithm: algo.GCRA, Burst: 1_000_000}}
	three := []algo.Limit{
		{Count: 1_000_000, Window: time.Second, Algorithm: algo.GCRA, Burst: 1_000_000},
		{Count: 100_000_000, Window: time.Minute, Algorithm: algo.FixedWindow},
		{Count: 1_000_000_000, Window: time.Hour, Algorithm: algo.SlidingCounter},
	}
	periods := []time.Duration{time.Second, time.Minute, time.Hour}

	batch := *batchFlag
	tollgate := func(limits []algo.Limit) (decider, *tgredis.Store, *core.Policy) {
		s := tgredis.NewFromClient(client(), tgredis.Options{Settings: tgredis.Settings{Timeout: algo.Duration(2 * time.Second)}, Batch: batch})
		p := core.MustPolicy("bench"+strconv.Itoa(len(limits)), core.PolicyOptions{}, limits...)
		return func(ctx context.Context, key string) bool {
			var d core.Decision
			return s.Decide(ctx, p, key, 1, &d) == nil && d.Allowed
		}, s, p
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
	fmt.Printf("%-18s %-32s %14s %10s %24s\n", "workload", "limiter", "decisions/s", "p99", "Redis CPU per decision")
	show := func(workload, name string, r result) {
		cpu := "-"
		if r.redisCPU > 0 {
			cpu = fmt.Sprintf("%.1fµs", float64(r.redisCPU)/float64(time.Microsecond))
		}
		fmt.Printf("%-18s %-32s %14.0f %10s %24s\n", workload, name, r.rps, r.p99.Round(10*time.Microsecond), cpu)
	}
	var lines []string
	for _, w := range []struct {
		name   string
		limits []algo.Limit
	}{{"1-limit", one}, {"3-stacked-limits", three}} {
		n := len(w.limits)
		decide, store, policy := tollgate(w.limits)
		limiters := []struct {
			name string
			d    decider
		}{{"tollgate", decide}, {"redis_rate", redisRate(n)}, {"ulule/limiter", ululeStore(n)}}
		// The limiters take turns, a slice of the measurement each, so a
		// slow spell of a shared machine falls on all of them alike.
		tallies := make([]tally, len(limiters))
		for r := 0; r < *rounds; r++ {
			for i, l := range limiters {
				tallies[i].rate(*dur/time.Duration(*rounds), l.d)
			}
		}
		ours := tallies[0].result()
		show(w.name, "tollgate", ours)
		for i, peer := range limiters[1:] {
			theirs := tallies[1+i].result()
			show(w.name, peer.name, theirs)
			var turns []string
			for _, q := range turnRatios(&tallies[0], &tallies[1+i]) {
				turns = append(turns, fmt.Sprintf("%.2f", q))
			}
			fmt.Printf("%-18s %-32s %s\n", w.name, "  tollgate ÷ it, turn by turn", strings.Join(turns, " "))
			lines = append(lines, fmt.Sprintf("vs %s %s %.2f", peer.name, w.name, medianRatio(&tallies[0], &tallies[1+i])),
				fmt.Sprintf("vs %s %s-p99 %.2f", peer.name, w.name, float64(theirs.p99)/float64(ours.p99)))
		}
		// The floor: redis-benchmark pipelining 16 FCALLs of the same
		// function, keys and arguments on the same server.
		ceiling, err := pipelinedCeiling(srv.Port, store, policy)
		if err != nil {
			fmt.Printf("%-18s ceiling unavailable: %v\n", w.name, err)
			continue
		}
		show(w.name, "redis-benchmark -P16 FCALL", result{rps: ceiling})
		lines = append(lines, fmt.Sprintf("vs pipelined-ceiling %s %.2f", w.name, ours.rps/ceiling))
	}
	fmt.Println()
	for _, l := range lines {
		fmt.Println(l)
	}
}

// pipelinedCeiling loads the decide library and runs redis-benchmark with
// 64 clients pipelining 16 FCALLs each of its function, with the keys and
// arguments tollgate's store sends for p over 10,000 keys, and returns its
// ops/s.
func pipelinedCeiling(port int, s *tgredis.Store, p *core.Policy) (float64, error) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	defer c.Close()
	if err := c.FunctionLoad(context.Background(), tgredis.DecideLibrary).Err(); err != nil && !strings.Contains(err.Error(), "already exists") {
		return 0, err
	}
	keyList, args := s.DecideCommand(p, "client-__rand_int__", 1)
	cmd := []string{"-p", strconv.Itoa(port), "-c", strconv.Itoa(callers), "-P", "16", "-n", "1000000", "-r", strconv.Itoa(keys),
		"-q", "fcall", tgredis.DecideFunction, strconv.Itoa(len(keyList))}
	cmd = append(cmd, keyList...)
	for _, a := range args {
		cmd = append(cmd, fmt.Sprint(a))
	}
	out, err := exec.Command("redis-benchmark", cmd...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, out)
	}
	// The last line reads "<command>: <ops> requests per second, p50=...".
	text := strings.ReplaceAll(string(out), "\r", "\n")
	if i := strings.LastIndex(text, " requests per second"); i >= 0 {
		fields := strings.Fields(text[:i])
		return strconv.ParseFloat(fields[len(fields)-1], 64)
	}
	return 0, fmt.Errorf("no figure in %q", out)
}
