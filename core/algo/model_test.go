package algo

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The reference model: each algorithm's promise written plainly, checked on
// random traces of the step functions.

type event struct {
	at, cost int64 // µs
	res      Result
}

// runTrace feeds arrivals (sorted times, costs) through Step for l and
// returns every request with its verdict.
func runTrace(l *Limit, times, costs []int64) []event {
	var s State
	out := make([]event, len(times))
	for i, at := range times {
		var r Result
		s, r = Step(l, s, at, costs[i])
		out[i] = event{at: at, cost: costs[i], res: r}
	}
	return out
}

// randomArrivals returns n bursty arrival times from t0: clumps of
// back-to-back requests separated by random gaps up to maxGap µs.
func randomArrivals(rng *rand.Rand, n int, t0, maxGap int64, maxCost int64) (times, costs []int64) {
	t := t0
	for i := 0; i < n; i++ {
		switch rng.IntN(4) {
		case 0:
			t += rng.Int64N(maxGap)
		case 1:
			t += rng.Int64N(maxGap / 20)
		default:
			// same instant: a burst
		}
		times = append(times, t)
		costs = append(costs, 1+rng.Int64N(maxCost))
	}
	return
}

func validated(t *testing.T, l Limit) *Limit {
	t.Helper()
	if err := l.Normalize(); err != nil {
		t.Fatal(err)
	}
	return &l
}

const t0 = int64(1_700_006_400) * 1_000_000

func TestModelSlidingLogNeverMoreThanNInAnyWindow(t *testing.T) {
	for seed := uint64(0); seed < 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		n := 1 + rng.Int64N(20)
		w := 1000 + rng.Int64N(2_000_000)
		l := validated(t, Limit{Count: n, Window: FromMicros(w), Algorithm: SlidingLog})
		times, costs := randomArrivals(rng, 3000, t0, w/2, 3)
		ev := runTrace(l, times, costs)
		// For every allowed request, the allowed cost in (at-w, at] is ≤ n.
		for i, e := range ev {
			if !e.res.Allowed {
				continue
			}
			sum := int64(0)
			for j := i; j >= 0 && ev[j].at > e.at-w; j-- {
				if ev[j].res.Allowed {
					sum += ev[j].cost
				}
			}
			if sum > n {
				t.Fatalf("seed %d: %d allowed in the window ending %d, limit %d", seed, sum, e.at, n)
			}
		}
	}
}

func TestModelFixedWindowAtMostNPerAlignedWindow(t *testing.T) {
	for seed := uint64(0); seed < 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 2))
		n := 1 + rng.Int64N(20)
		w := 1000 + rng.Int64N(2_000_000)
		l := validated(t, Limit{Count: n, Window: FromMicros(w), Algorithm: FixedWindow})
		times, costs := randomArrivals(rng, 3000, t0, w/2, 3)
		perWindow := map[int64]int64{}
		for _, e := range runTrace(l, times, costs) {
			if e.res.Allowed {
				perWindow[e.at-e.at%w] += e.cost
			}
		}
		for start, sum := range perWindow {
			if sum > n {
				t.Fatalf("seed %d: %d allowed in window %d, limit %d", seed, sum, start, n)
			}
		}
	}
}

// The weakness fixed window is known for: N at the end of one window and N
// at the start of the next, 2N within 2µs.
func TestModelFixedWindowBoundaryBurstIs2N(t *testing.T) {
	const n = 100
	l := validated(t, Limit{Count: n, Window: time.Minute, Algorithm: FixedWindow})
	var s State
	allowed := 0
	for _, at := range []int64{t0 + 60e6 - 1, t0 + 60e6} {
		for i := 0; i < n+10; i++ {
			var r Result
			if s, r = Step(l, s, at, 1); r.Allowed {
				allowed++
			}
		}
	}
	if allowed != 2*n {
		t.Fatalf("fixed window allowed %d across the boundary, want the known 2N = %d", allowed, 2*n)
	}
	// The sliding log allows only N in the same pattern.
	l = validated(t, Limit{Count: n, Window: time.Minute, Algorithm: SlidingLog})
	s, allowed = State{}, 0
	for _, at := range []int64{t0 + 60e6 - 1, t0 + 60e6} {
		for i := 0; i < n+10; i++ {
			var r Result
			if s, r = Step(l, s, at, 1); r.Allowed {
				allowed++
			}
		}
	}
	if allowed != n {
		t.Fatalf("sliding log allowed %d across the boundary, want %d", allowed, n)
	}
}

// Token bucket and GCRA: allowed cost in any interval of length d is at most
// burst + rate·d.
func TestModelBucketsAtMostBurstPlusRateTimesT(t *testing.T) {
	for _, a := range []Algorithm{TokenBucket, GCRA} {
		for seed := uint64(0); seed < 30; seed++ {
			rng := rand.New(rand.NewPCG(seed, 3))
			n := 1 + rng.Int64N(50)
			w := 1000 + rng.Int64N(2_000_000)
			l := validated(t, Limit{Count: n, Window: FromMicros(w), Algorithm: a, Burst: 1 + rng.Int64N(10)})
			times, costs := randomArrivals(rng, 1500, t0, w/int64(n)*3+1, 2)
			ev := runTrace(l, times, costs)
			var allowed []event
			for _, e := range ev {
				if e.res.Allowed {
					allowed = append(allowed, e)
				}
			}
			for i := range allowed {
				sum := int64(0)
				for j := i; j < len(allowed); j++ {
					sum += allowed[j].cost
					d := allowed[j].at - allowed[i].at
					// sum ≤ burst + n·d/w, in integers: sum·w ≤ burst·w + n·d.
					if sum*w > l.EffectiveBurst()*w+n*d {
						t.Fatalf("%v seed %d: %d allowed in %dµs, bound %d + %d/%dµs × %d",
							a, seed, sum, d, l.EffectiveBurst(), n, w, d)
					}
				}
			}
		}
	}
}

// Leaky bucket shaping: releases (arrival + delay) never come faster than the
// rate, delays never pass MaxDelay, and the queue never passes its size.
func TestModelShaperOutputNeverFasterThanRate(t *testing.T) {
	for seed := uint64(0); seed < 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 4))
		n := 1 + rng.Int64N(50)
		w := 1000 + rng.Int64N(2_000_000)
		maxDelay := 1 + rng.Int64N(w)
		burst := int64(0)
		if rng.IntN(2) == 0 {
			burst = 1 + rng.Int64N(8)
		}
		l := validated(t, Limit{Count: n, Window: FromMicros(w), Algorithm: LeakyBucket, MaxDelay: FromMicros(maxDelay), Burst: burst})
		times, costs := randomArrivals(rng, 1500, t0, w/int64(n)*3+1, 2)
		type release struct{ at, cost int64 }
		var out []release
		for _, e := range runTrace(l, times, costs) {
			if !e.res.Allowed {
				continue
			}
			d := int64(e.res.Delay / time.Microsecond)
			if d > maxDelay {
				t.Fatalf("seed %d: delay %dµs above max %dµs", seed, d, maxDelay)
			}
			// Queue: requests admitted but not yet released when this one arrives.
			queued := int64(0)
			for _, r := range out {
				if r.at > e.at {
					queued += r.cost
				}
			}
			if d > 0 {
				queued += e.cost
			}
			if queued > l.EffectiveBurst() {
				t.Fatalf("seed %d: %d queued, queue size %d", seed, queued, l.EffectiveBurst())
			}
			if len(out) > 0 {
				prev := out[len(out)-1]
				// Next release ≥ previous + its cost × w/n, rounded down to µs.
				if (e.at+d-prev.at)*n < prev.cost*w-n {
					t.Fatalf("seed %d: releases %dµs apart for cost %d, rate %d/%dµs", seed, e.at+d-prev.at, prev.cost, n, w)
				}
			}
			out = append(out, release{e.at + d, e.cost})
		}
	}
}

// Sliding counter: the error of Cloudflare's estimate, measured. It never
// allows more than 2N in a window (it is never worse than fixed window) and,
// on steady traffic at twice the rate, admits close to N per window.
func TestModelSlidingCounterError(t *testing.T) {
	const n, w = 100, int64(1_000_000)
	l := validated(t, Limit{Count: n, Window: FromMicros(w), Algorithm: SlidingCounter})
	worst := 0.0
	for seed := uint64(0); seed < 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		times, costs := randomArrivals(rng, 6000, t0, 40_000, 1)
		ev := runTrace(l, times, costs)
		for i, e := range ev {
			sum := int64(0)
			for j := i; j >= 0 && ev[j].at > e.at-w; j-- {
				if ev[j].res.Allowed {
					sum += ev[j].cost
				}
			}
			if sum > 2*n {
				t.Fatalf("seed %d: %d in one window, above 2N", seed, sum)
			}
			worst = max(worst, float64(sum)/n)
		}
	}
	// Steady arrivals at 2N per window: the allowed rate converges on N.
	var s State
	allowed := 0
	for i := int64(0); i < 20*2*n; i++ {
		var r Result
		if s, r = Step(l, s, t0+i*w/(2*n), 1); r.Allowed && i >= 10*2*n {
			allowed++
		}
	}
	rate := float64(allowed) / 10 / n
	t.Logf("sliding counter: worst window on bursty traces %.2f×N; steady 2×N load admits %.3f×N", worst, rate)
	if rate < 0.95 || rate > 1.05 {
		t.Fatalf("steady load admitted %.3f×N per window, want within 5%% of N", rate)
	}
}

// For every algorithm: a denied request retried exactly RetryAfter later
// (nothing else arriving) is admitted, and 1µs earlier it is not. An
// in-flight limit's RetryAfter is that exact time (when enough leases end
// if none is released) capped at MaxInFlightRetry.
func TestModelRetryAfterIsExact(t *testing.T) {
	for _, a := range Algorithms {
		for seed := uint64(0); seed < 30; seed++ {
			rng := rand.New(rand.NewPCG(seed, 6))
			n := 1 + rng.Int64N(20)
			w := 1000 + rng.Int64N(2_000_000)
			l := validated(t, meaningful(Limit{Count: n, Window: FromMicros(w), Algorithm: a, MaxDelay: FromMicros(1 + rng.Int64N(w)), Burst: rng.Int64N(5)}))
			times, costs := randomArrivals(rng, 500, t0, w/int64(n)*3+1, 2)
			var s State
			for i, at := range times {
				next, r := Step(l, s, at, costs[i])
				if !r.Allowed && costs[i] <= capacity(l) {
					ra := int64(r.RetryAfter / time.Microsecond)
					if ra <= 0 {
						t.Fatalf("%v seed %d: denied with RetryAfter %v", a, seed, r.RetryAfter)
					}
					if a == InFlight {
						log := *l
						log.Algorithm = SlidingLog
						_, exact := Step(&log, clone(s), at, costs[i])
						if r.RetryAfter != min(exact.RetryAfter, MaxInFlightRetry) {
							t.Fatalf("in_flight seed %d: RetryAfter %v, want min(%v, %v)", seed, r.RetryAfter, exact.RetryAfter, MaxInFlightRetry)
						}
						ra = int64(exact.RetryAfter / time.Microsecond)
					}
					if _, later := Step(l, clone(s), at+ra, costs[i]); !later.Allowed {
						t.Fatalf("%v seed %d: still denied after RetryAfter %dµs", a, seed, ra)
					}
					if _, early := Step(l, clone(s), at+ra-1, costs[i]); early.Allowed {
						t.Fatalf("%v seed %d: admitted before RetryAfter %dµs", a, seed, ra)
					}
				}
				s = next
			}
		}
	}
}

// capacity is the most cost one request may ask for under l.
func capacity(l *Limit) int64 {
	if l.EffectiveBurst() > 0 {
		return l.EffectiveBurst()
	}
	return l.Count
}

// Reset is when the full quota is back: a probe then sees all of it.
func TestModelResetRestoresFullQuota(t *testing.T) {
	for _, a := range Algorithms {
		rng := rand.New(rand.NewPCG(7, uint64(a)))
		n := 1 + rng.Int64N(20)
		w := 1000 + rng.Int64N(2_000_000)
		l := validated(t, meaningful(Limit{Count: n, Window: FromMicros(w), Algorithm: a, MaxDelay: FromMicros(w / 2)}))
		times, costs := randomArrivals(rng, 300, t0, w/int64(n)*3+1, 2)
		var s State
		_, fresh := Step(l, State{}, t0, 0)
		for i, at := range times {
			var r Result
			s, r = Step(l, s, at, costs[i])
			_, probe := Step(l, clone(s), at+int64(r.Reset/time.Microsecond), 0)
			if probe.Remaining != fresh.Remaining {
				t.Fatalf("%v: after Reset %v remaining %d, a fresh key has %d", a, r.Reset, probe.Remaining, fresh.Remaining)
			}
		}
	}
}

func clone(s State) State {
	if s.Log != nil {
		s.Log = &Ring{Times: append([]int64(nil), s.Log.Times...)}
	}
	return s
}

// Dropping an allowed Step's result (what StoreSide.Apply does when another
// limit denies) leaves the limit exactly as if the request never came.
func TestDroppedStepLeavesNoTrace(t *testing.T) {
	for _, a := range Algorithms {
		rng := rand.New(rand.NewPCG(8, uint64(a)))
		l := validated(t, meaningful(Limit{Count: 5, Window: time.Second, Algorithm: a, MaxDelay: 300 * time.Millisecond}))
		times, costs := randomArrivals(rng, 2000, t0, 400_000, 3)
		var s State
		for i, at := range times {
			wantState, want := Step(l, clone(s), at, 0)
			wantSnap := snapshot(l, wantState)
			next, r := Step(l, s, at, costs[i])
			if rng.IntN(3) > 0 || !r.Allowed {
				s = next
				continue
			}
			var got Result
			s, got = Step(l, Dropped(l, s, next, costs[i]), at, 0)
			if snap := snapshot(l, s); snap != wantSnap || got != want {
				t.Fatalf("%v step %d: a dropped request left a trace: %s %+v, want %s %+v", a, i, snap, got, wantSnap, want)
			}
		}
	}
}

func snapshot(l *Limit, s State) string {
	out := []int64{s.A, s.B, s.C}
	for i := int64(0); i < s.B && (l.Algorithm == SlidingLog || l.Algorithm == InFlight); i++ {
		out = append(out, s.Log.Times[(s.A+i)%l.Count])
	}
	return fmtInts(out)
}

func fmtInts(v []int64) string {
	b := []byte{}
	for _, x := range v {
		b = append(b, []byte(time.Duration(x).String())...)
		b = append(b, ',')
	}
	return string(b)
}

// meaningful drops from l the options its algorithm has not (Normalize
// refuses them): the model's loops over every algorithm set them all.
func meaningful(l Limit) Limit {
	if !l.Algorithm.HasBurst() {
		l.Burst = 0
	}
	if !l.Algorithm.HasMaxDelay() {
		l.MaxDelay = 0
	}
	return l
}
