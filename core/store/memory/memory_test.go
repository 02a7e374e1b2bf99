package memory

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/storetest"
)

func fixed(n int64, w time.Duration) *core.Policy {
	return core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: n, Window: w, Algorithm: algo.FixedWindow})
}

func TestRotatingKeysStayUnderCap(t *testing.T) {
	clock := &core.ManualClock{Micros: storetest.T0}
	s := MustNew(Options{MaxKeys: 1000, Clock: clock})
	p := fixed(10, time.Hour)
	ctx := context.Background()
	var d core.Decision
	for i := 0; i < 200_000; i++ {
		_ = s.Decide(ctx, p, "ip-"+strconv.Itoa(i), 1, &d)
		if !d.Allowed {
			t.Fatalf("fresh key %d denied", i)
		}
	}
	if n := s.Len(); n > s.MaxKeys() || n < 900 {
		t.Fatalf("tracking %d keys, cap %d", n, s.MaxKeys())
	}
	// The keys of the last moment are still limited exactly.
	for i := 0; i < 10; i++ {
		_ = s.Decide(ctx, p, "ip-199999", 1, &d)
	}
	if d.Allowed {
		t.Fatal("a live key lost its count to eviction")
	}
}

func TestExpiredKeysAreDroppedWithoutPressure(t *testing.T) {
	clock := &core.ManualClock{Micros: storetest.T0}
	s := MustNew(Options{Clock: clock})
	p := fixed(10, time.Second)
	ctx := context.Background()
	var d core.Decision
	for i := 0; i < 5000; i++ {
		_ = s.Decide(ctx, p, "old-"+strconv.Itoa(i), 1, &d)
	}
	clock.Advance(2 * time.Second)
	for i := 0; i < 5000; i++ {
		_ = s.Decide(ctx, p, "new-"+strconv.Itoa(i), 1, &d)
	}
	if n := s.Len(); n > 6000 {
		t.Fatalf("%d keys tracked: expired keys were not dropped", n)
	}
}

// TestEntryIsOneCacheLine: an entry is 64 bytes, so 100k keys' entries
// lie on 100k cache lines and a one-limit decision reads one of them; its
// aux is 64 bytes too, so a key costs what it did as one 128-byte entry.
func TestEntryIsOneCacheLine(t *testing.T) {
	if size := unsafe.Sizeof(entry{}); size != 64 {
		t.Fatalf("an entry is %d bytes, want 64", size)
	}
	if size := unsafe.Sizeof(entryAux{}); size != 64 {
		t.Fatalf("an entry's aux is %d bytes, want 64", size)
	}
}

func TestNoAllocationOnTrackedKey(t *testing.T) {
	s := MustNew(Options{})
	for _, a := range algo.Algorithms {
		l := algo.Limit{Count: 100, Window: time.Second, Algorithm: a}
		if a.HasMaxDelay() {
			l.MaxDelay = time.Second
		}
		p := core.MustPolicy("p", core.PolicyOptions{}, l,
			algo.Limit{Count: 1000, Window: time.Hour, Algorithm: algo.SlidingCounter})
		var d core.Decision
		ctx := context.Background()
		_ = s.Decide(ctx, p, "key", 1, &d)
		if n := testing.AllocsPerRun(1000, func() { _ = s.Decide(ctx, p, "key", 1, &d) }); n != 0 {
			t.Errorf("%v: %.1f allocs per decision", a, n)
		}
	}
}

// Many goroutines on one key: exactly Count allowed (run with -race).
func TestConcurrentDecisionsAreExact(t *testing.T) {
	s := MustNew(Options{})
	p := core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: 500, Window: time.Hour, Algorithm: algo.SlidingLog})
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d core.Decision
			for i := 0; i < 100; i++ {
				_ = s.Decide(context.Background(), p, "shared", 1, &d)
				if d.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if allowed.Load() != 500 {
		t.Fatalf("allowed %d of 1600, want exactly 500", allowed.Load())
	}
}

func TestCountersSurviveAnEqualPolicy(t *testing.T) {
	s := MustNew(Options{})
	var d core.Decision
	_ = s.Decide(context.Background(), fixed(2, time.Hour), "k", 2, &d)
	// A reload builds a new but equal policy: same counters.
	_ = s.Decide(context.Background(), fixed(2, time.Hour), "k", 1, &d)
	if d.Allowed {
		t.Fatal("an equal policy did not see the counters")
	}
	// A raised limit keeps what was used (as gateways' own counters do): 2 of 3.
	_ = s.Decide(context.Background(), fixed(3, time.Hour), "k", 1, &d)
	if !d.Allowed || d.Remaining != 0 {
		t.Fatalf("a raised limit: allowed %v remaining %d, want the 3rd allowed and none left", d.Allowed, d.Remaining)
	}
	// Another window or algorithm is another counter.
	_ = s.Decide(context.Background(), fixed(3, time.Minute), "k", 1, &d)
	if !d.Allowed || d.Remaining != 2 {
		t.Fatalf("another window: allowed %v remaining %d, want a fresh counter", d.Allowed, d.Remaining)
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := New(Options{MaxKeys: -1}); err == nil || err.Error() != "max_keys: -1 must be between 0 (the default) and 1073741824" {
		t.Fatal(err)
	}
	// The shard arithmetic would overflow: a typo, not a cap of 256 keys.
	if _, err := New(Options{MaxKeys: math.MaxInt}); err == nil || !strings.Contains(err.Error(), "must be between 0 (the default) and") {
		t.Fatal(err)
	}
}
