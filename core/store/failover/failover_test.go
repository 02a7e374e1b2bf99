package failover

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// flakyStore fails while down is set; it is the unit-test double for a
// shared store (the Redis store's tests stop a real redis-server).
type flakyStore struct {
	down  atomic.Bool
	calls atomic.Int64
	local core.Store
}

func (f *flakyStore) Decide(ctx context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	f.calls.Add(1)
	if f.down.Load() {
		return errors.New("connection refused")
	}
	return f.local.Decide(ctx, p, key, cost, d)
}

func (f *flakyStore) Ping(context.Context) error {
	if f.down.Load() {
		return errors.New("connection refused")
	}
	return nil
}

// mapStore is a minimal correct store over StoreSide.Apply, for these tests.
type mapStore struct {
	mu sync.Mutex
	m  map[string][]algo.State
}

func (s *mapStore) Decide(_ context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string][]algo.State{}
	}
	st, ok := s.m[p.StoreSide().Scope()+key]
	if !ok {
		st = make([]algo.State, len(p.Limits()))
		s.m[p.StoreSide().Scope()+key] = st
	}
	p.StoreSide().Apply(st, time.Now().UnixMicro(), cost, d)
	return nil
}

func TestFailoverOpensOnceFallsBackAndCloses(t *testing.T) {
	shared := &flakyStore{local: &mapStore{}}
	var changes []bool
	var mu sync.Mutex
	f, err := New(shared, Options{Local: &mapStore{}, ProbeEvery: 20 * time.Millisecond,
		OnStateChange: func(open bool, err error) { mu.Lock(); changes = append(changes, open); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: 3, Window: time.Hour, Algorithm: algo.FixedWindow})
	var d core.Decision
	shared.down.Store(true)
	allowed := 0
	for i := 0; i < 10; i++ {
		if err := f.Decide(context.Background(), p, "k", 1, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
		if !d.Fallback {
			t.Fatalf("decision %d while the store is down is not marked Fallback", i)
		}
	}
	if allowed != 3 {
		t.Fatalf("local fallback allowed %d, want the policy's 3", allowed)
	}
	if got := f.SharedErrors(); got != 3 {
		t.Fatalf("SharedErrors %d, want the 3 failed calls before the breaker opened", got)
	}
	if !f.Open() || shared.calls.Load() != 3 {
		t.Fatalf("breaker open %v after %d calls to the dead store, want open after 3", f.Open(), shared.calls.Load())
	}
	shared.down.Store(false)
	// The probe closes the breaker and then reports the change.
	waitfor.True(t, 5*time.Second, "breaker closed and reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(changes) == 2 })
	if f.Open() {
		t.Fatal("breaker did not close after the store came back")
	}
	if err := f.Decide(context.Background(), p, "k", 1, &d); err != nil || d.Fallback {
		t.Fatalf("after recovery: err %v, Fallback %v; want the shared store deciding", err, d.Fallback)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 2 || !changes[0] || changes[1] {
		t.Fatalf("state changes %v, want [open, closed] once each", changes)
	}
}

func TestFailoverAllowDenyFail(t *testing.T) {
	p := core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: 3, Window: time.Minute})
	for _, c := range []struct {
		on      core.OnError
		allowed bool
		err     bool
	}{{core.OnErrorAllow, true, false}, {core.OnErrorDeny, false, false}, {core.OnErrorFail, false, true}} {
		shared := &flakyStore{}
		shared.down.Store(true)
		f, _ := New(shared, Options{OnError: c.on})
		var d core.Decision
		err := f.Decide(context.Background(), p, "k", 1, &d)
		if (err != nil) != c.err || (!c.err && d.Allowed != c.allowed) {
			t.Errorf("%v: allowed %v err %v", c.on, d.Allowed, err)
		}
		// No store decided, so the verdict claims no count, reset or
		// retry-after, and renders no header.
		if !c.err && (d.N != 0 || d.Remaining != 0 || d.RetryAfter != 0 || d.Reset != 0 || !d.Fallback) {
			t.Errorf("%v: invented values %+v", c.on, d)
		}
		if !c.err {
			headers.Render(&d, headers.Options{}, func(name, value string) { t.Errorf("%v: header %s: %s", c.on, name, value) })
		}
		f.Close()
	}
	if _, err := core.ParseOnError("ignore"); err == nil || err.Error() != `on_error: unknown value "ignore" (want local, allow, deny or fail)` {
		t.Errorf("parse: %v", err)
	}
}

// The zero Options fail over to a memory store of their own (on_error
// local, the documented default): a dead shared store leaves the limit in
// force on this node, it does not fail.
func TestZeroOptionsFallBackToMemory(t *testing.T) {
	shared := &flakyStore{}
	shared.down.Store(true)
	f, err := New(shared, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: 3, Window: time.Hour, Algorithm: algo.FixedWindow})
	var got []bool
	for range 5 {
		var d core.Decision
		if err := f.Decide(context.Background(), p, "k", 1, &d); err != nil {
			t.Fatalf("decide: %v", err)
		}
		if !d.Fallback {
			t.Fatalf("decision not marked as the fallback's: %+v", d)
		}
		got = append(got, d.Allowed)
	}
	if want := []bool{true, true, true, false, false}; !slices.Equal(got, want) {
		t.Fatalf("allowed %v, want %v: the fallback must keep the limit", got, want)
	}
}
