package core

import "math"

// Signals are what one gateway node heard of the upstream in one interval
// through one adaptive policy.
type Signals struct {
	// Started is how many requests the policy let through to the upstream.
	Started int64
	// Answered is how many upstream answers were heard (to requests of this
	// interval or earlier ones); Failed is how many of them failed (5xx, a
	// 429 from the upstream, no answer).
	Answered, Failed int64
	// Latency is the Quantile of the answers' latency, in µs (0: none).
	Latency int64
}

// GradientState is a gradient controller's state. Its zero value is a
// factor never judged (Gradient treats Factor 0 as 1).
type GradientState struct {
	// Factor is the fraction of the configured counts in force, in
	// [MinFactor, 1].
	Factor float64
	// Growth is what the next healthy interval multiplies the factor by,
	// less 1 (0: Increase). It doubles with each healthy interval and falls
	// back to Increase on congestion.
	Growth float64
	// Ceiling is the capacity the last congestion measured, as a factor
	// (what the upstream served; 0: none): growth stops there once, then
	// probes past it from Increase again.
	Ceiling float64
	// MinLatency is the unloaded latency, in µs (0: not measured yet): the
	// latency last measured with the limits held at MinFactor, or any lower
	// interval latency seen since.
	MinLatency int64
	// Measuring is the stage of a minimum-latency measurement with the
	// limits held at MinFactor: 0 none, 1 to 4 intervals in which the
	// upstream drains (while it answers more than it is sent), 5 the
	// interval measured. Held is the factor restored after it; Epoch counts
	// the intervals judged since the last one.
	Measuring int64
	Held      float64
	Epoch     int64
	// Judged is when the last interval was judged, in µs.
	Judged int64
	// Pending sums the signals heard since Judged (in the fleet, from every
	// node), with Pending.Latency holding Σ latency × answered.
	Pending Signals
}

// MeasureEvery is how many intervals pass between two measurements of the
// unloaded latency (Envoy's adaptive concurrency filter measures its
// minimum RTT so, at a low concurrency, every minute by default): 40, or
// 20 s at the default interval. A measurement holds the limits at
// MinFactor for two to five intervals (until the upstream has drained);
// it starts at once the first time the policy has answers to judge, and
// later waits for a healthy interval at or above the last capacity.
const MeasureEvery = 40

// Gradient is the adaptive rule tollgate uses by default, after the
// published designs of Envoy's adaptive concurrency filter and Netflix's
// Gradient2 (latency against an unloaded latency, measured by holding the
// load low now and then) and the client-side throttling of Google's SRE
// book (the upstream's accepts measure its capacity).
//
// A node adds its interval's signals to the pending sums; once an interval
// has passed since the last judgement (at 7/8 of its length, as AIMD), the
// sums are judged and cleared, so k nodes sharing one state judge the
// fleet's signals once per interval. An interval with at least MinSamples
// answers is congested when more than ErrorRate of them failed, when fewer
// than 1 − ErrorRate of the requests started came back (work piling up in
// the upstream), or when its latency is above Tolerance × the unloaded
// latency or above LatencyTarget. Congested, the factor is multiplied by
// the share of the interval's work the upstream served (answered − failed
// over started, or over answered if more), or by the latency gradient
// (bound / latency, at least 0.5) if that is lower, and by Decrease, the
// margin kept below the capacity so measured (the Ceiling). Otherwise it
// grows by Growth, which doubles each healthy interval (from Increase), so
// it returns to the Ceiling in a few intervals, stops there once, and only
// then probes past it, slowly at first, as TCP CUBIC does around its last
// loss. The factor stays within [MinFactor, 1].
//
// gradient.lua is its twin, run in Redis on the server's TIME, with the
// same floating-point operations in the same order; TestGradientLuaTwin
// replays both and requires the same state to the bit.
func Gradient(s GradientState, now int64, sig Signals, o AdaptiveOptions) GradientState {
	if s.Factor == 0 {
		s.Factor = 1
	}
	s.Pending.Started += sig.Started
	s.Pending.Answered += sig.Answered
	s.Pending.Failed += sig.Failed
	s.Pending.Latency += sig.Latency * sig.Answered
	interval := o.Interval.Microseconds()
	if now-s.Judged < interval-interval/8 {
		return s
	}
	s.Judged = now
	p := s.Pending
	s.Pending = Signals{}
	latency := int64(0)
	if p.Answered > 0 {
		latency = int64(math.Floor(float64(p.Latency) / float64(p.Answered)))
	}
	enough := p.Answered >= o.MinSamples && latency > 0
	switch {
	case s.Measuring > 0 && s.Measuring < measuringStage:
		// The upstream drains what the held factor sent it: while it
		// answers more than it is sent, for up to three intervals more.
		if p.Answered > p.Started && s.Measuring < measuringStage-1 {
			s.Measuring++
		} else {
			s.Measuring = measuringStage
		}
		return s
	case s.Measuring == measuringStage:
		if enough {
			s.MinLatency = latency
		}
		s.Factor, s.Held, s.Measuring, s.Epoch = s.Held, 0, 0, 0
		return s
	}
	s.Epoch++
	congested := false
	cut := 1.0
	if enough {
		if latency < s.MinLatency {
			s.MinLatency = latency
		}
		if float64(p.Failed) > o.ErrorRate*float64(p.Answered) || float64(p.Answered) < (1-o.ErrorRate)*float64(p.Started) {
			congested = true
		}
		cut = float64(p.Answered-p.Failed) / float64(max(p.Started, p.Answered))
		// Latency over a bound while the upstream answers more than it is
		// sent is a queue draining after a cut, not a reason for another.
		for _, bound := range [2]float64{o.Tolerance * float64(s.MinLatency), float64(o.LatencyTarget.Microseconds())} {
			if bound > 0 && float64(latency) > bound && p.Answered <= p.Started {
				congested = true
				cut = min(cut, max(0.5, bound/float64(latency)))
			}
		}
	}
	if congested {
		s.Ceiling = s.Factor * cut
		s.Factor = max(o.MinFactor, s.Ceiling*o.Decrease)
		s.Growth = 0
	} else {
		growth := s.Growth
		if growth == 0 {
			growth = o.Increase
		}
		next := s.Factor * (1 + growth)
		s.Growth = min(1, growth*2)
		if s.Factor < s.Ceiling && next > s.Ceiling {
			next, s.Growth = s.Ceiling, 0
		}
		s.Factor = min(1, next)
	}
	// Measure at the start, and then when due at a steady moment (healthy,
	// at or above the last capacity), not while the factor climbs back;
	// twice overdue, at once (an upstream slower for good looks congested
	// until measured).
	steady := !congested && s.Factor >= s.Ceiling
	if enough && (s.MinLatency == 0 || (s.Epoch >= MeasureEvery && steady) || s.Epoch >= 2*MeasureEvery) {
		s.Held, s.Factor, s.Measuring = s.Factor, o.MinFactor, 1
	}
	return s
}

// measuringStage is GradientState.Measuring's last stage: the interval
// measured, after one to four in which the upstream drained.
const measuringStage = 5
