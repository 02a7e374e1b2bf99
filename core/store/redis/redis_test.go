package redis

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/core/store/redis/denycache"
	"github.com/tollgate/tollgate/core/store/storetest"
	"github.com/tollgate/tollgate/internal/redistest"
)

var (
	standalone *redistest.Server
	cluster    *redistest.Cluster
)

func TestMain(m *testing.M) {
	os.Exit(redistest.Main(m, &standalone, &cluster))
}

// newStore returns a store on a fresh key prefix, so tests never share state.
func newStore(t *testing.T, opts Options) *Store {
	t.Helper()
	opts.Prefix = fmt.Sprintf("t%d:%s:", time.Now().UnixNano(), t.Name())
	switch { // TOLLGATE_REDIS_ACL: the least-privilege user
	case len(opts.Addrs) == 1 && opts.Addrs[0] == standalone.Addr || opts.Master != "":
		opts.Username, opts.Password = standalone.User, standalone.Password
	case opts.Cluster && len(opts.Addrs) > 0 && opts.Addrs[0] == cluster.Addrs()[0]:
		opts.Username, opts.Password = cluster.User, cluster.Password
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// adminClient is a client of the standalone server as its default user,
// for what a test inspects beyond tollgate's own commands.
func adminClient(t *testing.T) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: standalone.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// adminCluster is adminClient's Cluster twin.
func adminCluster(t *testing.T) *goredis.ClusterClient {
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConformanceUnbatched(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		return newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}, Batch: 1, Clock: clock})
	})
}

func TestConformanceURL(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		return newStore(t, Options{Settings: Settings{URL: "redis://" + standalone.Addr + "/3"}, Clock: clock})
	})
}

// With the server's TIME, decisions match the memory store's when both see
// the same requests (time moves too little between them to matter for a
// one-hour window).
func TestServerTimeAgreesWithMemory(t *testing.T) {
	p := core.MustPolicy("time", core.PolicyOptions{}, algo.Limit{Count: 5, Window: time.Hour, Algorithm: algo.SlidingLog},
		algo.Limit{Count: 7, Window: time.Hour, Algorithm: algo.FixedWindow})
	rs := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	ms := memory.MustNew(memory.Options{})
	for i := 0; i < 8; i++ {
		var a, b core.Decision
		if err := rs.Decide(context.Background(), p, "k", 1, &a); err != nil {
			t.Fatal(err)
		}
		_ = ms.Decide(context.Background(), p, "k", 1, &b)
		if a.Allowed != b.Allowed || a.Remaining != b.Remaining || a.Index != b.Index {
			t.Fatalf("request %d: redis %+v, memory %+v", i, a, b)
		}
	}
}

// 8 gateway nodes (separate clients) × 64 goroutines on one key: counted
// from the clients' side, never more than N allowed per window.
func TestManyNodesShareOneExactLimit(t *testing.T) {
	for _, c := range []struct {
		limit  algo.Limit
		maxPer func(elapsed time.Duration) int64
	}{
		{algo.Limit{Count: 100, Window: time.Hour, Algorithm: algo.SlidingLog}, func(time.Duration) int64 { return 100 }},
		{algo.Limit{Count: 100, Window: time.Hour, Algorithm: algo.FixedWindow}, func(time.Duration) int64 { return 100 }},
		{algo.Limit{Count: 10, Window: time.Second, Algorithm: algo.TokenBucket, Burst: 50},
			func(el time.Duration) int64 { return 50 + int64(10*el.Seconds()) + 1 }},
	} {
		t.Run(c.limit.Algorithm.String(), func(t *testing.T) {
			p := core.MustPolicy("shared", core.PolicyOptions{}, c.limit)
			prefix := fmt.Sprintf("shared%d:", time.Now().UnixNano())
			var allowed atomic.Int64
			start := time.Now()
			hammer(t, prefix, func(d *core.Decision, s *Store, i int) bool {
				if d.Allowed {
					allowed.Add(1)
				}
				return i < 9
			}, p)
			if got, max := allowed.Load(), c.maxPer(time.Since(start)); got > max || got < c.limit.Count/2 {
				t.Fatalf("allowed %d of 5120, bound %d", got, max)
			}
			t.Logf("%v: allowed %d of 5120 in %v", c.limit.Algorithm, allowed.Load(), time.Since(start))
		})
	}
}

// The exact scenario: 8 nodes × 64 goroutines on one key under
// sliding_log 100/1s for 2.5s. Every allowed request's server time is
// recorded; no window (t-1s, t] holds more than 100 of them.
func TestManyNodesSlidingLogPerWindow(t *testing.T) {
	p := core.MustPolicy("perwindow", core.PolicyOptions{}, algo.Limit{Count: 100, Window: time.Second, Algorithm: algo.SlidingLog})
	prefix := fmt.Sprintf("pw%d:", time.Now().UnixNano())
	var mu sync.Mutex
	var times []int64
	stop := time.Now().Add(2500 * time.Millisecond)
	hammer(t, prefix, func(d *core.Decision, s *Store, i int) bool {
		if d.Allowed {
			mu.Lock()
			times = append(times, d.At)
			mu.Unlock()
		}
		time.Sleep(time.Millisecond)
		return time.Now().Before(stop)
	}, p)
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	worst := 0
	for i, j := 0, 0; i < len(times); i++ {
		for times[j] <= times[i]-1_000_000 {
			j++
		}
		worst = max(worst, i-j+1)
	}
	t.Logf("%d allowed in 2.5s; the busiest 1s window held %d (limit 100)", len(times), worst)
	if worst > 100 || len(times) < 200 {
		t.Fatalf("busiest window %d (limit 100), %d allowed in all", worst, len(times))
	}
}

// hammer runs 8 gateway nodes (separate stores and clients on one Redis,
// half without the deny cache) × 64 goroutines deciding key "hot" under p;
// each goroutine calls seen after every decision until it returns false.
func hammer(t *testing.T, prefix string, seen func(d *core.Decision, s *Store, i int) bool, p *core.Policy) {
	t.Helper()
	var wg sync.WaitGroup
	for node := 0; node < 8; node++ {
		// The test is about exactness, not latency: a generous timeout, so a
		// loaded machine's slow round trips are not failures.
		s, err := New(Options{Settings: Settings{Addrs: []string{standalone.Addr}, Prefix: prefix, PoolSize: 16, Timeout: algo.Duration(10 * time.Second)}, NoDenyCache: node%2 == 0})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for g := 0; g < 64; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d core.Decision
				for i := 0; ; i++ {
					if err := s.Decide(context.Background(), p, "hot", 1, &d); err != nil {
						t.Error(err)
						return
					}
					if !seen(&d, s, i) {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
}

func TestKeysShareAClusterSlot(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: cluster.Addrs()}, Cluster: true})
	admin := adminCluster(t)
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second},
		algo.Limit{Count: 2, Window: time.Minute}, algo.Limit{Count: 3, Window: time.Hour, Algorithm: algo.SlidingLog})
	keys := s.Keys(p, "client}{weird")
	for _, k := range keys {
		// The whole key is the hash tag: its "}" is escaped.
		if !strings.HasPrefix(k, s.prefix+"{api:client%7D{weird}") {
			t.Fatalf("key %q", k)
		}
	}
	var d core.Decision
	if err := s.Decide(context.Background(), p, "client}{weird", 1, &d); err != nil || !d.Allowed {
		t.Fatalf("decide on the cluster: %v %+v", err, d)
	}
	if got := admin.Exists(context.Background(), keys[0], keys[3]).Val(); got != 2 {
		t.Fatalf("%d of the state hash and the sliding log's set exist, want 2", got)
	}
	ttl := admin.PTTL(context.Background(), keys[0]).Val()
	if ttl <= 0 || ttl > 2*time.Hour+2*time.Second {
		t.Fatalf("key TTL %v, want set and bounded by the policy's idle time", ttl)
	}
}

// Keys crafted against Cluster hash slots: a client cannot make its keys
// share a tag by putting "}" in them (an unescaped "}" would end the tag,
// so "evil}1", "evil}2", ... would all hash as "evil"), and every key of
// one client's decision stays in one slot, whatever its bytes or length.
func TestCraftedKeysCannotChooseClusterSlots(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: cluster.Addrs()}, Cluster: true})
	admin := adminCluster(t)
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 5, Window: time.Minute},
		algo.Limit{Count: 9, Window: time.Hour, Algorithm: algo.SlidingLog})
	ctx := context.Background()
	slots := map[int64]bool{}
	for i := 0; i < 64; i++ {
		slots[admin.ClusterKeySlot(ctx, s.Keys(p, "evil}"+strconv.Itoa(i))[0]).Val()] = true
	}
	if len(slots) < 32 {
		t.Fatalf("64 keys \"evil}<n>\" landed in %d slots: the client chose their slot", len(slots))
	}
	for _, key := range []string{"{}", "}{", "a}b{c}d", "%7D", "\x00\xff\n{\r}", strings.Repeat("}", 5000), strings.Repeat("k", 100_000)} {
		var d core.Decision
		if err := s.Decide(ctx, p, core.BoundKey(key), 1, &d); err != nil || !d.Allowed {
			t.Fatalf("key %.20q: %v %+v", key, err, d)
		}
		keys := s.Keys(p, core.BoundKey(key))
		slot := admin.ClusterKeySlot(ctx, keys[0]).Val()
		for _, k := range keys[1:] {
			if got := admin.ClusterKeySlot(ctx, k).Val(); got != slot {
				t.Fatalf("key %.20q: its Redis keys span slots %d and %d", key, slot, got)
			}
		}
	}
	// "%7D" and "}" are different keys: escaping keeps names apart.
	if a, b := s.Keys(p, "%7D")[0], s.Keys(p, "}")[0]; a == b {
		t.Fatalf("keys %%7D and } share the Redis key %q", a)
	}
}

func TestOptionErrorsNameFieldAndValue(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{}, "addrs: need a URL or at least one address"},
		{Options{Settings: Settings{Addrs: []string{"h:1"}, Prefix: "a{b}:"}}, `prefix: "a{b}:": braces are not allowed`},
		{Options{Settings: Settings{URL: "http://x:1"}}, `url: "http://x:1"`},
		{Options{Settings: Settings{URL: "redis://user:secret@x:1/zz"}}, `url: "redis://user:xxxxx@x:1/zz"`},
		{Options{Settings: Settings{URL: "127.0.0.1:18379"}}, `url: "127.0.0.1:18379" has no scheme: write redis://127.0.0.1:18379 (rediss:// for TLS)`},
		{Options{Settings: Settings{URL: "user:secret@x:1"}}, `url: "user:xxxxx@x:1" has no scheme: write redis://user:xxxxx@x:1`},
		{Options{Settings: Settings{Addrs: []string{"localhost"}}}, `addrs: "localhost" is not host:port`},
		{Options{Settings: Settings{Addrs: []string{"h:port"}}}, `addrs: "h:port" has port "port", not a number`},
		{Options{Settings: Settings{Addrs: []string{"h:1"}, DB: 2}, Cluster: true}, "db: 2, but Redis Cluster has only database 0"},
		{Options{Settings: Settings{Addrs: []string{"h:1"}, Master: "m"}, Cluster: true}, "choose Redis Cluster or Sentinel"},
		{Options{Settings: Settings{Addrs: []string{"h:1"}, Timeout: algo.Duration(-time.Second)}}, "timeout: -1s must not be negative"},
	} {
		_, err := New(c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.o, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

// A dead address fails within the timeout, with an error, no panic.
func TestDeadRedisFailsWithinTimeout(t *testing.T) {
	port, _ := redistest.FreePort()
	s := newStore(t, Options{Settings: Settings{Addrs: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Timeout: algo.Duration(100 * time.Millisecond)}})
	p := core.MustPolicy("dead", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second})
	start := time.Now()
	var d core.Decision
	if err := s.Decide(context.Background(), p, "k", 1, &d); err == nil {
		t.Fatal("no error from a dead Redis")
	}
	// A hang would never end; the bound leaves a loaded machine room.
	if el := time.Since(start); el > time.Second {
		t.Fatalf("took %v with a 100ms timeout", el)
	}
}

func TestDenyCacheAnswersLocallyUntilRetryAfter(t *testing.T) {
	clock := &core.ManualClock{Micros: storetest.T0}
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}, Clock: clock})
	p := core.MustPolicy("deny", core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Second, Algorithm: algo.FixedWindow})
	ctx := context.Background()
	var d core.Decision
	for i := 0; i < 3; i++ {
		if err := s.Decide(ctx, p, "k", 1, &d); err != nil {
			t.Fatal(err)
		}
	}
	if d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("third request: %+v", d)
	}
	// Forget the key in Redis: only the deny cache can still deny it.
	s.Client().Del(ctx, s.Keys(p, "k")...)
	clock.Advance(400 * time.Millisecond)
	_ = s.Decide(ctx, p, "k", 1, &d)
	if d.Allowed || d.RetryAfter != 600*time.Millisecond || s.LocalDenials() != 1 {
		t.Fatalf("within RetryAfter: allowed %v retry %v, %d local denials", d.Allowed, d.RetryAfter, s.LocalDenials())
	}
	// A request of another cost goes to Redis.
	_ = s.Decide(ctx, p, "k", 0, &d)
	if !d.Allowed || s.LocalDenials() != 1 {
		t.Fatal("a cost-0 request was answered from the cache")
	}
	clock.Advance(600 * time.Millisecond)
	_ = s.Decide(ctx, p, "k", 1, &d)
	if !d.Allowed {
		t.Fatal("still denied after RetryAfter")
	}
}

// A reset made where this node's deny cache cannot see it (another node,
// or the keys command) reaches it within denycache.Hold, however long the
// denial's Retry-After.
func TestDenyCacheHoldsAtMostItsHold(t *testing.T) {
	clock := &core.ManualClock{Micros: storetest.T0}
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}, Clock: clock})
	p := core.MustPolicy("deny-hold", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Minute, Algorithm: algo.FixedWindow})
	ctx := context.Background()
	var d core.Decision
	for i := 0; i < 2; i++ {
		if err := s.Decide(ctx, p, "k", 1, &d); err != nil {
			t.Fatal(err)
		}
	}
	if d.Allowed || d.RetryAfter != time.Minute {
		t.Fatalf("second request: %+v", d)
	}
	// The other node: the same keys, no deny cache of this one's.
	s.Client().Del(ctx, s.Keys(p, "k")...)
	clock.Advance(denycache.Hold - time.Microsecond)
	if _ = s.Decide(ctx, p, "k", 1, &d); d.Allowed || s.LocalDenials() != 1 {
		t.Fatalf("within the hold: allowed %v, %d local denials; want the cache's denial", d.Allowed, s.LocalDenials())
	}
	clock.Advance(time.Microsecond)
	if _ = s.Decide(ctx, p, "k", 1, &d); !d.Allowed {
		t.Fatalf("%v after another node's reset: still denied (retry %v)", denycache.Hold, d.RetryAfter)
	}
}

// Sentinel: the store finds the master through a real redis-sentinel.
func TestConformanceSentinel(t *testing.T) {
	sentinel, err := redistest.StartSentinel(t.TempDir(), "tollgate-master", standalone)
	if err != nil {
		t.Fatal(err)
	}
	defer sentinel.Stop()
	storetest.Run(t, func(t *testing.T, clock core.Clock) core.Store {
		return newStore(t, Options{Settings: Settings{Master: "tollgate-master", Addrs: []string{sentinel.Addr}}, Clock: clock})
	})
}

// A password-protected server: the URL's password authenticates, a wrong
// one is an error, not a panic or a hang.
func TestPasswordFromURL(t *testing.T) {
	srv, err := redistest.Start(t.TempDir(), "--requirepass", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	p := core.MustPolicy("auth", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second})
	var d core.Decision
	good := newStore(t, Options{Settings: Settings{URL: "redis://:s3cret@" + srv.Addr + "/0"}})
	if err := good.Decide(context.Background(), p, "k", 1, &d); err != nil || !d.Allowed {
		t.Fatalf("with the password: %v %+v", err, d)
	}
	bad := newStore(t, Options{Settings: Settings{URL: "redis://:wrong@" + srv.Addr + "/0"}})
	if err := bad.Decide(context.Background(), p, "k", 1, &d); err == nil {
		t.Fatal("a wrong password decided")
	}
}

// TestAdaptiveFactorSharedByNodes: three nodes judging the same intervals
// move one shared factor once per interval, and all read the same value.
func TestAdaptiveFactorSharedByNodes(t *testing.T) {
	clock := &core.ManualClock{Micros: storetest.T0}
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}, Clock: clock})
	o := adaptive.Options{Controller: adaptive.ControllerAIMD, MinFactor: 0.1, Decrease: 0.5, Increase: 0.25, Interval: 300 * time.Millisecond}
	sync := s.FactorSync("api")
	ctx := context.Background()
	var got []float64
	for node := 0; node < 3; node++ {
		f, err := sync.SyncFactor(ctx, adaptive.Signals{}, true, o)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, f)
	}
	if fmt.Sprint(got) != "[0.5 0.5 0.5]" {
		t.Fatalf("three congested nodes in one interval: %v, want one decrease to 0.5 seen by all", got)
	}
	clock.Advance(350 * time.Millisecond)
	f, _ := sync.SyncFactor(ctx, adaptive.Signals{}, false, o)
	f2, _ := sync.SyncFactor(ctx, adaptive.Signals{}, true, o)
	if f != 0.75 || f2 != 0.375 {
		t.Fatalf("next interval: healthy → %g, congested → %g; want 0.75 then 0.375 (a decrease overrides)", f, f2)
	}
}

// TestGradientFleetJudgesSums: the gradient rule judges the sum of every
// node's signals once per interval. The three nodes' signals of one
// interval (one healthy, two failing) wait; the read half an interval
// later judges them together: the fleet served 60% of what it was sent, so
// the shared factor is cut to 0.6 × 0.95, though the first node alone
// never saw a failure. A second read in the same interval changes nothing.
func TestGradientFleetJudgesSums(t *testing.T) {
	clock := &core.ManualClock{Micros: storetest.T0}
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}, Clock: clock})
	o := adaptive.Options{Controller: adaptive.ControllerGradient, MinFactor: 0.1, ErrorRate: 0.05, Tolerance: 1.5,
		Decrease: 0.95, Increase: 0.05, Interval: 500 * time.Millisecond, MinSamples: 10}
	sync := s.FactorSync("fleet")
	ctx := context.Background()
	// The unloaded latency is known (1ms), so no measurement starts.
	if err := adminClient(t).HSet(ctx, s.prefix+"{adaptive:fleet}", "m", 1000).Err(); err != nil {
		t.Fatal(err)
	}
	healthy := adaptive.Signals{Started: 100, Answered: 100, Latency: 1000}
	failing := adaptive.Signals{Started: 100, Answered: 100, Failed: 60, Latency: 1000}
	var got []float64
	for _, sig := range []adaptive.Signals{healthy, failing, failing} {
		f, err := sync.SyncFactor(ctx, sig, false, o)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, f)
	}
	clock.Advance(250 * time.Millisecond)
	for range 2 {
		f, err := sync.SyncFactor(ctx, adaptive.Signals{}, false, o)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, f)
	}
	served := 180.0 / 300
	want := fmt.Sprint([]float64{1, 1, 1, served * 0.95, served * 0.95})
	if fmt.Sprint(got) != want {
		t.Fatalf("factors %v, want %s: one judgement per interval, of the fleet's sums", got, want)
	}
}

// TestAIMDLuaTwin replays random interval traces (verdicts from several
// nodes at jittered times) through adaptive.AIMD and aimd.lua and requires the
// very same factor after every verdict.
func TestAIMDLuaTwin(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	ctx := context.Background()
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		o := adaptive.Options{MinFactor: 0.05 + rng.Float64()/4, Decrease: 0.3 + rng.Float64()*0.6,
			Increase: 0.01 + rng.Float64()/5, Interval: time.Duration(10+rng.IntN(2000)) * time.Millisecond}
		key := fmt.Sprintf("%stwin%d", s.prefix, seed)
		now := storetest.T0
		var state adaptive.AIMDState
		for step := 0; step < 200; step++ {
			now += rng.Int64N(o.Interval.Microseconds())
			congested := rng.IntN(3) == 0
			state = adaptive.AIMD(state, now, congested, o)
			got, err := runAIMD(ctx, s, key, now, congested, o)
			if err != nil {
				t.Fatal(err)
			}
			if got != state.Factor {
				t.Fatalf("seed %d step %d (congested %v): Lua %v, Go %v", seed, step, congested, got, state.Factor)
			}
		}
	}
}

// TestGradientLuaTwin replays random traces (signals from several nodes at
// jittered times, including idle and failing intervals and latency that
// climbs past the tolerance) through adaptive.Gradient and gradient.lua and
// requires the very same factor after every step, and the same whole state
// at the end of each trace.
func TestGradientLuaTwin(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	ctx := context.Background()
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		// stalls marks some nodes' signals stalled, from a stream of its
		// own so the traces are otherwise as they were.
		stalls := rand.New(rand.NewPCG(seed, 12))
		o := adaptive.Options{Controller: adaptive.ControllerGradient, MinFactor: 0.05 + rng.Float64()/4,
			ErrorRate: 0.01 + rng.Float64()/5, Tolerance: 1.1 + rng.Float64()*2, Decrease: 0.5 + rng.Float64()*0.49,
			Increase: 0.01 + rng.Float64()/5, Interval: time.Duration(10+rng.IntN(2000)) * time.Millisecond,
			MinSamples: 1 + rng.Int64N(20), Paced: seed%4 != 0}
		if rng.IntN(2) == 0 {
			o.LatencyTarget = time.Duration(1+rng.IntN(100)) * time.Millisecond
		}
		// bias: how often the upstream answers more than it was sent
		// (draining), from always (0) to seldom (39).
		bias := []int64{0, 20, 39}[seed%3]
		key := fmt.Sprintf("%sgradtwin%d", s.prefix, seed)
		now := storetest.T0
		var state adaptive.GradientState
		for step := 0; step < 300; step++ {
			now += rng.Int64N(o.Interval.Microseconds())
			started := rng.Int64N(200)
			sig := adaptive.Signals{Started: started, Denied: rng.Int64N(3) * rng.Int64N(50), Answered: max(0, started+rng.Int64N(40)-bias)}
			if rng.IntN(4) > 0 { // let through at a factor of its own, or (0) none said
				sig.Admitted = float64(started) * (0.05 + rng.Float64()*0.95)
			}
			if stalls.IntN(8) == 0 {
				sig.Stalled = 1
			}
			if rng.IntN(3) == 0 {
				sig = adaptive.Signals{} // a node's read, which judges
			}
			if sig.Answered > 0 {
				sig.Failed = rng.Int64N(sig.Answered/max(1, rng.Int64N(10)) + 1)
				sig.Failed = min(sig.Failed, sig.Answered)
				if rng.IntN(2) == 0 {
					// Clean: a judgement sums several nodes' signals, and
					// probing past the capacity needs whole clean intervals.
					sig.Failed = 0
				}
				sig.Latency = 50 + rng.Int64N(200_000)
			}
			state = adaptive.Gradient(state, now, sig, o)
			got, err := runGradient(ctx, s, key, now, sig, o)
			if err != nil {
				t.Fatal(err)
			}
			if got != state.Factor {
				t.Fatalf("seed %d step %d (%+v): Lua %v, Go %v (state %+v)", seed, step, sig, got, state.Factor, state)
			}
		}
		h, err := adminClient(t).HGetAll(ctx, key).Result() // HGETALL is the test's (TOLLGATE_REDIS_ACL)
		if err != nil {
			t.Fatal(err)
		}
		num := func(k string) float64 { v, _ := strconv.ParseFloat(h[k], 64); return v }
		lua := adaptive.GradientState{Factor: num("f"), Growth: num("g"), Ceiling: num("c"), MinLatency: int64(num("m")),
			Measuring: int64(num("ms")), Held: num("h"), Epoch: int64(num("e")), Slow: int64(num("sl")), Cut: int64(num("k")), Judged: int64(num("j")),
			Peak: num("pk"), Probed: int64(num("pr")), AfterStall: int64(num("as")), StallHeld: int64(num("sh")),
			Carried:   adaptive.Carried{Started: int64(num("cs")), Served: int64(num("cv")), Admitted: num("ca")},
			DrainSum:  adaptive.Carried{Started: int64(num("ds")), Served: int64(num("dv")), Admitted: num("da")},
			LastDrain: adaptive.Carried{Started: int64(num("ls")), Served: int64(num("lv")), Admitted: num("la")},
			Pending: adaptive.Signals{Started: int64(num("s")), Denied: int64(num("dn")), Answered: int64(num("a")), Failed: int64(num("x")), Latency: int64(num("l")),
				Admitted: num("pf"), Stalled: int64(num("st"))}}
		if lua != state {
			t.Fatalf("seed %d after its 300 steps: Lua's state %+v, Go's %+v", seed, lua, state)
		}
	}
}

// gradientDefaults are the gradient controller's default options, filled
// in as a Controller has them, at a 1 s interval: the fixed traces' and
// lying servers' options.
func gradientDefaults(paced bool) adaptive.Options {
	return adaptive.Options{Controller: adaptive.ControllerGradient, MinFactor: 0.1, ErrorRate: 0.05, Tolerance: 1.5,
		Decrease: 0.95, Increase: 0.05, Interval: time.Second, MinSamples: 10, Paced: paced}
}

// replayGradientTwins runs a fixed trace through adaptive.Gradient (from
// state) and gradient.lua (on key) alike, each interval's signals then the
// read that judges them, one interval apart, and fails unless both give
// the same factor after every interval. what names the trace in the
// failure, which starts "seed 0 (a fixed trace": the planted-bug runner
// counts such a failure as the twin test's. It returns Go's state.
func replayGradientTwins(t *testing.T, s *Store, key string, o adaptive.Options, state adaptive.GradientState, trace []adaptive.Signals, what string) adaptive.GradientState {
	t.Helper()
	ctx := context.Background()
	now := storetest.T0
	for step, sig := range trace {
		now += o.Interval.Microseconds()
		state = adaptive.Gradient(adaptive.Gradient(state, now, sig, o), now, adaptive.Signals{}, o)
		if _, err := runGradient(ctx, s, key, now, sig, o); err != nil {
			t.Fatal(err)
		}
		got, err := runGradient(ctx, s, key, now, adaptive.Signals{}, o) // the read that judges it
		if err != nil {
			t.Fatal(err)
		}
		if got != state.Factor {
			t.Fatalf("seed 0 (a fixed trace, %s) step %d: Lua %v, Go %v (state %+v)", what, step, got, state.Factor, state)
		}
	}
	return state
}

// TestGradientLuaTwinForgetsTheCeiling replays, through adaptive.Gradient and
// gradient.lua alike, probes past a known capacity that stay clean: the
// factor held once, the Ceiling forgotten, the same step once more, then
// doubling steps. The random traces seldom stay clean that long below a
// factor of 1, where growth no longer shows.
func TestGradientLuaTwinForgetsTheCeiling(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	ctx := context.Background()
	o := gradientDefaults(false)
	key := s.prefix + "gradforget"
	// A factor of 0.3 past a capacity of 0.25, the unloaded latency known.
	if err := adminClient(t).HSet(ctx, key, "f", "0.3", "c", "0.25", "m", "5000", "j", "0").Err(); err != nil {
		t.Fatal(err)
	}
	clean := adaptive.Signals{Started: 100, Answered: 100, Latency: 5000}
	state := replayGradientTwins(t, s, key, o, adaptive.GradientState{Factor: 0.3, Ceiling: 0.25, MinLatency: 5000},
		[]adaptive.Signals{clean, clean, clean, clean, clean, clean}, "clean probes past the capacity")
	if state.Ceiling != 0 || state.Factor <= 0.3*1.05*1.05 {
		t.Fatalf("after six clean probes: %+v, want the ceiling forgotten and the factor grown", state)
	}
}

// TestGradientLuaTwinRestoresAtMostTheDrainedCapacity replays, through
// adaptive.Gradient and gradient.lua alike, a measurement after a cut made
// while a rate limit did not bind: the upstream drains at its capacity
// while the limit, held at MinFactor, binds, and the factor restored is at
// most that capacity for a paced limit, the factor held for an in-flight
// one. The random traces seldom drain several intervals in a row with a
// binding limit, and never with one pacing choice only.
func TestGradientLuaTwinRestoresAtMostTheDrainedCapacity(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	for _, paced := range []bool{true, false} {
		o := gradientDefaults(paced)
		key := fmt.Sprintf("%sgraddrain%v", s.prefix, paced)
		drain := adaptive.Signals{Started: 20, Denied: 130, Answered: 50, Latency: 900_000, Admitted: 2}
		trace := []adaptive.Signals{{Started: 150, Answered: 50, Latency: 100_000, Admitted: 150}, drain, drain,
			{Started: 20, Denied: 130, Answered: 30, Latency: 600_000, Admitted: 2}, // ran dry partway
			{Started: 20, Denied: 130, Answered: 20, Latency: 150_000, Admitted: 2},
			{Started: 20, Denied: 130, Answered: 20, Latency: 100_000, Admitted: 2}}
		state := replayGradientTwins(t, s, key, o, adaptive.GradientState{}, trace, fmt.Sprintf("paced %v, a measurement draining", paced))
		if want := map[bool]float64{true: 0.25 * o.Decrease, false: 50.0 / 150 * o.Decrease}[paced]; math.Abs(state.Factor-want) > 1e-12 {
			t.Fatalf("paced %v: restored %v, want %v", paced, state.Factor, want)
		}
	}
}

// TestGradientLuaTwinCongestionNeverRaisesTheFactor replays, through both
// twins, a fleet's first cut and the congestion after the interval waited
// through, which mixed the old factor's requests (not binding) with the
// new one's: over both, the share served times the admitted factor reads
// above the factor congested, and the cut must still go down from it,
// with no Peak confirmed (adaptive.TestGradientCongestionNeverRaisesTheFactor).
func TestGradientLuaTwinCongestionNeverRaisesTheFactor(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	ctx := context.Background()
	o := gradientDefaults(true)
	key := s.prefix + "gradmixed"
	f := 50.0 / 150 * o.Decrease // the first cut's factor
	trace := []adaptive.Signals{
		{Started: 150, Answered: 150, Failed: 100, Latency: 100_000, Admitted: 150},
		{Started: 120, Answered: 120, Failed: 60, Latency: 100_000, Admitted: 80 + 40*f},
		{Started: 60, Denied: 90, Answered: 60, Failed: 9, Latency: 100_000, Admitted: 60 * f},
	}
	state := replayGradientTwins(t, s, key, o, adaptive.GradientState{}, trace, "a congestion over a mixed waited interval")
	if state.Factor != f*o.Decrease || state.Peak != 0 {
		t.Fatalf("Go: factor %v, peak %v after the congestion; want %v, 0", state.Factor, state.Peak, f*o.Decrease)
	}
	peak, err := adminClient(t).HGet(ctx, key, "pk").Float64()
	if err != nil {
		t.Fatal(err)
	}
	if peak != 0 {
		t.Fatalf("seed 0 (a fixed trace): Lua confirmed a peak of %v over a mixed waited interval, Go none", peak)
	}
}

// A state hash lives at least one idle time after its last write, and at
// most two after the write that set its expiry: a write moves the expiry
// (two idle times ahead) only when it finds less than one left, so most
// writes skip the PEXPIRE. The hash records its expiry in every state it
// holds, or, holding none (an in_flight limit's lease counter alone), in
// its expires:ms field; the in_flight path, which writes the lease
// counter, keeps the same rule.
func TestStateHashExpiryMovesOnlyWhenLessThanIdleLeft(t *testing.T) {
	for _, limits := range [][]algo.Limit{
		{{Count: 100, Window: time.Minute, Algorithm: algo.FixedWindow}},
		{{Count: 100, Window: time.Minute, Algorithm: algo.InFlight}},
		{{Count: 100, Window: time.Minute, Algorithm: algo.InFlight}, {Count: 100, Window: time.Minute, Algorithm: algo.FixedWindow}},
	} {
		t.Run(limits[0].Algorithm.String()+"-"+strconv.Itoa(len(limits)), func(t *testing.T) {
			s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
			admin := adminClient(t)
			ctx := context.Background()
			p := core.MustPolicy("expiry", core.PolicyOptions{}, limits...)
			hash := s.Keys(p, "client")[0]
			idle := time.Duration(ttlMillis(p)) * time.Millisecond
			// Where the hash records its expiry: the first state it holds,
			// or its expires:ms field.
			stateField := ""
			for i, l := range limits {
				if l.Algorithm != algo.InFlight && l.Algorithm != algo.SlidingLog {
					stateField = p.StoreSide().LimitID(i)
					break
				}
			}
			recorded := func() (state [4]float64, ms int64) {
				t.Helper()
				if stateField == "" {
					ms, err := admin.HGet(ctx, hash, "expires:ms").Int64()
					if err != nil {
						t.Fatalf("the hash's expires:ms field: %v", err)
					}
					return state, ms
				}
				v := admin.HGet(ctx, hash, stateField).Val()
				state, ok := unpackState(v)
				if !ok {
					t.Fatalf("the hash's state %q is not packed", v)
				}
				return state, int64(state[3])
			}
			decide := func() {
				t.Helper()
				var d core.Decision
				if err := s.Decide(ctx, p, "client", 1, &d); err != nil || !d.Allowed {
					t.Fatalf("decide: %v %+v", err, d)
				}
			}
			// expiry is the hash's time to live, checked against the expiry
			// it records, read as a time from the server's now (they differ
			// by the commands' ms between them, far less than 1s).
			expiry := func() time.Duration {
				t.Helper()
				ttl := admin.PTTL(ctx, hash).Val()
				now, err := admin.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				_, ms := recorded()
				if field := time.UnixMilli(ms).Sub(now); field-ttl > time.Second || ttl-field > time.Second {
					t.Fatalf("the hash lives %v, its recorded expiry says %v", ttl, field)
				}
				return ttl
			}
			// age makes the hash's expiry look set long ago: left from now.
			age := func(left time.Duration) {
				t.Helper()
				now := admin.Time(ctx).Val()
				at := now.Add(left).UnixMilli()
				if stateField == "" {
					admin.HSet(ctx, hash, "expires:ms", at)
				} else {
					state, _ := recorded()
					admin.HSet(ctx, hash, stateField, packedState(state[0], state[1], state[2], float64(at)))
				}
				admin.PExpire(ctx, hash, left)
			}

			decide()
			if ttl := expiry(); ttl < 2*idle-time.Second || ttl > 2*idle {
				t.Fatalf("a new hash lives %v, want %v", ttl, 2*idle)
			}
			// More than one idle time left: the write leaves the expiry.
			age(idle + idle/2)
			decide()
			if ttl := expiry(); ttl > idle+idle/2 {
				t.Fatalf("with 1.5 idle times left, a write moved the expiry: the hash lives %v", ttl)
			}
			// Less than one left: the write moves it two idle times ahead.
			age(idle / 2)
			decide()
			if ttl := expiry(); ttl < 2*idle-time.Second {
				t.Fatalf("with half an idle time left, a write left the expiry: the hash lives %v, want %v", ttl, 2*idle)
			}
		})
	}
}

// A lying server's count of clean probes (one the script never writes)
// cannot hold the gradient factor past the capacity: it is read as at most
// one, so the second clean interval past the capacity grows the factor.
func TestGradientProbeCountFromALyingServer(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	ctx := context.Background()
	o, key := gradientDefaults(false), s.prefix+"gradlying"
	// A factor of 0.5 past a capacity of 0.4, the unloaded latency known.
	if err := adminClient(t).HSet(ctx, key, "f", "0.5", "c", "0.4", "m", "5000", "j", "0", "pr", "-1000000").Err(); err != nil {
		t.Fatal(err)
	}
	clean := adaptive.Signals{Started: 100, Answered: 100, Latency: 5000}
	now := storetest.T0
	var f float64
	for i := range 2 {
		now += o.Interval.Microseconds()
		var err error
		if _, err = runGradient(ctx, s, key, now, clean, o); err != nil {
			t.Fatal(err)
		}
		if f, err = runGradient(ctx, s, key, now, adaptive.Signals{}, o); err != nil { // the read that judges it
			t.Fatal(err)
		}
		if want := map[bool]bool{true: f == 0.5, false: f > 0.5}[i == 0]; !want {
			t.Fatalf("clean interval %d past the capacity, %q probes stored: factor %v, want it held once, then grown", i+1, "-1000000", f)
		}
	}
}

// TestGradientDrainSumsFromALyingServer: a measurement's drain sums
// stored as nonsense (NaN, inf, negative, huge) by a lying server restore a
// factor between MinFactor and the one held, never an error or a factor
// out of range.
func TestGradientDrainSumsFromALyingServer(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	ctx := context.Background()
	o := gradientDefaults(true)
	for _, lie := range []string{"nan", "inf", "-inf", "-3", "1e300", "0"} {
		key := s.prefix + "gradlyingdrain" + lie
		// The interval measured next (stage 5), 0.5 held, the drain's sums lies.
		fields := []any{"f", "0.1", "ms", "5", "h", "0.5", "j", "0"}
		for _, k := range []string{"ds", "dv", "da", "ls", "lv", "la"} {
			fields = append(fields, k, lie)
		}
		if err := adminClient(t).HSet(ctx, key, fields...).Err(); err != nil {
			t.Fatal(err)
		}
		now := storetest.T0 + o.Interval.Microseconds()
		if _, err := runGradient(ctx, s, key, now, adaptive.Signals{Started: 10, Answered: 10, Latency: 5000}, o); err != nil {
			t.Fatal(err)
		}
		f, err := runGradient(ctx, s, key, now, adaptive.Signals{}, o) // the read that judges it
		if err != nil {
			t.Fatalf("drain sums %q stored: %v", lie, err)
		}
		if !(f >= o.MinFactor && f <= 0.5) {
			t.Fatalf("drain sums %q stored: factor %v restored, want one between %v and the 0.5 held", lie, f, o.MinFactor)
		}
	}
}

// TestGradientStallCountFromALyingServer: a count of intervals held for
// stalls stored as nonsense (negative, NaN, huge) never holds the factor
// for more than two intervals in a row: the third stalled interval is
// judged, and a fleet that stalls all the time still adapts.
func TestGradientStallCountFromALyingServer(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	ctx := context.Background()
	o := gradientDefaults(true)
	admin := adminClient(t)
	for _, lie := range []string{"-1000000000", "-3", "nan", "-inf", "1e300"} {
		key := s.prefix + "gradlyingstall" + lie
		if err := admin.HSet(ctx, key, "f", "0.5", "m", "5000", "j", "1", "sh", lie, "as", "1").Err(); err != nil {
			t.Fatal(err)
		}
		now := storetest.T0
		held := 0
		for range 3 {
			now += o.Interval.Microseconds()
			if _, err := runGradient(ctx, s, key, now, adaptive.Signals{Started: 20, Answered: 20, Latency: 5000, Admitted: 10, Stalled: 1}, o); err != nil {
				t.Fatal(err)
			}
			if _, err := runGradient(ctx, s, key, now, adaptive.Signals{}, o); err != nil {
				t.Fatalf("stall count %q stored: %v", lie, err)
			}
			sh, err := admin.HGet(ctx, key, "sh").Int64()
			if err != nil {
				t.Fatal(err)
			}
			if sh > 0 {
				held++
			}
		}
		if held > 2 {
			t.Fatalf("stall count %q stored: %d stalled intervals in a row held, want at most 2", lie, held)
		}
	}
}

// A lying server's count of intervals left to wait after a cut (one the
// script never writes: above 2, negative or not a number) cannot hold the
// gradient factor: it is read as none, so the first clean interval grows
// the factor.
func TestGradientWaitCountFromALyingServer(t *testing.T) {
	s := newStore(t, Options{Settings: Settings{Addrs: []string{standalone.Addr}}})
	ctx := context.Background()
	o := gradientDefaults(false)
	for _, lie := range []string{"1000000", "-3", "nan", "inf"} {
		key := s.prefix + "gradlyingwait" + lie
		// A factor of 0.5, the unloaded latency known.
		if err := adminClient(t).HSet(ctx, key, "f", "0.5", "m", "5000", "j", "0", "k", lie).Err(); err != nil {
			t.Fatal(err)
		}
		now := storetest.T0 + o.Interval.Microseconds()
		if _, err := runGradient(ctx, s, key, now, adaptive.Signals{Started: 100, Answered: 100, Latency: 5000}, o); err != nil {
			t.Fatal(err)
		}
		f, err := runGradient(ctx, s, key, now, adaptive.Signals{}, o) // the read that judges it
		if err != nil {
			t.Fatal(err)
		}
		if f <= 0.5 {
			t.Fatalf("a clean interval, %q intervals to wait stored: factor %v, want it grown past 0.5", lie, f)
		}
	}
}

// A Redis that lost eventual mode's count script (a restart, a failover, a
// Cluster master that never ran it) refuses the sync's EVALSHAs: AddCounts
// sends the script itself for those, and only those, so no count is added
// twice when some masters held it and others did not.
func TestAddCountsAddEachCountOnceWhenScriptsAreLost(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Options{Settings: Settings{Addrs: cluster.Addrs()}, Cluster: true})
	admin := adminCluster(t)
	p := core.MustPolicy("counts", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute, Algorithm: algo.FixedWindow})
	count := func(key string, add int64) core.SharedCount {
		return core.SharedCount{Policy: p, Key: key, Start: 60_000_000, Add: add, Keep: time.Minute, KeepNew: time.Minute}
	}
	// Two keys whose counts live on different masters.
	master := func(key string) string {
		c := count(key, 0)
		m, err := admin.MasterForKey(ctx, s.countKey(&c))
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	first, other := "a", ""
	for i := 0; other == ""; i++ {
		if k := fmt.Sprint("b", i); master(k) != master(first) {
			other = k
		}
	}
	counts := []core.SharedCount{count(first, 2), count(other, 2)}
	if err := s.AddCounts(ctx, counts); err != nil || counts[0].Total != 2 || counts[1].Total != 2 {
		t.Fatalf("first push: %v, totals %d and %d, want 2 and 2", err, counts[0].Total, counts[1].Total)
	}
	c := count(first, 0)
	m, err := admin.MasterForKey(ctx, s.countKey(&c))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	counts = []core.SharedCount{count(first, 3), count(other, 3)}
	if err := s.AddCounts(ctx, counts); err != nil || counts[0].Total != 5 || counts[1].Total != 5 {
		t.Fatalf("a push after one master lost the script: %v, totals %d and %d, want 5 and 5", err, counts[0].Total, counts[1].Total)
	}
}

// A sync of more windows than one count.lua call takes is split into
// calls, each window's total read back into its own count, on standalone
// Redis (runs of countsPerCall) and on a Cluster (runs of one key's
// windows).
func TestAddCountsSplitsIntoCallsAndReadsEachTotal(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"standalone", Options{Settings: Settings{Addrs: []string{standalone.Addr}}}},
		{"cluster", Options{Settings: Settings{Addrs: cluster.Addrs()}, Cluster: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.opts)
			p := core.MustPolicy("split", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute, Algorithm: algo.SlidingCounter})
			n := 2*countsPerCall + 7
			counts := make([]core.SharedCount, n)
			for i := range counts { // two windows of each key, side by side
				counts[i] = core.SharedCount{Policy: p, Key: fmt.Sprint("k", i/2), Start: int64(60_000_000 * (1 + i%2)),
					Add: int64(i + 1), Keep: time.Minute, KeepNew: time.Minute}
			}
			for round := int64(1); round <= 2; round++ {
				if err := s.AddCounts(ctx, counts); err != nil {
					t.Fatal(err)
				}
				for i := range counts {
					if want := round * int64(i+1); counts[i].Total != want {
						t.Fatalf("round %d: window %d's total %d, want %d", round, i, counts[i].Total, want)
					}
				}
			}
		})
	}
}
