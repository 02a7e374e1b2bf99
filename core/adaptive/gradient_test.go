package adaptive

import (
	"math"
	"testing"
	"time"
)

// gradientOptions are the defaults, filled in as an Controller has them.
func gradientOptions(t *testing.T) Options {
	t.Helper()
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// judge runs Gradient for one whole interval of signals, and the read
// that judges it.
func judge(s GradientState, o Options, sig Signals) GradientState {
	now := s.Judged + o.Interval.Microseconds()
	return Gradient(Gradient(s, now, sig, o), now, Signals{}, o)
}

// hold runs the interval after a cut, whose signals (here only the old
// factor's answers, all failed) neither cut nor grow the factor. Having
// started nothing and served nothing, it carries nothing into the next
// judgement (see TestGradientCutMeasuresOverTheWaitedInterval for what an
// interval that does carries).
func hold(t *testing.T, s GradientState, o Options) GradientState {
	t.Helper()
	next := judge(s, o, Signals{Answered: 100, Failed: 100})
	if s.Cut != 1 || next.Factor != s.Factor || next.Cut != 0 || next.Carried != (Carried{}) {
		t.Fatalf("the interval after a cut: %+v after %+v, want the factor kept", next, s)
	}
	return next
}

// TestGradientCutMeasuresOverTheWaitedInterval: a congested interval right
// after the one waited through after a cut measures the share served over
// both (the waited one's refusals left out), and then waits two intervals;
// an upstream that served the waited interval whole is cut as by the
// judged interval alone.
func TestGradientCutMeasuresOverTheWaitedInterval(t *testing.T) {
	o := gradientOptions(t)
	// A window upstream: a burst served, then a lull refusing everything.
	s := judge(measured, o, Signals{Started: 100, Answered: 100, Failed: 40, Latency: 5000})
	if s.Factor != 0.6*o.Decrease || s.Cut != 1 {
		t.Fatalf("40%% failing: factor %v (cut %d), want %v", s.Factor, s.Cut, 0.6*o.Decrease)
	}
	f := s.Factor
	lull := Signals{Started: 100, Answered: 100, Failed: 100, Admitted: 100 * f}
	smooth := Signals{Started: 100, Answered: 100, Failed: 0, Admitted: 100 * f, Latency: 5000}
	burst := Signals{Started: 100, Answered: 100, Failed: 20, Admitted: 100 * f, Latency: 5000}
	for _, c := range []struct {
		name   string
		waited Signals
		served float64 // the share the cut measures
		wait   int64   // the intervals waited after it
	}{
		{"a lull waited through", lull, 80.0 / 200, 2},
		{"a smooth upstream waited through", smooth, 180.0 / 200, 2},
		{"nothing started while waiting", Signals{Answered: 100, Failed: 100}, 80.0 / 100, 1},
	} {
		w := judge(s, o, c.waited)
		if w.Factor != f || w.Cut != 0 {
			t.Fatalf("%s: factor %v (cut %d), want it kept at %v", c.name, w.Factor, w.Cut, f)
		}
		if want := (Carried{c.waited.Started, c.waited.Answered - c.waited.Failed, c.waited.Admitted}); w.Carried != want {
			t.Fatalf("%s: carried %+v, want %+v", c.name, w.Carried, want)
		}
		next := judge(w, o, burst)
		admitted := min(1, (burst.Admitted+c.waited.Admitted)/float64(burst.Started+c.waited.Started))
		if c.waited.Started == 0 {
			admitted = min(1, burst.Admitted/float64(burst.Started))
		}
		if want := max(o.MinFactor, admitted*c.served*o.Decrease); next.Factor != want || next.Ceiling != admitted*c.served || next.Cut != c.wait {
			t.Fatalf("%s, then 20%% failing: factor %v, ceiling %v (cut %d); want %v, %v (cut %d)",
				c.name, next.Factor, next.Ceiling, next.Cut, want, admitted*c.served, c.wait)
		}
		if next.Carried != (Carried{}) {
			t.Fatalf("%s: carried %+v after the judgement that used it, want none", c.name, next.Carried)
		}
		for i := next.Cut; i > 0; i-- {
			after := judge(next, o, burst)
			if after.Factor != next.Factor || after.Cut != i-1 {
				t.Fatalf("%s: waited interval %d after the cut: factor %v (cut %d), want %v (cut %d)", c.name, c.wait-i+1, after.Factor, after.Cut, next.Factor, i-1)
			}
			next = after
		}
	}
}

// TestGradientCongestionNeverRaisesTheFactor: in a fleet, the interval
// waited through after a cut mixes requests let through at the old factor
// (before the nodes read the new one, halfway) with the new factor's.
// Where the old factor did not bind (a first cut, 3C offered against a 4C
// limit), its admitted factor overstates what went through, and a
// congestion measured over both (the carried interval) reads a capacity
// above the factor it was congested at. Such a congestion still cuts from
// the factor in force, measures no capacity above it, and confirms no
// Peak: a Peak so set made every later probe grow twice as fast towards
// it (the fleet's failing runs).
func TestGradientCongestionNeverRaisesTheFactor(t *testing.T) {
	o := gradientOptions(t)
	// The first interval: 150 started at factor 1, not binding, 50 served.
	s := judge(measured, o, Signals{Started: 150, Answered: 150, Failed: 100, Latency: 5000, Admitted: 150})
	f := s.Factor
	if want := 50.0 / 150 * o.Decrease; f != want || s.Cut != 1 {
		t.Fatalf("the first cut: factor %v (cut %d), want %v", f, s.Cut, want)
	}
	// Waited through: 80 at the old factor, 40 at the new one.
	s = judge(s, o, Signals{Started: 120, Answered: 120, Failed: 60, Latency: 5000, Admitted: 80 + 40*f})
	if s.Factor != f || s.Carried.Started != 120 {
		t.Fatalf("the waited interval: %+v, want the factor kept and the interval carried", s)
	}
	// Congested at the new factor, binding: over both intervals the share
	// served times the admitted factor reads above f.
	next := judge(s, o, Signals{Started: 60, Denied: 90, Answered: 60, Failed: 9, Latency: 5000, Admitted: 60 * f})
	admitted := (80 + 40*f + 60*f) / 180
	if read := admitted * (60 + 51) / 180; read <= f {
		t.Fatalf("the trace reads %v over both intervals, want above the factor %v (fix the trace)", read, f)
	}
	if next.Factor != f*o.Decrease || next.Ceiling != f || next.Peak != 0 || next.Cut != 2 {
		t.Fatalf("congested at %v: factor %v, ceiling %v, peak %v (cut %d); want %v, %v, 0 (cut 2)",
			f, next.Factor, next.Ceiling, next.Peak, next.Cut, f*o.Decrease, f)
	}
}

func TestGradientDefaults(t *testing.T) {
	o := gradientOptions(t)
	if o.Controller != ControllerGradient || o.Interval != 500*time.Millisecond || o.Decrease != 0.95 || o.Increase != 0.05 || o.Tolerance != 1.5 {
		t.Fatalf("defaults %+v", o)
	}
}

// measured is a state whose unloaded latency (5ms) is known, so no
// measurement starts.
var measured = GradientState{Factor: 1, MinLatency: 5000}

// TestGradientCutsToWhatWasServed: failures cut the factor to the share of
// the interval's work the upstream served, less the margin, in one step;
// the next interval (what the upstream owed the old factor) changes
// nothing; healthy intervals then grow it by a growth that doubles each
// time, up to the capacity measured (the Ceiling) once, then past it from
// Increase, where the factor holds for a second clean interval before the
// Ceiling is forgotten.
func TestGradientCutsToWhatWasServed(t *testing.T) {
	o := gradientOptions(t)
	s := judge(measured, o, Signals{Started: 300, Answered: 300, Failed: 200, Latency: 5000})
	if want := 1.0 / 3 * 0.95; s.Factor != want || s.Ceiling != 1.0/3 {
		t.Fatalf("a third served: factor %v ceiling %v, want %v and 1/3", s.Factor, s.Ceiling, want)
	}
	if s.Peak != 0 {
		t.Fatalf("peak %v after a limit that refused nothing, want none: only a binding limit measures a capacity", s.Peak)
	}
	s = hold(t, s, o)
	f := s.Factor
	s = judge(s, o, Signals{Started: 100, Answered: 100, Latency: 5000})
	if f *= 1.05; s.Factor != f {
		t.Fatalf("first healthy interval: factor %v, want %v", s.Factor, f)
	}
	s = judge(s, o, Signals{Started: 100, Answered: 100, Latency: 5000})
	if s.Factor != 1.0/3 {
		t.Fatalf("second healthy interval: factor %v, want it held at the ceiling 1/3", s.Factor)
	}
	// Just past the ceiling the growth stays at Increase; a clean interval
	// there (no failure, latency flat) holds the factor, and a second one
	// shows the capacity grew: the ceiling is forgotten, the factor grows
	// by the same step once more, and then the growth doubles again.
	f = s.Factor
	for i, growth := range []float64{1.05, 1, 1.05, 1.05, 1.1} {
		s = judge(s, o, Signals{Started: 100, Answered: 100, Latency: 5000})
		if f *= growth; s.Factor != f {
			t.Fatalf("healthy interval %d past the ceiling: factor %v, want %v", i, s.Factor, f)
		}
		if want := int64(map[bool]int{true: 1}[i == 1]); s.Probed != want {
			t.Fatalf("healthy interval %d past the ceiling: %d clean intervals probed, want %d", i, s.Probed, want)
		}
	}
	if s.Ceiling != 0 {
		t.Fatalf("ceiling %v after clean intervals past it, want it forgotten", s.Ceiling)
	}
	// A share of failures under ErrorRate is no congestion.
	s = judge(s, o, Signals{Started: 100, Answered: 100, Failed: 4, Latency: 5000})
	if want := min(1, f*1.2); s.Factor != want {
		t.Fatalf("4%% failing: factor %v, want growth to %v", s.Factor, want)
	}
}

// TestGradientProbesPastTheCapacityWithCare: past the capacity measured, a
// quarter of ErrorRate failing is congestion (below it, it is not); a
// binding limit's congestion records the highest capacity measured (the
// Peak), where growth stops once and past which a probe dwells as past the
// Ceiling; a clean probe well below the Peak forgets the Ceiling at once
// and grows faster, back towards it.
func TestGradientProbesPastTheCapacityWithCare(t *testing.T) {
	o := gradientOptions(t)
	// Half served, the limit binding: the Ceiling is 0.5. A first
	// capacity measured is no Peak yet: the factor was not near one.
	s := judge(measured, o, Signals{Started: 100, Denied: 50, Answered: 100, Failed: 50, Latency: 5000})
	if s.Ceiling != 0.5 || s.Peak != 0 {
		t.Fatalf("half served by a binding limit: ceiling %v, peak %v, want 0.5 and none", s.Ceiling, s.Peak)
	}
	// The probe at the ceiling, congested by the same capacity: the Peak.
	s = hold(t, s, o)
	s.Factor = 0.5
	s = judge(s, o, Signals{Started: 100, Denied: 50, Answered: 100, Failed: 50, Latency: 5000})
	if s.Ceiling != 0.25 || s.Peak != 0.25 {
		t.Fatalf("half served at the ceiling: ceiling %v, peak %v, want 0.25 and 0.25", s.Ceiling, s.Peak)
	}
	s = hold(t, s, o)
	s.Factor, s.Ceiling, s.Peak = 0.475, 0.5, 0.5
	f := s.Factor // 0.475
	s = judge(s, o, Signals{Started: 100, Answered: 100, Failed: 2, Latency: 5000})
	if s.Factor != f*1.05 || s.Cut != 0 {
		t.Fatalf("2%% failing under the ceiling: factor %v (cut %d), want growth to %v", s.Factor, s.Cut, f*1.05)
	}
	s = judge(s, o, Signals{Started: 100, Answered: 100, Latency: 5000})
	if s.Factor != 0.5 {
		t.Fatalf("healthy: factor %v, want it stopped at the ceiling 0.5", s.Factor)
	}
	s = judge(s, o, Signals{Started: 100, Answered: 100, Latency: 5000})
	if f = s.Factor; f != 0.5*1.05 {
		t.Fatalf("healthy at the ceiling: factor %v, want %v", f, 0.5*1.05)
	}
	s = judge(s, o, Signals{Started: 100, Answered: 100, Failed: 2, Latency: 5000})
	if want := f * 0.98 * 0.95; s.Factor != want || s.Cut != 1 {
		t.Fatalf("2%% failing past the ceiling: factor %v (cut %d), want a cut to %v", s.Factor, s.Cut, want)
	}
	if s.Peak != 0.5 {
		t.Fatalf("peak %v after a cut by a limit that refused nothing, want it kept at 0.5", s.Peak)
	}
	// The capacity halves: a binding limit measures a Ceiling of 0.25,
	// the Peak stays 0.5.
	s = hold(t, s, o)
	f = s.Factor
	s = judge(s, o, Signals{Started: 200, Denied: 10, Answered: 200, Failed: 100, Latency: 5000})
	if s.Ceiling != f*0.5 {
		t.Fatalf("half served: ceiling %v, want %v", s.Ceiling, f*0.5)
	}
	if s.Peak != 0.5 {
		t.Fatalf("peak %v, want it kept at 0.5", s.Peak)
	}
	s = hold(t, s, o)
	healthy := Signals{Started: 100, Answered: 100, Latency: 5000}
	for s.Factor < s.Ceiling {
		s = judge(s, o, healthy)
	}
	ceiling := s.Ceiling
	s = judge(s, o, healthy) // at the ceiling: past it by Increase
	s = judge(s, o, healthy) // clean past it, well below the Peak
	if f = ceiling * 1.05; s.Ceiling != 0 || s.Factor != f*1.1 || s.Growth != 0.2 {
		t.Fatalf("clean past the ceiling, well below the peak: factor %v, ceiling %v, growth %v; want %v, forgotten and 0.2", s.Factor, s.Ceiling, s.Growth, f*1.1)
	}
	for s.Factor < 0.5 {
		s = judge(s, o, healthy)
	}
	if s.Factor != 0.5 {
		t.Fatalf("growing back: factor %v, want it stopped at the peak 0.5", s.Factor)
	}
	s = judge(s, o, healthy)
	f = s.Factor
	s = judge(s, o, healthy)
	if s.Factor != f || s.Probed != 1 || s.Peak != 0.5 {
		t.Fatalf("one clean interval past the peak: factor %v (probed %d, peak %v), want it held at %v", s.Factor, s.Probed, s.Peak, f)
	}
	s = judge(s, o, healthy)
	if s.Factor <= f || s.Peak != 0 {
		t.Fatalf("two clean intervals past the peak: factor %v, peak %v; want growth and the peak forgotten", s.Factor, s.Peak)
	}
}

// TestGradientWatchesLatencyAndWorkInFlight: with no failure at all, an
// interval whose latency is over Tolerance × the unloaded latency cuts the
// factor by the gradient (bound/latency), or by the share of the started
// work that came back if the upstream piles it up; while the upstream
// drains (answers more than it is sent) latency alone cuts nothing.
func TestGradientWatchesLatencyAndWorkInFlight(t *testing.T) {
	o := gradientOptions(t)
	s := GradientState{Factor: 0.9, MinLatency: 10_000}
	s = judge(s, o, Signals{Started: 100, Answered: 100, Latency: 20_000}) // 15ms allowed: gradient 0.75
	if want := 0.9 * 0.75; s.Factor != want*0.95 {
		t.Fatalf("latency 2× unloaded: factor %v, want %v", s.Factor, want*0.95)
	}
	s = hold(t, s, o)
	f := s.Factor
	s = judge(s, o, Signals{Started: 100, Answered: 60, Latency: 16_000}) // gradient 0.9375, 60% came back
	if want := f * 0.6 * 0.95; s.Factor != want {
		t.Fatalf("work piling up: factor %v, want %v", s.Factor, want)
	}
	s = hold(t, s, o)
	f = s.Factor
	s = judge(s, o, Signals{Started: 100, Answered: 100, Latency: 100_000}) // the gradient's floor is 0.5
	if want := max(o.MinFactor, f*0.5*0.95); s.Factor != want {
		t.Fatalf("latency 10× unloaded: factor %v, want %v", s.Factor, want)
	}
	s = hold(t, s, o)
	f = s.Factor
	s = judge(s, o, Signals{Started: 50, Answered: 100, Latency: 100_000})
	if want := f * 1.05; s.Factor != want {
		t.Fatalf("draining: factor %v, want growth to %v", s.Factor, want)
	}
	// Too few answers say nothing: the factor grows.
	f = s.Factor
	s = judge(s, o, Signals{Started: 5, Answered: 5, Failed: 5, Latency: 900_000})
	if s.Factor <= f {
		t.Fatalf("5 answers: factor %v, want growth from %v", s.Factor, f)
	}
}

// TestGradientMeasuresUnloadedLatency: the first interval with answers
// starts a measurement: the limits are held at MinFactor while the
// upstream drains (it answers more than it is sent, at most four
// intervals), the next interval's latency becomes the unloaded latency,
// and the factor comes back. The next measurement is due MeasureEvery
// intervals later, at a healthy moment, so an upstream that became slower
// for good is believed then.
func TestGradientMeasuresUnloadedLatency(t *testing.T) {
	o := gradientOptions(t)
	var s GradientState
	s = judge(s, o, Signals{Started: 140, Answered: 40, Latency: 100_000})
	if s.Measuring != 1 || s.Factor != o.MinFactor || s.Held == 0 {
		t.Fatalf("first judgement: %+v, want a measurement at MinFactor", s)
	}
	held := s.Held
	s = judge(s, o, Signals{Started: 20, Answered: 50, Latency: 900_000}) // draining
	s = judge(s, o, Signals{Started: 20, Answered: 50, Latency: 600_000}) // draining
	if s.Measuring != 3 {
		t.Fatalf("while draining: stage %d, want 3", s.Measuring)
	}
	s = judge(s, o, Signals{Started: 20, Answered: 20, Latency: 150_000}) // drained
	s = judge(s, o, Signals{Started: 20, Answered: 20, Latency: 100_000}) // measured
	if s.Measuring != 0 || s.MinLatency != 100_000 || s.Factor != held {
		t.Fatalf("after measuring: %+v, want 100ms unloaded and the factor %v back", s, held)
	}
	// The upstream becomes three times slower for good: congested until
	// the next measurement believes it.
	congested := 0
	for i := 0; i < 3*MeasureEvery && s.MinLatency != 300_000; i++ {
		s = judge(s, o, Signals{Started: 100, Answered: 100, Latency: 300_000})
		if s.Growth == 0 && s.Measuring == 0 {
			congested++
		}
	}
	if s.MinLatency != 300_000 || congested > 2*MeasureEvery {
		t.Fatalf("after %d congested intervals: %+v, want 300ms believed unloaded within two measurement periods", congested, s)
	}
}

// drainTrace is a first interval in which a rate limit of 4C did not bind
// (3C offered, a third of it served: the cut measures the share of what
// was offered, a factor of a third, above the capacity of a quarter), then
// a measurement: whole intervals held at MinFactor (0.1: 20 started, the
// rest refused) while the upstream drains at C (50 answers an interval),
// one that runs dry partway, one drained, and the one measured.
func drainTrace(whole int) []Signals {
	trace := []Signals{{Started: 150, Answered: 50, Latency: 100_000, Admitted: 150}}
	for range whole {
		trace = append(trace, Signals{Started: 20, Denied: 130, Answered: 50, Latency: 900_000, Admitted: 2})
	}
	return append(trace,
		Signals{Started: 20, Denied: 130, Answered: 30, Latency: 600_000, Admitted: 2},
		Signals{Started: 20, Denied: 130, Answered: 20, Latency: 150_000, Admitted: 2},
		Signals{Started: 20, Denied: 130, Answered: 20, Latency: 100_000, Admitted: 2})
}

// TestGradientRestoresAtMostTheDrainedCapacity: a cut made while a paced
// limit did not bind can leave the factor above the upstream's capacity;
// the measurement that follows shows the capacity (a binding paced limit
// starts the held factor's rate, a draining upstream answers at its
// capacity), and the factor restored after it is at most that, less
// Decrease's margin. The interval that ran dry partway counts only if no
// other drained.
func TestGradientRestoresAtMostTheDrainedCapacity(t *testing.T) {
	for _, tc := range []struct {
		name   string
		paced  bool
		trace  []Signals
		factor func(held, decrease float64) float64
	}{
		// Two intervals drained all interval long: 0.1 × 100/40.
		{"paced", true, drainTrace(2), func(_, d float64) float64 { return 0.25 * d }},
		// One drained before the last: 0.1 × 50/20 again.
		{"paced, one whole interval", true, drainTrace(1), func(_, d float64) float64 { return 0.25 * d }},
		// Only the last drained (ran dry): it is all there is, 0.1 × 30/20.
		{"paced, only the last", true, drainTrace(0), func(_, d float64) float64 { return 0.15 * d }},
		// An in-flight limit starts as many as come back, which measures
		// nothing: the factor held comes back whole.
		{"in flight", false, drainTrace(2), func(held, _ float64) float64 { return held }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := gradientOptions(t)
			o.Paced = tc.paced
			var s GradientState
			s = judge(s, o, tc.trace[0])
			held := s.Held
			if s.Measuring != 1 || held <= 0.3 {
				t.Fatalf("first judgement: %+v, want a measurement holding a factor above a third × Decrease", s)
			}
			for _, sig := range tc.trace[1:] {
				s = judge(s, o, sig)
			}
			if want := min(held, tc.factor(held, o.Decrease)); s.Measuring != 0 || math.Abs(s.Factor-want) > 1e-12 {
				t.Fatalf("after measuring: %+v, want the factor %v (held %v)", s, want, held)
			}
			if s.DrainSum != (Carried{}) || s.LastDrain != (Carried{}) {
				t.Fatalf("after measuring: %+v, want the drain's sums cleared", s)
			}
		})
	}
}

// TestGradientJudgesOncePerInterval: signals wait in Pending; the first
// read (a call with no signals) once an interval has passed (7/8 of it)
// judges them together, as a fleet's nodes read the shared factor half an
// interval after all of them sent their signals. Signals themselves judge
// only once reads stopped coming, an interval and a half on.
func TestGradientJudgesOncePerInterval(t *testing.T) {
	o := gradientOptions(t)
	s := measured
	s.Judged = 1_000_000 // the last judgement
	s = Gradient(s, 1_000_000, Signals{Started: 50, Answered: 50, Latency: 1000}, o)
	s = Gradient(s, 1_100_000, Signals{Started: 50, Answered: 50, Failed: 50, Latency: 1000}, o)
	s = Gradient(s, 1_300_000, Signals{}, o)
	s = Gradient(s, 1_300_000, Signals{Started: 50, Answered: 50, Failed: 50, Latency: 1000}, o)
	if s.Factor != 1 || s.Pending.Answered != 150 || s.Pending.Failed != 100 {
		t.Fatalf("within one interval: %+v", s)
	}
	s = Gradient(s, 1_440_000, Signals{Started: 100, Answered: 100, Latency: 1000}, o)
	if s.Factor != 1 || s.Pending.Answered != 250 {
		t.Fatalf("signals at 7/8 of the interval: %+v, want them added, not judged", s)
	}
	s = Gradient(s, 1_440_000, Signals{}, o)
	if want := 0.6 * 0.95; s.Factor != want || s.Pending != (Signals{}) || s.Judged != 1_440_000 {
		t.Fatalf("a read at 7/8 of the interval: %+v, want factor %v", s, want)
	}
	// No read comes: signals judge an interval and a half on.
	s = Gradient(s, 1_440_000+o.Interval.Microseconds(), Signals{Started: 100, Answered: 100, Failed: 100, Latency: 1000}, o)
	if s.Judged != 1_440_000 {
		t.Fatalf("signals an interval on, no read: %+v, want them added", s)
	}
	late := 1_440_000 + 3*o.Interval.Microseconds()/2
	s = Gradient(s, late, Signals{Started: 100, Answered: 100, Failed: 100, Latency: 1000}, o)
	if s.Judged != late || s.Pending != (Signals{}) {
		t.Fatalf("signals an interval and a half on, no read: %+v, want them judged", s)
	}
}

// TestAdaptiveGradientSettlesAtCapacity runs the default controller against
// a model upstream that fails the share of requests above its capacity X,
// offered 3X: after settling, the upstream serves at least 0.9X a second
// on average and at most 5% of what reaches it fails.
func TestAdaptiveGradientSettlesAtCapacity(t *testing.T) {
	const count, capacity, offered = 1000.0, 300.0, 900.0
	a := newTestController(t, Options{Controller: ControllerGradient})
	var served, failed float64
	for i := 0; i < 120; i++ {
		rate := min(offered, count*a.Factor())
		for j := 0; j < int(rate); j++ {
			a.Start()
			status := 200
			if float64(j) >= capacity {
				status = 503
			}
			a.Observe(status, time.Millisecond)
			if i >= 10 {
				served += map[bool]float64{true: 1}[status == 200]
				failed += map[bool]float64{true: 1}[status != 200]
			}
		}
		a.Judge()
	}
	if goodput := served / 110; goodput < 0.9*capacity {
		t.Fatalf("goodput %.0f per interval, want at least 0.9 × %v", goodput, capacity)
	}
	if share := failed / (served + failed); share > 0.05 {
		t.Fatalf("%.1f%% failing, want at most 5%%", 100*share)
	}
}

// TestGradientFirstLatencyNeedsNoMeasurement: a policy whose first busy
// interval refused nothing and piled nothing up takes that interval's
// latency as the unloaded one (failures are judged apart), so a healthy
// gateway never holds its limits low to measure; a policy that refused
// requests (its limit binds, as an in-flight limit in front of a queue)
// measures first.
func TestGradientFirstLatencyNeedsNoMeasurement(t *testing.T) {
	o := gradientOptions(t)
	s := judge(GradientState{}, o, Signals{Started: 100, Answered: 100, Failed: 50, Latency: 20_000})
	if s.Measuring != 0 || s.MinLatency != 20_000 || s.Factor != 0.5*0.95 {
		t.Fatalf("first interval, half failing, nothing refused: %+v, want 20ms unloaded, the factor cut, no measurement", s)
	}
	s = judge(GradientState{}, o, Signals{Started: 40, Denied: 260, Answered: 40, Latency: 400_000})
	if s.Measuring != 1 || s.MinLatency != 0 || s.Factor != o.MinFactor {
		t.Fatalf("first interval with refusals: %+v, want a measurement at MinFactor", s)
	}
	// A healthy upstream 100 ms away cannot have answered the requests of
	// the interval's last 100 ms (a fifth of its 500 ms): that is no work
	// piling up, so nothing is cut and nothing measured.
	s = judge(GradientState{}, o, Signals{Started: 100, Answered: 80, Latency: 100_000})
	if s.Measuring != 0 || s.MinLatency != 100_000 || s.Factor != 1 || s.Cut != 0 {
		t.Fatalf("first interval, the last latency's requests out: %+v, want 100ms unloaded, the factor kept at 1", s)
	}
	// Fewer answers than that is work piling up: a cut and a measurement.
	s = judge(GradientState{}, o, Signals{Started: 100, Answered: 70, Latency: 100_000})
	if want := 0.7 * o.Decrease; s.Measuring != 1 || s.Factor != o.MinFactor || s.Held != want {
		t.Fatalf("first interval, answers missing beyond the last latency's: %+v, want the factor cut to 0.665 and held for a measurement", s)
	}
}

// TestGradientLatencySlack: in front of a sub-millisecond upstream, latency
// within latencySlack (1 ms) of the unloaded latency is a loaded gateway's
// scheduling noise, not a queue: 4.5× the unloaded 200 µs cuts nothing,
// and 1.5 ms above it does.
func TestGradientLatencySlack(t *testing.T) {
	o := gradientOptions(t)
	s := judge(GradientState{Factor: 0.5, MinLatency: 200}, o, Signals{Started: 100, Answered: 100, Latency: 900})
	if s.Factor != 0.5*1.05 {
		t.Fatalf("900 µs over an unloaded 200 µs: factor %v, want growth to %v", s.Factor, 0.5*1.05)
	}
	s = judge(GradientState{Factor: 0.5, MinLatency: 200}, o, Signals{Started: 100, Answered: 100, Latency: 1700})
	f, bound := 0.5, 1200.0 // the bound: 200 µs + the 1 ms slack
	if want := f * (bound / 1700) * 0.95; s.Factor != want {
		t.Fatalf("1.7 ms over an unloaded 200 µs: factor %v, want %v", s.Factor, want)
	}
}

// newTestController returns a controller whose ticker never fires: tests
// end intervals with Judge.
func newTestController(t *testing.T, o Options) *Controller {
	t.Helper()
	o.Interval = time.Hour
	a, err := NewJudged(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// TestGradientMeasuresAtTheFactorItsRequestsCameThrough: in a fleet the
// nodes take a new shared factor up to an interval apart, so one judgement
// sums requests let through at two factors. The capacity is the share
// served times the factor they came through at (Signals.Admitted over
// Started), not the one in force: here half the requests came through at
// 0.4 and half at 0.8, so 0.6, and the upstream served two thirds of them.
func TestGradientMeasuresAtTheFactorItsRequestsCameThrough(t *testing.T) {
	o := gradientOptions(t)
	s := measured
	s.Factor = 0.4
	lagging := Signals{Started: 150, Answered: 150, Failed: 50, Latency: 5000, Admitted: 150 * 0.8}
	current := Signals{Started: 150, Answered: 150, Failed: 50, Latency: 5000, Admitted: 150 * 0.4}
	s = Gradient(s, s.Judged+o.Interval.Microseconds()/2, lagging, o) // not yet an interval: summed
	s = judge(s, o, current)
	admitted := (150*0.8 + 150*0.4) / 300
	if want := admitted * (200.0 / 300); s.Ceiling != want {
		t.Fatalf("ceiling %v, want %v: two thirds of what came through at %v", s.Ceiling, want, admitted)
	}
	if want := admitted * (200.0 / 300) * o.Decrease; s.Factor != want {
		t.Fatalf("factor %v, want %v", s.Factor, want)
	}
	// Signals that do not say (Admitted 0) came through at the factor in force.
	plain := measured
	plain.Factor = 0.4
	plain = judge(plain, o, Signals{Started: 300, Answered: 300, Failed: 100, Latency: 5000})
	if want := 0.4 * (200.0 / 300); plain.Ceiling != want {
		t.Fatalf("ceiling %v without Admitted, want %v", plain.Ceiling, want)
	}
}
