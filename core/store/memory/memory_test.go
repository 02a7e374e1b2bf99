package memory

import (
	"context"
	"math"
	"reflect"
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

// TestEvictedKeysFreeTheirRings: a one-limit sliding log's ring lies in
// its shard's slice of rings; a key evicted frees its place there, which
// the next key takes, fresh, so rotating keys hold only the live keys'
// rings.
func TestEvictedKeysFreeTheirRings(t *testing.T) {
	clock := &core.ManualClock{Micros: storetest.T0}
	s := MustNew(Options{MaxKeys: 1000, Clock: clock})
	p := core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Hour, Algorithm: algo.SlidingLog})
	ctx := context.Background()
	var d core.Decision
	for i := 0; i < 50_000; i++ {
		key := "ip-" + strconv.Itoa(i)
		for j := int64(0); j < 6; j++ { // a ring of 8
			_ = s.Decide(ctx, p, key, 1, &d)
			if !d.Allowed || d.Remaining != 10-1-j {
				t.Fatalf("key %d, request %d: allowed %v remaining %d, want a fresh key's", i, j, d.Allowed, d.Remaining)
			}
		}
	}
	live, held := 0, 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		rings := *sh.rings.Load()
		for _, r := range rings {
			if r.Times != nil {
				held++
			}
		}
		if places := len(rings) - len(sh.freeRings); places != sh.n {
			t.Errorf("shard %d: %d ring places taken for %d keys", i, places, sh.n)
		}
		live += sh.n
		sh.mu.Unlock()
	}
	if held != live || live > s.MaxKeys() {
		t.Fatalf("%d rings held for %d live keys (cap %d)", held, live, s.MaxKeys())
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
// lie on 100k cache lines and a one-limit decision reads one of them, and
// it holds no pointer, so the collector never looks into a table.
func TestEntryIsOneCacheLine(t *testing.T) {
	if size := unsafe.Sizeof(entry{}); size != 64 {
		t.Fatalf("an entry is %d bytes, want 64", size)
	}
	var pointers func(reflect.Type) bool
	pointers = func(t reflect.Type) bool {
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Chan, reflect.Func, reflect.Interface, reflect.String, reflect.UnsafePointer:
			return true
		case reflect.Array:
			return t.Len() > 0 && pointers(t.Elem())
		case reflect.Struct:
			for i := range t.NumField() {
				if pointers(t.Field(i).Type) {
					return true
				}
			}
		}
		return false
	}
	if pointers(reflect.TypeFor[entry]()) {
		t.Fatal("an entry holds a pointer: the collector would scan every table")
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

// TestRebuildsLoseNoDecision: decisions racing with the inserts that grow
// and rebuild their shards' tables (which move every entry) are all
// counted: each key's count is exactly the decisions made on it (run with
// -race).
func TestRebuildsLoseNoDecision(t *testing.T) {
	s := MustNew(Options{})
	for _, alg := range []algo.Algorithm{algo.FixedWindow, algo.SlidingLog} {
		p := core.MustPolicy("p-"+alg.String(), core.PolicyOptions{}, algo.Limit{Count: 1000, Window: time.Hour, Algorithm: alg})
		const workers, keys, rounds = 4, 20_000, 3
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var d core.Decision
				for r := range rounds {
					// Each worker walks the keys from its own place, so
					// the first decision on a key races with the others.
					for i := range keys {
						k := (i + w*keys/workers + r*7) % keys
						if err := s.Decide(context.Background(), p, "k"+strconv.Itoa(k), 1, &d); err != nil || !d.Allowed {
							t.Errorf("key %d: err %v allowed %v", k, err, d.Allowed)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		var d core.Decision
		for k := range keys {
			if err := s.Inspect(context.Background(), p, "k"+strconv.Itoa(k), &d); err != nil || d.Remaining != 1000-workers*rounds {
				t.Fatalf("%v key %d: remaining %d after %d decisions of 1000 (err %v)", alg, k, d.Remaining, workers*rounds, err)
			}
		}
	}
}
