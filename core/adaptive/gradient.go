package adaptive

import "math"

// Signals are what one gateway node heard of the upstream in one interval
// through one adaptive policy.
type Signals struct {
	// Started is how many requests the policy let through to the upstream;
	// Denied how many it refused (its limit bound).
	Started, Denied int64
	// Answered is how many upstream answers were heard (to requests of this
	// interval or earlier ones); Failed is how many of them failed (5xx, a
	// 429 from the upstream, no answer).
	Answered, Failed int64
	// Latency is the Quantile of the successful answers' latency, in µs
	// (0: none).
	Latency int64
	// Admitted sums, over the requests started, the factor each was let
	// through at: Started × the factor in force, for one node's interval.
	// In a fleet the nodes take a new shared factor up to an interval
	// apart, so one judgement sums requests let through at two factors,
	// and Admitted / Started is the factor they were let through at.
	Admitted float64
	// Stalled counts the nodes whose gateway stalled in the interval
	// (1 for one node that did: see Controller.NoteStall), so what they
	// heard of the upstream is late by the stall.
	Stalled int64
}

// Carried is what one or more judged intervals showed, kept for a later
// judgement: the requests started, the answers that succeeded, and Σ
// factor over the started (see Signals.Admitted). It holds an interval
// waited through after a cut (GradientState.Carried) and a measurement's
// draining intervals (GradientState.DrainSum).
type Carried struct {
	Started, Served int64
	Admitted        float64
}

// GradientState is a gradient controller's state. Its zero value is a
// factor never judged (Gradient treats Factor 0 as 1).
type GradientState struct {
	// Factor is the fraction of the configured counts in force, in
	// [MinFactor, 1].
	Factor float64
	// Growth is what the next healthy interval multiplies the factor by,
	// less 1 (0: Increase; doubling stops at maxGrowth).
	Growth float64
	// Ceiling is the capacity the last congestion measured, as a factor
	// (the share the upstream served; 0: none).
	Ceiling float64
	// MinLatency is the unloaded latency, in µs (0: not measured yet): the
	// latency last measured with the limits held at MinFactor, or any lower
	// interval latency seen since.
	MinLatency int64
	// Measuring is the stage of a measurement of the unloaded latency, the
	// limits held at MinFactor: 0 none, 1 to 4 intervals in which the
	// upstream drains (while it answers more than it is sent), 5 the
	// interval measured. Held is the factor restored after it.
	Measuring int64
	Held      float64
	// LastDrain is the last interval of the measurement in which the
	// upstream drained (answered more than was started) while a paced
	// limit bound (Options.Paced), its Admitted the factor let through at
	// × started; DrainSum sums those before it. Each but the last drained
	// all interval long, so its answers came at the upstream's capacity:
	// the factor restored is at most DrainSum's (LastDrain's if none
	// before it) admitted factor × answers / started × Decrease.
	DrainSum, LastDrain Carried
	// Epoch counts the intervals judged since the last measurement, and
	// Slow those of them congested by latency.
	Epoch, Slow int64
	// Cut is how many intervals are left to wait through after a cut: the
	// next interval shows what the upstream still owed the old factor (a
	// refusal window of its own, a queue), so it neither cuts nor grows.
	// A cut is followed by one such interval, or by two if it was measured
	// over a waited interval (see Carried): a second cut in a row says the
	// upstream remembers longer than an interval.
	Cut int64
	// Peak is the highest capacity confirmed (a factor; 0: none, or grown
	// past): growth stops once there, and probes past it dwell.
	Peak float64
	// Probed counts the clean intervals in a row spent past the Ceiling,
	// the factor held there (see probeDwell).
	Probed int64
	// Carried is what the last interval waited through after a cut (see
	// Cut) showed. If the next interval is congested, the share served is
	// measured over both, so an upstream whose capacity comes in bursts (a
	// window that refills each second) is measured over a burst and the
	// lull after it, not over whichever of the two the judgements keep
	// falling on. Its refusals are left out: they may be the old factor's.
	Carried Carried
	// AfterStall is 1 when the last interval judged noted a gateway's
	// stall (Signals.Stalled), so the next is held too; StallHeld counts
	// the intervals held in a row for stalls (see holdForStall).
	AfterStall, StallHeld int64
	// Judged is when the last interval was judged, in µs.
	Judged int64
	// Pending sums the signals heard since Judged (in the fleet, from every
	// node), with Pending.Latency holding Σ latency × successful answers.
	Pending Signals
}

// holdForStall reports whether an interval goes unjudged for a gateway's
// stall, given whether one was noted in it, whether one was in the
// interval before (afterStall, 0 or 1) and how many intervals in a row
// were held so (held), and returns the two for the next interval. An
// interval in which a gateway stalled is held, its signals dropped: the
// answers the stall delayed are heard late, and read as the upstream's
// latency. So is the next (the requests the stall held back reach the
// upstream at once, and answers it delayed past the interval's end are
// heard there). A third in a row is judged whatever it noted, so a
// gateway that stalls all the time still adapts. Gradient holds so (and
// gradient.lua alike), and the Controller for AIMD, whose shared state
// takes verdicts only.
func holdForStall(stalled bool, afterStall, held int64) (bool, int64, int64) {
	hold := false
	if stalled {
		hold, afterStall = true, 1
	} else if afterStall == 1 {
		hold, afterStall = true, 0
	}
	if hold && held >= 2 {
		hold = false
	}
	if hold {
		held++
	} else {
		held = 0
	}
	return hold, afterStall, held
}

// MeasureEvery is how many intervals the unloaded latency is trusted
// while latency congests the upstream (Envoy's adaptive concurrency filter
// measures its minimum RTT so, at a low concurrency, every minute by
// default): 40, or 20 s at the default interval. A measurement holds the
// limits at MinFactor for two to five intervals (until the upstream has
// drained). The first interval with answers needs none when the policy
// refused nothing and no work piled up in the upstream (its latency is
// then the unloaded one); otherwise a measurement starts at once. Later ones start
// when latency congests an interval after MeasureEvery intervals, or once
// MeasureEvery intervals were congested by latency (an upstream slower for
// good). An upstream whose latency never rises is not measured again.
// The factor held before a measurement is restored after it, for paced
// limits (Options.Paced) no higher than the capacity the upstream showed
// while it drained, less Decrease's margin.
const MeasureEvery = 40

// latencySlack is how far above the unloaded latency, in µs, latency may
// always rise without counting as congestion: 1 ms, the scheduling noise
// of a loaded gateway in front of a sub-millisecond upstream, where
// Tolerance alone would read a pause as a queue.
const latencySlack = 1000

// probeStrictness divides ErrorRate while the factor is past the Ceiling.
const probeStrictness = 4

// probeDwell is how many clean intervals in a row past the Ceiling show
// that the capacity grew.
const probeDwell = 2

// maxGrowth is the most one healthy interval grows the factor by, less 1:
// a growth that doubles on past the capacity overshoots it by as much.
const maxGrowth = 0.5

// measuringStage is GradientState.Measuring's last stage: the interval
// measured, after one to four in which the upstream drained.
const measuringStage = 5

// Gradient is the adaptive rule after the published designs of Envoy's
// adaptive concurrency filter and Netflix's Gradient2 (latency against an
// unloaded latency measured by holding the load low now and then), the
// client-side throttling of Google's SRE book (the upstream's accepts
// measure its capacity) and TCP CUBIC (growth slow near the last capacity,
// fast away from it).
//
// A node adds its interval's signals to the pending sums; the first read
// (a call with no signals) once an interval has passed since the last
// judgement (at 7/8 of its length, as AIMD) judges the sums and clears
// them, so k nodes sharing one state judge the fleet's signals once per
// interval, all of the same interval; without reads, signals judge an
// interval and a half on. A node alone adds and reads at once.
//
// An interval with at least MinSamples answers is congested when more than
// ErrorRate of them failed, when fewer than 1 − ErrorRate of the requests
// started came back while latency rose (work piling up in the upstream;
// before the unloaded latency is known, fewer than that share of those
// started before the interval's last latency, or any shortfall while the
// limit binds), or when its latency is above Tolerance × the unloaded
// latency (and latencySlack above it) or above LatencyTarget while the
// upstream is not draining.
//
// Congested, the factor the interval's requests were let through at
// (Signals.Admitted over Started: in a fleet, not always the one in force)
// is multiplied by the share of the interval's work the upstream served
// (answered − failed over started, or over answered if more; right after
// the interval waited through after a cut, over both), or by the
// latency gradient (bound / latency, at least 0.5) if that is lower, and
// by Decrease, the margin kept below the capacity so measured; the served
// share times that factor is the new Ceiling. Neither is above the factor
// in force: in a fleet the interval waited through after a cut mixes the
// old factor's requests with the new one's, and where the old factor did
// not bind (a first cut, before the limit bound) its admitted factor
// overstates what went through, so a congestion measured over both can
// read a capacity above the factor it was congested at. Such a reading
// confirms no Peak.
// Healthy, it grows by Growth, which doubles each healthy interval (from
// Increase), back to the Ceiling, where it stops once; just past the
// Ceiling (within Increase) or while latency is halfway to its bound, the
// growth stays as it is.
//
// Past the Ceiling the factor probes for more, with care: a quarter of
// ErrorRate failing is congestion there, and a clean interval holds the
// factor for a second look (probeDwell) before the Ceiling is forgotten,
// since an upstream that absorbs a burst (a queue, a token bucket) shows a
// small excess only after a while; forgotten, it grows by the same step
// once more before the step doubles. A congestion of a binding limit by
// such a probe confirms a capacity, and the highest confirmed is the Peak:
// once the Ceiling is forgotten, growth stops once at the Peak, and probes
// past it as past the Ceiling; a clean probe well below the Peak (a
// capacity come back) forgets the Ceiling at once and grows twice as fast.
// The factor stays within [MinFactor, 1].
//
// gradient.lua is its twin, run in Redis on the server's TIME, with the
// same floating-point operations in the same order; TestGradientLuaTwin
// replays both and requires the same state to the bit.
func Gradient(s GradientState, now int64, sig Signals, o Options) GradientState {
	if s.Factor == 0 {
		s.Factor = 1
	}
	s.Pending.Started += sig.Started
	s.Pending.Denied += sig.Denied
	s.Pending.Answered += sig.Answered
	s.Pending.Failed += sig.Failed
	s.Pending.Latency += sig.Latency * (sig.Answered - sig.Failed)
	s.Pending.Admitted += sig.Admitted
	s.Pending.Stalled += sig.Stalled
	// A fleet's nodes send their intervals' signals at the same moment and
	// read the shared factor half an interval later (see Controller.loop):
	// a read, which brings no signals, judges every node's interval at
	// once. Signals judge only if the reads stopped coming (they failed),
	// an interval and a half after a judgement; judging the first node's
	// signals with the others' of the interval before would miss what the
	// interval showed.
	interval := o.Interval.Microseconds()
	since := now - s.Judged
	if since < interval-interval/8 || (sig != (Signals{}) && (s.Judged == 0 || since < interval+interval/2)) {
		return s
	}
	s.Judged = now
	p := s.Pending
	s.Pending = Signals{}
	var hold bool
	if hold, s.AfterStall, s.StallHeld = holdForStall(p.Stalled > 0, s.AfterStall, s.StallHeld); hold {
		return s
	}
	carried := s.Carried
	s.Carried = Carried{}
	latency := int64(0)
	if ok := p.Answered - p.Failed; ok > 0 {
		latency = int64(math.Floor(float64(p.Latency) / float64(ok)))
	}
	enough := p.Answered >= o.MinSamples
	// admitted is the factor the interval's requests were let through at
	// (and the carried interval's).
	admitted := s.Factor
	if started, sum := p.Started+carried.Started, p.Admitted+carried.Admitted; started > 0 && sum > 0 {
		admitted = min(1, sum/float64(started)) // no factor is above 1
	}
	switch {
	case s.Measuring > 0 && s.Measuring < measuringStage:
		// The upstream drains what the held factor sent it: while it
		// answers more than it is sent, for up to three intervals more.
		// Held low, a paced limit that binds lets through the held factor's
		// rate, and a draining upstream answers at its capacity: their
		// ratio is the capacity, which the factor held before the
		// measurement may be well above (a first cut, made while the limit
		// did not bind, measures against what was offered, not the limit).
		if o.Paced && p.Answered > p.Started && p.Denied > 0 && p.Started > 0 {
			s.DrainSum.Started += s.LastDrain.Started
			s.DrainSum.Served += s.LastDrain.Served
			s.DrainSum.Admitted += s.LastDrain.Admitted
			s.LastDrain = Carried{p.Started, p.Answered - p.Failed, admitted * float64(p.Started)}
		}
		if p.Answered > p.Started && s.Measuring < measuringStage-1 {
			s.Measuring++
		} else {
			s.Measuring = measuringStage
		}
		return s
	case s.Measuring == measuringStage:
		// Held low, the policy may see few answers: any will do.
		if latency > 0 {
			s.MinLatency = latency
		}
		d := s.DrainSum
		if d.Started == 0 {
			d = s.LastDrain
		}
		if o.Paced && d.Started > 0 {
			c := d.Admitted / float64(d.Started) * float64(d.Served) / float64(d.Started)
			s.Held = min(s.Held, max(o.MinFactor, c*o.Decrease))
		}
		s.Factor, s.Held, s.Measuring, s.Epoch, s.Slow, s.DrainSum, s.LastDrain = s.Held, 0, 0, 0, 0, Carried{}, Carried{}
		return s
	}
	s.Epoch++
	congested, slow, piling := false, false, false
	served, cut := 1.0, 1.0
	if enough {
		if latency > 0 && latency < s.MinLatency {
			s.MinLatency = latency
		}
		// Past the last capacity measured, a probe: failures there are the
		// capacity showing again, not noise, so a smaller share counts.
		errorRate := o.ErrorRate
		if (s.Ceiling > 0 && s.Factor > s.Ceiling) || (s.Peak > 0 && s.Factor > s.Peak) {
			errorRate /= probeStrictness
		}
		failing := float64(p.Failed) > errorRate*float64(p.Answered)
		// Work piling up counts only while latency rises with it (a rising
		// factor also sends more than comes back, for one latency), and not
		// in the first interval after a measurement (the restored factor
		// fills the upstream anew).
		backlog := float64(p.Answered) < (1-o.ErrorRate)*float64(p.Started)
		if s.MinLatency == 0 {
			// No unloaded latency to compare with: the requests of the
			// interval's last latency cannot have come back yet, so only
			// fewer answers than the rest of them is work piling up, or a
			// backlog while the limit binds (its latency may be a queue's).
			back := max(0, 1-float64(latency)/float64(interval))
			piling = float64(p.Answered) < (1-o.ErrorRate)*back*float64(p.Started) || (backlog && p.Denied > 0)
		} else {
			piling = backlog && s.Epoch > 1 && float64(latency) > 1.1*float64(s.MinLatency)
		}
		congested = failing || piling
		// (Over the carried interval too, its refusals left out.)
		served = float64(p.Answered-p.Failed+carried.Served) / float64(max(p.Started+carried.Started, p.Answered+carried.Served))
		cut = served
		// Latency over a bound while the upstream answers more than it is
		// sent is a queue draining after a cut, not a reason for another.
		tolerated := 0.0
		if s.MinLatency > 0 {
			tolerated = max(o.Tolerance*float64(s.MinLatency), float64(s.MinLatency)+latencySlack)
		}
		for _, bound := range [2]float64{tolerated, float64(o.LatencyTarget.Microseconds())} {
			if bound > 0 && float64(latency) > bound && p.Answered <= p.Started {
				congested, slow = true, true
				cut = min(cut, max(0.5, bound/float64(latency)))
			}
		}
	}
	if slow {
		s.Slow++
	}
	if s.Cut >= 1 {
		if s.Cut == 1 {
			s.Carried = Carried{p.Started, p.Answered - p.Failed, p.Admitted}
		}
		s.Cut--
		return s
	}
	if congested {
		// The capacity is what was served; latency may cut deeper, to
		// drain a queue.
		// A Peak is a capacity confirmed: a binding limit congested by a
		// probe near the last one measured.
		// Both are measured against the factor the interval's requests
		// were let through at, which in a fleet may not be the one in force,
		// and neither is above the one in force (see Gradient).
		measured := admitted * served
		confirmed := p.Denied > 0 && s.Ceiling > 0 && s.Factor <= s.Ceiling*(1+2*o.Increase) && measured <= s.Factor
		s.Ceiling = min(s.Factor, measured)
		if confirmed {
			s.Peak = max(s.Peak, s.Ceiling)
		}
		s.Factor = max(o.MinFactor, min(s.Factor, admitted*cut)*o.Decrease)
		s.Growth, s.Cut, s.Probed = 0, 1, 0
		if carried.Started > 0 {
			s.Cut = 2
		}
	} else {
		probed := s.Probed
		s.Probed = 0
		growth := s.Growth
		if growth == 0 {
			growth = o.Increase
		}
		next := s.Factor * (1 + growth)
		s.Growth = min(maxGrowth, growth*2)
		rising := enough && s.MinLatency > 0 && float64(latency) > (1+o.Tolerance)/2*float64(s.MinLatency)
		clean := enough && p.Failed == 0 && !rising
		// probing is the capacity a probe goes past: the last measured, or
		// once that is forgotten, the highest.
		probing := s.Ceiling
		if probing == 0 {
			probing = s.Peak
		}
		switch {
		case s.Factor < s.Ceiling && next > s.Ceiling:
			next, s.Growth = s.Ceiling, 0
		case s.Ceiling == 0 && s.Factor < s.Peak && next > s.Peak:
			next, s.Growth = s.Peak, 0
		case clean && s.Ceiling > 0 && s.Factor > s.Ceiling*(1+o.Increase/2) && s.Factor < s.Peak*o.Decrease:
			// Clean past the last capacity, well below the highest one: it
			// has grown, perhaps back to the Peak, so growth speeds up.
			s.Ceiling = 0
			next, s.Growth = s.Factor*(1+2*growth), min(maxGrowth, 4*growth)
		case clean && probing > 0 && s.Factor > probing*(1+o.Increase/2):
			// Clean past the capacity: once probeDwell intervals in a row,
			// it has grown, so it is forgotten; until then the factor holds,
			// as an upstream that absorbs a burst shows a small excess only
			// after a while. For the same reason the step past it is taken
			// once more before it doubles: a fleet hears of an excess an
			// interval late, and a doubled step then overshoots by as much.
			s.Probed = probed + 1
			if s.Probed < probeDwell {
				next, s.Growth = s.Factor, growth
			} else if s.Ceiling > 0 {
				s.Ceiling, s.Probed, s.Growth = 0, 0, growth
			} else {
				s.Peak, s.Probed, s.Growth = 0, 0, growth
			}
		case (s.Factor >= s.Ceiling && s.Factor < s.Ceiling*(1+o.Increase)) || rising:
			s.Growth = growth
		}
		s.Factor = min(1, next)
	}
	if enough && latency > 0 && s.MinLatency == 0 && p.Denied == 0 && !piling {
		// The first latency heard with the limit not binding and no work
		// piling up in the upstream is its unloaded latency (failures, if
		// any, are judged apart): nothing to measure.
		s.MinLatency = latency
	}
	if enough && latency > 0 && (s.MinLatency == 0 || (slow && s.Epoch >= MeasureEvery) || s.Slow >= MeasureEvery) {
		s.Held, s.Factor, s.Measuring, s.Cut, s.DrainSum, s.LastDrain = s.Factor, o.MinFactor, 1, 0, Carried{}, Carried{}
	}
	return s
}
