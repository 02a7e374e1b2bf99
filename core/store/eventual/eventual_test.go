package eventual

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/redis"
	"github.com/tollgate/tollgate/internal/redistest"
)

var standalone *redistest.Server

func TestMain(m *testing.M) {
	os.Exit(redistest.Main(m, &standalone, nil))
}

func newEventual(t *testing.T, prefix string, every time.Duration, clock core.Clock) *Store {
	t.Helper()
	s, err := redis.New(redis.Options{Settings: redis.Settings{Addrs: []string{standalone.Addr}, Prefix: prefix}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(s, Options{SyncInterval: every, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(); s.Close() })
	return e
}

// newManual is a node on the standalone Redis that syncs only when the
// test calls Sync, every 10s in name.
func newManual(t *testing.T, prefix string, clock core.Clock) *Store {
	t.Helper()
	s, err := redis.New(redis.Options{Settings: redis.Settings{Addrs: []string{standalone.Addr}, Prefix: prefix}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(s, Options{SyncInterval: 10 * time.Second, Clock: clock, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(); s.Close() })
	return e
}

func TestEventualNodesLearnEachOthersCounts(t *testing.T) {
	prefix := fmt.Sprintf("ev%d:", time.Now().UnixNano())
	clock := &core.ManualClock{Micros: 1_700_006_400_000_000}
	a := newEventual(t, prefix, time.Hour, clock) // synced by hand below
	b := newEventual(t, prefix, time.Hour, clock)
	p := core.MustPolicy("ev", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute, Algorithm: algo.FixedWindow})
	ctx := context.Background()
	var d core.Decision
	for i := 0; i < 10; i++ {
		_ = a.Decide(ctx, p, "k", 1, &d)
	}
	_ = b.Decide(ctx, p, "k", 1, &d)
	if !d.Allowed {
		t.Fatal("b denied before any sync: it cannot know a's counts yet")
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	_ = b.Decide(ctx, p, "k", 1, &d)
	if d.Allowed || d.Remaining != 0 {
		t.Fatalf("b after sync: %+v, want denied (11 of 10 counted)", d)
	}
}

// Three nodes at a steady rate: the measured overshoot per window stays
// within the documented bound, k × per-node rate × sync interval.
func TestEventualOvershootWithinBound(t *testing.T) {
	const (
		nodes   = 3
		n       = 400
		window  = time.Second
		every   = 50 * time.Millisecond
		perNode = 800 // requests per second each node receives
		run     = 4 * time.Second
	)
	for _, alg := range []algo.Algorithm{algo.FixedWindow, algo.SlidingCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			prefix := fmt.Sprintf("over%d:", time.Now().UnixNano())
			p := core.MustPolicy("over", core.PolicyOptions{}, algo.Limit{Count: n, Window: window, Algorithm: alg})
			var mu sync.Mutex
			perWindow := map[int64]int{}
			clock := core.NewMonotonicClock()
			var wg sync.WaitGroup
			for i := 0; i < nodes; i++ {
				e := newEventual(t, prefix, every, clock)
				wg.Add(1)
				go func() {
					defer wg.Done()
					tick := time.NewTicker(time.Second / perNode)
					defer tick.Stop()
					stop := time.Now().Add(run)
					var d core.Decision
					for time.Now().Before(stop) {
						<-tick.C
						_ = e.Decide(context.Background(), p, "hot", 1, &d)
						if d.Allowed {
							now := clock.NowMicros()
							mu.Lock()
							perWindow[now-now%int64(window/time.Microsecond)]++
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			bound := int(float64(nodes*perNode) * every.Seconds())
			worst := 0
			var counts []string
			for _, c := range perWindow {
				worst = max(worst, c-n)
				counts = append(counts, fmt.Sprint(c))
			}
			t.Logf("%v: allowed per window %s (limit %d); worst overshoot %d, bound %d nodes × %d/s × %v = %d",
				alg, strings.Join(counts, " "), n, max(worst, 0), nodes, perNode, every, bound)
			if worst > bound {
				t.Fatalf("overshoot %d above the bound %d", worst, bound)
			}
		})
	}
}

// TestEventualRefusesOtherAlgorithms: CheckPolicy, which config.Compile
// runs once when a config is loaded (not on the request path, nor on an
// operator's read or reset), refuses an algorithm that does not count per
// window, naming it.
func TestEventualRefusesOtherAlgorithms(t *testing.T) {
	p := core.MustPolicy("gc", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second, Algorithm: algo.GCRA})
	const want = "needs fixed_window or sliding_counter, not gcra"
	if err := CheckPolicy(p); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("CheckPolicy: %v", err)
	}
	if _, err := New(nil, Options{SyncInterval: 10 * time.Millisecond}); err == nil ||
		err.Error() != "sync: 10ms must be at least 20ms" {
		t.Fatalf("sync interval error %v", err)
	}
}

// A decision whose clock reading is older than the key's last one (read
// before the lock, overtaken by a concurrent decision across a window
// boundary) must not move the state back a window: doing so forgot the
// new window's count, and a node admitted more than the limit in it (seen
// once as 203 of 200 in a real gateway's partition test). As the memory store,
// each key's time only moves forward.
func TestEventualKeyTimeNeverGoesBack(t *testing.T) {
	prefix := fmt.Sprintf("ev%d:", time.Now().UnixNano())
	clock := &core.ManualClock{Micros: 1_700_006_400_000_000}
	e := newEventual(t, prefix, time.Hour, clock)
	p := core.MustPolicy("ev-back", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second, Algorithm: algo.FixedWindow})
	ctx := context.Background()
	var allowed []int64
	for _, at := range []int64{100, -1, 200} { // µs around a window boundary
		clock.Micros = 1_700_006_400_000_000 + at
		var d core.Decision
		if err := e.Decide(ctx, p, "k", 1, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed = append(allowed, at)
		}
	}
	if len(allowed) != 1 {
		t.Fatalf("allowed at %v µs: the late reading at -1 µs moved the key back a window, and the window after forgot its count", allowed)
	}
}

// While syncs fail, a key this node holds no view of the fleet's counts
// for (first seen after the last sync that succeeded) is answered by
// OnError, as an exact store's failure policy answers a decision Redis
// could not make; keys with a view keep deciding locally, and once a sync
// succeeds the new key is decided like any other.
func TestEventualOnErrorForKeysWithoutAView(t *testing.T) {
	rs := redistest.StartT(t)
	clock := &core.ManualClock{Micros: 1_700_006_400_000_000}
	p := core.MustPolicy("ev-onerror", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute, Algorithm: algo.FixedWindow})
	ctx := context.Background()
	for _, onError := range []core.OnError{core.OnErrorLocal, core.OnErrorAllow, core.OnErrorDeny, core.OnErrorFail} {
		shared, err := redis.New(redis.Options{Settings: redis.Settings{Addrs: []string{rs.Addr}, Prefix: fmt.Sprintf("ev-%s-%d:", onError, time.Now().UnixNano()), Timeout: algo.Duration(200 * time.Millisecond)}})
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(shared, Options{Manual: true, Clock: clock, OnError: onError})
		if err != nil {
			t.Fatal(err)
		}
		var d core.Decision
		if err := e.Decide(ctx, p, "known", 1, &d); err != nil || !d.Allowed {
			t.Fatalf("%s: known key: %v %+v", onError, err, d)
		}
		if err := e.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		rs.Stop()
		// A sync reads only keys used since the last one: a request
		// makes the next sync reach Redis.
		if err := e.Decide(ctx, p, "known", 1, &d); err != nil || !d.Allowed {
			t.Fatalf("%s: known key: %v %+v", onError, err, d)
		}
		if err := e.Sync(ctx); err == nil {
			t.Fatalf("%s: a sync with Redis stopped succeeded", onError)
		}
		if err := e.Decide(ctx, p, "known", 1, &d); err != nil || !d.Allowed || d.Fallback || d.Remaining != 7 {
			t.Errorf("%s: a key with a view while syncs fail: %v %+v, want decided locally (7 left)", onError, err, d)
		}
		err = e.Decide(ctx, p, "new", 1, &d)
		switch onError {
		case core.OnErrorLocal:
			if err != nil || !d.Allowed || d.Fallback || d.Remaining != 9 {
				t.Errorf("local: a new key: %v %+v, want decided locally", err, d)
			}
		case core.OnErrorAllow, core.OnErrorDeny:
			if err != nil || d.Allowed != (onError == core.OnErrorAllow) || !d.Fallback || d.N != 0 {
				t.Errorf("%s: a new key: %v %+v, want undecided, allowed %v", onError, err, d, onError == core.OnErrorAllow)
			}
		case core.OnErrorFail:
			if err == nil || !strings.Contains(err.Error(), "no view of the fleet's counts") {
				t.Errorf("fail: a new key: %v, want the sync's error", err)
			}
		}
		if err := rs.Restart(); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(ctx); err != nil {
			t.Fatalf("%s: sync after the restart: %v", onError, err)
		}
		if err := e.Decide(ctx, p, "new", 1, &d); err != nil || !d.Allowed || d.Fallback {
			t.Errorf("%s: a new key once syncs succeed: %v %+v", onError, err, d)
		}
		e.Close()
		shared.Close()
	}
}

// An idle key costs Redis nothing: once a sync has pushed and read what a
// request counted, syncs with no traffic send Redis no command, whether
// the node holds 10, 1,000 or 100,000 keys, and a sync after traffic
// reads only the keys that traffic touched. Counted as Redis counts them
// (INFO's total_commands_processed, less the INFO calls themselves).
func TestEventualIdleKeysCostNothing(t *testing.T) {
	rs := redistest.StartT(t)
	commands := func() int64 {
		t.Helper()
		n, err := rs.CommandsProcessed()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, keys := range []int{10, 1_000, 100_000} {
		t.Run(fmt.Sprint(keys, " keys"), func(t *testing.T) {
			// The first sync pushes every key in one pipeline: 100,000 keys
			// take longer than the default timeout of a decision.
			s, err := redis.New(redis.Options{Settings: redis.Settings{Addrs: []string{rs.Addr}, Prefix: fmt.Sprintf("idle%d:", keys), Timeout: algo.Duration(time.Minute)}})
			if err != nil {
				t.Fatal(err)
			}
			clock := &core.ManualClock{Micros: 1_700_006_400_000_000}
			e, err := New(s, Options{Manual: true, Clock: clock, MaxKeys: 2 * keys})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close(); s.Close() })
			p := core.MustPolicy("idle", core.PolicyOptions{}, algo.Limit{Count: 100, Window: time.Hour, Algorithm: algo.FixedWindow})
			ctx := context.Background()
			var d core.Decision
			for i := 0; i < keys; i++ {
				if err := e.Decide(ctx, p, fmt.Sprint("k", i), 1, &d); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.Sync(ctx); err != nil { // pushes and reads every key once
				t.Fatal(err)
			}
			before := commands()
			for i := 0; i < 5; i++ {
				clock.Micros += time.Second.Microseconds()
				if err := e.Sync(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if idle := commands() - before - 1; idle != 0 { // the second INFO is the one command
				t.Errorf("5 syncs of %d idle keys sent Redis %d commands, want 0", keys, idle)
			}
			// Traffic on 3 keys: the next sync reads those, in one round trip.
			for i := 0; i < 3; i++ {
				_ = e.Decide(ctx, p, fmt.Sprint("k", i), 1, &d)
			}
			before = commands()
			if err := e.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			// The touched keys' windows: one count.lua call (EVALSHA, and
			// in it each window's INCRBY and PTTL; no PEXPIRE, the expiry
			// is already as late as it must be).
			if busy := commands() - before - 1; busy != 7 {
				t.Errorf("a sync after traffic on 3 of %d keys sent Redis %d commands, want 7 (one EVALSHA; INCRBY and PTTL of each)", keys, busy)
			}
			if err := e.Inspect(ctx, p, "k5", &d); err != nil || d.Remaining != 99 {
				t.Errorf("an idle key's count after the idle syncs: remaining %d (%v), want 99", d.Remaining, err)
			}
		})
	}
}

// A window's shared count lives in Redis at least until the window stops
// counting plus clockSkew (algo.CountsUntil), whenever the sync that pushes
// or reads it is, and a count a sync creates at least the span its window
// counts for (as counters that EXPIRE on their first INCR live a period):
// whoever counts keys in Redis a window later finds only the current ones,
// and a second after a window's end still finds it.
func TestEventualWindowCountsExpireWhenTheWindowStopsCounting(t *testing.T) {
	admin := goredis.NewClient(&goredis.Options{Addr: standalone.Addr})
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	const second, minute = int64(1_000_000), int64(60_000_000)
	start := int64(1_700_006_400_000_000) // a minute's start
	// Redis' clock runs while the test reads: a TTL is at most what was
	// set and at most a few seconds less.
	near := func(got, want time.Duration) bool { return got <= want && got > want-5*time.Second }
	for _, tc := range []struct {
		algorithm algo.Algorithm
		span      time.Duration // how long a window counts for
		// how long the window starting at start still counts, seen from
		// start+30s, start+40s and start+61s (in the next window)
		at30, at40, at61 time.Duration
	}{
		{algo.FixedWindow, time.Minute, 30 * time.Second, 20 * time.Second, 0},
		{algo.SlidingCounter, 2 * time.Minute, 90 * time.Second, 80 * time.Second, 59 * time.Second},
	} {
		t.Run(tc.algorithm.String(), func(t *testing.T) {
			prefix := fmt.Sprintf("keep%d:", time.Now().UnixNano())
			clock := &core.ManualClock{Micros: start + 20*second}
			e := newManual(t, prefix, clock)
			p := core.MustPolicy("keep", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute, Algorithm: tc.algorithm})
			key := func(windowStart int64) string {
				t.Helper()
				keys, err := admin.Keys(ctx, prefix+"*:"+fmt.Sprint(windowStart)).Result()
				if err != nil || len(keys) != 1 {
					t.Fatalf("the count of the window at %d: keys %q, %v", windowStart, keys, err)
				}
				return keys[0]
			}
			ttl := func(windowStart int64) time.Duration { return admin.PTTL(ctx, key(windowStart)).Val() }
			var d core.Decision
			decideAndSync := func(at int64) {
				t.Helper()
				clock.Micros = at
				if err := e.Decide(ctx, p, "k", 1, &d); err != nil {
					t.Fatal(err)
				}
				if err := e.Sync(ctx); err != nil {
					t.Fatal(err)
				}
			}
			decideAndSync(start + 20*second)
			if got := ttl(start); !near(got, tc.span) {
				t.Errorf("created by a sync 20s into the window, its count expires in %v, want %v (the span it counts for)", got, tc.span)
			}
			// A sync moves an expiry later, to when the window stops
			// counting, never earlier.
			admin.PExpire(ctx, key(start), 5*time.Second)
			decideAndSync(start + 30*second)
			if got, want := ttl(start), tc.at30+clockSkew; !near(got, want) {
				t.Errorf("a count expiring in 5s, after a sync 30s into the window: expires in %v, want %v", got, want)
			}
			later := tc.at40 + clockSkew + 10*time.Second
			admin.PExpire(ctx, key(start), later)
			decideAndSync(start + 40*second)
			if got := ttl(start); !near(got, later) {
				t.Errorf("a count expiring in %v, after a sync 40s into the window: expires in %v, want %v", later, got, later)
			}
			admin.PExpire(ctx, key(start), 5*time.Second)
			decideAndSync(start + minute + second)
			if got := ttl(start + minute); !near(got, tc.span) {
				t.Errorf("the next window's count expires in %v, want %v", got, tc.span)
			}
			if tc.algorithm == algo.SlidingCounter { // read again as the window before the current one
				if got, want := ttl(start), tc.at61+clockSkew; !near(got, want) {
					t.Errorf("the window before the current one expires in %v, want %v", got, want)
				}
			}
		})
	}
	// A count created just before its window's end lives the window's
	// span; one a node pushes after the end (its last request before the
	// end, its sync after) lives no longer than clockSkew after the end,
	// and goes at once once that has passed.
	for _, late := range []int64{-second / 2, second / 2, 2 * second} {
		prefix := fmt.Sprintf("late%d:", time.Now().UnixNano())
		clock := &core.ManualClock{Micros: start + 59*second}
		e := newManual(t, prefix, clock)
		p := core.MustPolicy("late", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute, Algorithm: algo.FixedWindow})
		var d core.Decision
		if err := e.Decide(ctx, p, "k", 1, &d); err != nil {
			t.Fatal(err)
		}
		clock.Micros = start + minute + late
		if err := e.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		keys, _ := admin.Keys(ctx, prefix+"*").Result()
		after := time.Duration(late) * time.Microsecond
		switch {
		case late < 0:
			if len(keys) != 1 || !near(admin.PTTL(ctx, keys[0]).Val(), time.Minute) {
				t.Errorf("a push %v before the window's end: keys %q, want one expiring in a minute", -after, keys)
			}
		case late < int64(clockSkew/time.Microsecond):
			if len(keys) != 1 || admin.PTTL(ctx, keys[0]).Val() > clockSkew-after {
				t.Errorf("a push %v after the window's end: keys %q, want one expiring at most %v later", after, keys, clockSkew-after)
			}
		case len(keys) != 0:
			t.Errorf("a push %v after the window's end left %q, want its count gone at once", after, keys)
		}
	}
}
