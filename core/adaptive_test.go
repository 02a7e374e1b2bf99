package core

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
)

// newTestAdaptive returns a controller whose ticker never fires: tests end
// intervals with Judge.
func newTestAdaptive(t *testing.T, o adaptive.Options) *adaptive.Controller {
	t.Helper()
	o.Interval = time.Hour
	a, err := adaptive.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func TestAdaptiveDecreasesUnderErrorsAndRecovers(t *testing.T) {
	a := newTestAdaptive(t, adaptive.Options{Controller: adaptive.ControllerAIMD})
	prev := a.Factor()
	for i := 0; i < 10; i++ {
		for j := 0; j < 100; j++ {
			a.Observe(map[bool]int{true: 503, false: 200}[j%5 == 0], time.Millisecond) // 20% errors
		}
		a.Judge()
		if f := a.Factor(); f > prev || (prev > 0.1 && f >= prev) {
			t.Fatalf("interval %d: factor %g after %g under sustained errors, want it to fall", i, f, prev)
		}
		prev = a.Factor()
	}
	if a.Factor() != 0.1 {
		t.Fatalf("factor %g after 10 bad intervals, want the floor 0.1", a.Factor())
	}
	// Healthy intervals (and idle ones) add 0.05 each.
	for i := 0; i < 18; i++ {
		for j := 0; j < 100; j++ {
			a.Observe(200, time.Millisecond)
		}
		a.Judge()
	}
	if a.Factor() != 1 {
		t.Fatalf("factor %g after 18 healthy intervals, want 1", a.Factor())
	}
}

func TestAdaptiveLatencyTarget(t *testing.T) {
	a := newTestAdaptive(t, adaptive.Options{Controller: adaptive.ControllerAIMD, LatencyTarget: 50 * time.Millisecond})
	for j := 0; j < 100; j++ {
		a.Observe(200, time.Duration(j)*time.Millisecond) // p90 ≈ 90ms
	}
	a.Judge()
	if a.Factor() != 0.7 {
		t.Fatalf("factor %g with p90 over target, want 0.7", a.Factor())
	}
	if q := a.LastQuantile(); q < 85*time.Millisecond || q > 95*time.Millisecond {
		t.Fatalf("measured p90 %s, want about 90ms", q)
	}
	for j := 0; j < 5; j++ {
		a.Observe(500, time.Second) // too few samples to judge
	}
	a.Judge()
	if a.Factor() != 0.75 {
		t.Fatalf("factor %g after an interval with too few samples, want 0.75", a.Factor())
	}
}

// TestAdaptiveSettlesAtCapacity runs the controller against a model
// upstream that fails the share of requests above its capacity X, under an
// offered load of 3X: the admitted rate settles near X and stays in the
// AIMD band [Decrease·X, X + Increase·count] without growing oscillation.
func TestAdaptiveSettlesAtCapacity(t *testing.T) {
	const count, capacity, offered = 1000.0, 300.0, 900.0
	a := newTestAdaptive(t, adaptive.Options{Controller: adaptive.ControllerAIMD})
	var admitted []float64
	for i := 0; i < 120; i++ {
		rate := min(offered, count*a.Factor())
		admitted = append(admitted, rate)
		for j := 0; j < int(rate); j++ {
			status := 200
			if float64(j) >= capacity {
				status = 503
			}
			a.Observe(status, time.Millisecond)
		}
		a.Judge()
	}
	lo, hi := 0.7*capacity-1, capacity+0.05*count+1
	for i, r := range admitted[30:] {
		if r < lo || r > hi {
			t.Fatalf("interval %d: admitted %.0f/s, outside the band [%.0f, %.0f]", i+30, r, lo, hi)
		}
	}
	var sum float64
	for _, r := range admitted[30:] {
		sum += r
	}
	if mean := sum / float64(len(admitted)-30); mean < 0.8*capacity || mean > 1.1*capacity {
		t.Fatalf("mean admitted %.0f/s, want about the capacity %v", mean, capacity)
	}
}

func TestAdaptiveOptionErrors(t *testing.T) {
	for _, tc := range []struct {
		o    adaptive.Options
		want string
	}{
		{adaptive.Options{MinFactor: 2}, "adaptive min: 2 must be above 0 and at most 1"},
		{adaptive.Options{ErrorRate: 1.5}, "adaptive error_rate: 1.5"},
		{adaptive.Options{Decrease: 1}, "adaptive decrease: 1"},
		{adaptive.Options{Interval: time.Millisecond}, "adaptive interval: 1ms must be at least 10ms"},
		{adaptive.Options{LatencyTarget: -1}, "adaptive latency"},
		{adaptive.Options{Controller: "vegas"}, `adaptive controller: "vegas" is not gradient or aimd`},
		{adaptive.Options{Tolerance: 0.9}, "adaptive tolerance: 0.9 must be above 1"},
	} {
		if _, err := adaptive.New(tc.o); err == nil || err.Error()[:len(tc.want)] != tc.want {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}

// TestAdaptivePolicyScalesLimits: the policy's counts follow the factor,
// counters carry over, and a sliding log whose count shrinks below its live
// entries denies until enough of them leave.
func TestAdaptivePolicyScalesLimits(t *testing.T) {
	a := newTestAdaptive(t, adaptive.Options{Controller: adaptive.ControllerAIMD, MinFactor: 0.5})
	p := MustPolicy("adapt", PolicyOptions{Adaptive: a}, algo.Limit{Count: 10, Window: time.Second, Algorithm: algo.SlidingLog})
	states := make([]algo.State, 1)
	var d Decision
	now := int64(1_000_000_000)
	for i := 0; i < 8; i++ {
		p.StoreSide().Apply(states, now+int64(i)*1000, 1, &d)
	}
	if !d.Allowed || d.Remaining != 2 || d.Quota != 10 {
		t.Fatalf("8th of 10: allowed %v remaining %d limit %d", d.Allowed, d.Remaining, d.Quota)
	}
	for j := 0; j < 100; j++ {
		a.Observe(503, time.Millisecond)
	}
	a.Judge() // factor 0.7: count 7
	if got := p.Limits()[0].Count; got != 7 {
		t.Fatalf("count %d after one decrease, want 7", got)
	}
	p.StoreSide().Apply(states, now+10_000, 1, &d)
	if d.Allowed || d.Quota != 7 || d.Remaining != 0 {
		t.Fatalf("8 live, count 7: allowed %v limit %d remaining %d", d.Allowed, d.Quota, d.Remaining)
	}
	// The 2nd oldest entry (at +1ms) must leave before one more fits.
	if want := time.Second - 9*time.Millisecond; d.RetryAfter != want {
		t.Fatalf("RetryAfter %s, want %s", d.RetryAfter, want)
	}
	p.StoreSide().Apply(states, now+1_001_001, 1, &d)
	if !d.Allowed {
		t.Fatalf("after two entries left: denied")
	}
	if got := p.Configured()[0].Count; got != 10 {
		t.Fatalf("configured count %d changed", got)
	}
}

// TestSlidingLogRingGrowsWithUse: a sliding log holds 8 bytes per request
// in its window, not per request its limit allows: a key of a 100,000/1h
// limit that made 5 requests keeps a ring of 8 times.
func TestSlidingLogRingGrowsWithUse(t *testing.T) {
	l := algo.Limit{Count: 100_000, Window: time.Hour, Algorithm: algo.SlidingLog}
	if err := l.Normalize(); err != nil {
		t.Fatal(err)
	}
	var s algo.State
	now := int64(1_000_000_000)
	sizes := []int{}
	for i := 0; i < 5; i++ {
		var r algo.Result
		s, r = algo.Step(&l, s, now+int64(i), 1)
		if !r.Allowed || r.Remaining != int64(100_000-1-i) {
			t.Fatalf("request %d: %+v", i, r)
		}
		sizes = append(sizes, len(s.Log.Times))
	}
	if got := fmt.Sprint(sizes); got != "[4 4 4 4 8]" {
		t.Fatalf("ring sizes %s, want [4 4 4 4 8]", got)
	}
}

func TestPolicyScopeMatchesPolicy(t *testing.T) {
	limits := []algo.Limit{{Count: 10, Window: time.Second}, {Count: 100, Window: time.Hour, Algorithm: algo.GCRA, Burst: 5}}
	scope, err := PolicyScope("api", limits...)
	if err != nil {
		t.Fatal(err)
	}
	if want := MustPolicy("api", PolicyOptions{}, limits...).StoreSide().Scope(); scope != want {
		t.Fatalf("PolicyScope %q, policy's Scope %q", scope, want)
	}
	if _, err := PolicyScope("api", algo.Limit{Count: 0, Window: time.Second}); err == nil {
		t.Fatal("an invalid limit has a scope")
	}
}
