package algo

import (
	"math"
	"time"
)

// State is what a store keeps for one limit of one key. Its zero value is a
// key never seen. The meaning of A, B and C depends on the algorithm:
//
//	FixedWindow     A window start (µs), B count in it
//	SlidingCounter  A current window start (µs), B its count, C previous window's count
//	SlidingLog      A ring head, B entries held, Log the ring of request times (µs)
//	TokenBucket     A deficit (tokens missing × Window in µs), B last update (µs)
//	GCRA            A theoretical arrival time (µs), B its fraction in 1/Count µs
//	LeakyBucket     as GCRA: when the next request would be released
//	Penalty         A window start (µs), B denials counted in it, C when the box ends (µs)
type State struct {
	A, B, C int64
	// Log is SlidingLog's ring of Count request times, shared by the states
	// Step takes and returns. Step writes only outside the live part of the
	// state it returns. It is a pointer so a State stays 32 bytes, half a
	// cache line, for the algorithms that do not need it.
	Log *Ring
}

// Ring is a sliding log's buffer of request times in µs.
type Ring struct {
	Times []int64
}

// Result is one limit's verdict on one request.
type Result struct {
	// Allowed reports whether the limit admits the request.
	Allowed bool
	// Quota is the limit's Count.
	Quota int64
	// Remaining is how many more units of cost the limit admits right now
	// (after this request, if it was allowed).
	Remaining int64
	// Reset is how long until the limit's full quota is available again.
	Reset time.Duration
	// RetryAfter, when the request is denied, is how long until the same
	// request would be admitted (if nothing else arrives). A request costing
	// more than the limit can ever admit gets the limit's Window.
	RetryAfter time.Duration
	// Delay, for LeakyBucket, is how long the caller must hold an allowed
	// request before passing it on.
	Delay time.Duration
}

// Dropped returns the state to keep for limit l when a request of cost that
// Step allowed (turning before into after) is not committed, because another
// limit of the stack denied it. Step it with cost 0 to report on it.
func Dropped(l *Limit, before, after State, cost int64) State {
	if l.Algorithm == SlidingLog || l.Algorithm == InFlight {
		// after's ring has already forgotten what expired, and before's
		// expired slots may now hold this request's times: keep after's view
		// without the request's entries, which are the newest.
		after.B -= cost
		return after
	}
	return before
}

// Step applies one request of cost units arriving at now (µs) to the state s
// of limit l, and returns the state after it and the verdict. It does not
// change s's fields, but a SlidingLog ring slot that s holds and that has
// expired by now may be overwritten: a caller that drops an allowed result
// keeps Dropped(l, s, returned, cost) (StoreSide.Apply does). A denied request's
// returned state only forgets expired history. l must have been validated (a
// Policy validates its limits).
func Step(l *Limit, s State, now, cost int64) (State, Result) {
	var r Result
	s = StepInto(l, s, now, cost, &r)
	return s, r
}

// StepInto is Step writing the verdict to *r. Returned together, the state and
// the verdict (ten words) would not fit in registers and were copied
// through two stack frames per decision, a quarter of a one-key decision's
// time in the memory store; so each algorithm's step function writes its
// verdict where its caller keeps it. It picks the step function from a
// table, not a switch, so that it is small enough to inline into its
// callers: one call per decision, not two.
func StepInto(l *Limit, s State, now, cost int64, r *Result) State {
	return steps[l.Algorithm%numSteps](l, s, now, cost, r)
}

// stepFunc is an algorithm's step function.
type stepFunc func(l *Limit, s State, now, cost int64, r *Result) State

// numSteps is the size of steps: a power of two above every Algorithm.
const numSteps = 16

// steps holds each algorithm's step function at its Algorithm; an
// algorithm without one (the zero value) allows nothing and reports the
// limit's count.
var steps = [numSteps]stepFunc{
	0:              stepUnknown,
	FixedWindow:    stepFixedWindow,
	SlidingLog:     stepSlidingLog,
	SlidingCounter: stepSlidingCounter,
	TokenBucket:    stepTokenBucket,
	GCRA:           stepGCRA,
	LeakyBucket:    stepLeakyBucket,
	InFlight:       stepInFlight,
	Penalty:        func(l *Limit, s State, now, _ int64, r *Result) State { return stepPenalty(l, s, now, r) },
	9:              stepUnknown, 10: stepUnknown, 11: stepUnknown, 12: stepUnknown, 13: stepUnknown, 14: stepUnknown, 15: stepUnknown,
}

func stepUnknown(l *Limit, s State, _, _ int64, r *Result) State {
	*r = Result{Quota: l.Count}
	return s
}

// Charge takes cost units (at most MaxCharge) from the state s of limit l
// at now (µs) whether or not the limit has them, as a response's cost is
// charged once the request was let through (Limit.AfterResponse): the
// limit may be overdrawn, and then refuses until it has recovered as if
// the units had been admitted. A SlidingLog keeps only its newest Count
// times, which tell when a request next fits. l must have been validated
// and must not be a LeakyBucket or InFlight limit (Normalize refuses
// AfterResponse for them).
func Charge(l *Limit, s State, now, cost int64) State {
	cost = min(max(cost, 0), l.MaxCharge())
	w, n := l.windowUS, l.Count
	switch l.Algorithm {
	case FixedWindow:
		start := windowStart(now, w)
		if l.months != 0 {
			start, _ = calendarBounds(now, l.months)
		}
		if s.A != start {
			s.A, s.B = start, 0
		}
		s.B += cost
	case SlidingCounter:
		s = counterWindows(s, windowStart(now, w), w)
		s.B += cost
	case SlidingLog:
		s = expireLog(s, now, w)
		// The newest n times: older ones leave before any of them, so they
		// never decide when a request fits. As in the step, the ring grows
		// by doubling and the times are written outside its live part.
		if drop := s.B + cost - n; drop > 0 {
			s.A = (s.A + drop) % int64(len(s.Log.Times))
			s.B -= drop
		}
		s = appendLog(s, n, now, cost)
	case TokenBucket:
		var r Result
		s = stepTokenBucket(l, s, now, 0, &r) // refilled to now
		s.A += cost * w
	case GCRA:
		tatUS, tatFrac := gcraAdvance(s, now, w, n, cost)
		s = State{A: tatUS, B: tatFrac}
	}
	return s
}

// Check is how a limit charged after the response (Limit.AfterResponse)
// sees a request arriving: it passes while the limit has a unit left (a
// request of cost min(cost, 1) would be allowed) and is charged nothing.
// It returns the state to keep (expired history forgotten) and writes the
// verdict to *r, with what the limit still has (as a request of cost 0
// sees it) when it passes.
func Check(l *Limit, s State, now, cost int64, r *Result) State {
	probe := min(cost, 1)
	after := StepInto(l, s, now, probe, r)
	if !r.Allowed {
		return after
	}
	if l.Algorithm == SlidingLog {
		// after's ring forgot what expired; the probe's times are its newest.
		after.B -= probe
		s = after
	}
	return StepInto(l, s, now, 0, r)
}

// stepPenalty refuses every request while the key is in the box, with
// RetryAfter the box's end, and otherwise lets it through, reporting as
// Remaining how many more denials the window takes before the box (and
// as Reset when its count starts again). Cost does not matter: the box
// counts denials (Penalize), not units.
func stepPenalty(l *Limit, s State, now int64, r *Result) State {
	w, n := l.windowUS, l.Count
	mustBePositive(w, n)
	start := windowStart(now, w)
	if s.A != start {
		s.A, s.B = start, 0
	}
	*r = Result{Quota: n}
	if now < s.C {
		r.Reset = FromMicros(s.C - now)
		r.RetryAfter = r.Reset
		return s
	}
	r.Allowed = true
	r.Remaining = max(0, n-s.B)
	if s.B > 0 {
		r.Reset = FromMicros(start + w - now)
	}
	return s
}

// Penalize counts, in the state s of a Penalty limit l, a request the
// policy's other limits denied at now (µs) while the key was not in the
// box. The Count-th denial of a window puts the key in the box for
// MaxDelay, and the count starts again.
func Penalize(l *Limit, s State, now int64) State {
	start := windowStart(now, l.windowUS)
	if s.A != start {
		s.A, s.B = start, 0
	}
	s.B++
	if s.B >= l.Count {
		s.B, s.C = 0, now+l.maxDelayUS
	}
	return s
}

// FromMicros converts a count of µs, the core's unit of time, to a Duration.
func FromMicros(d int64) time.Duration { return time.Duration(d) * time.Microsecond }

// mustBePositive panics unless a window (µs) and a count are positive, as
// Limit.Normalize makes them: a step function that says so first lets the
// compiler drop the checks from each of its divisions by them.
func mustBePositive(w, n int64) {
	if w < 1 || n < 1 {
		panic("algo: a step on a limit Normalize did not accept")
	}
}

// ceilDiv returns ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// windowStart returns the start of the epoch-aligned window holding now.
func windowStart(now, w int64) int64 {
	m := now % w
	if m < 0 {
		m += w
	}
	return now - m
}

// calendarBounds returns the start and end (µs) of the calendar month
// (months 1) or year (months 12) in UTC holding now.
func calendarBounds(now, months int64) (start, end int64) {
	t := time.UnixMicro(now).UTC()
	month := t.Month()
	if months == 12 {
		month = time.January
	}
	first := time.Date(t.Year(), month, 1, 0, 0, 0, 0, time.UTC)
	return first.UnixMicro(), first.AddDate(0, int(months), 0).UnixMicro()
}

// FixedWindowAt returns the window (start and end, µs) of a FixedWindow
// limit l that holds now: aligned to the Unix epoch, or a calendar month
// or year in UTC, as its step function aligns it (this asks the step
// function), for a store that keeps one record per window.
func (l *Limit) FixedWindowAt(now int64) (start, end int64) {
	var r Result
	s := stepFixedWindow(l, State{}, now, 0, &r)
	return s.A, now + int64(r.Reset/time.Microsecond)
}

func stepFixedWindow(l *Limit, s State, now, cost int64, r *Result) State {
	w, n := l.windowUS, l.Count
	mustBePositive(w, n)
	// The window holding now: aligned to the Unix epoch, or a calendar one.
	start := windowStart(now, w)
	end := start + w
	if l.months != 0 {
		start, end = calendarBounds(now, l.months)
	}
	if s.A != start {
		s.A, s.B = start, 0
	}
	reset := FromMicros(end - now)
	*r = Result{Quota: n, Reset: reset}
	if s.B+cost <= n {
		s.B += cost
		r.Allowed = true
		r.Remaining = n - s.B
		return s
	}
	// Counts shared eventually (eventual.Store) may pass n.
	r.Remaining = max(0, n-s.B)
	r.RetryAfter = reset
	if cost > n {
		r.RetryAfter = FromMicros(w)
	}
	return s
}

// stepSlidingLog keeps the times of the requests in the window in a ring
// that grows (doubling, up to n) as it fills, so a key costs 8 bytes per
// request it holds, not per request its limit allows.
func stepSlidingLog(l *Limit, s State, now, cost int64, r *Result) State {
	w, n := l.windowUS, l.Count
	mustBePositive(w, n)
	// The most times the log holds: its count, and what a reserve holds
	// back from this view of it (Unreserved).
	if full := n + l.reserved; s.B > full {
		// The count shrank below the live entries (adaptive limits).
		s = relayoutLog(s, full, full)
	}
	s = expireLog(s, now, w)
	*r = Result{Quota: n}
	if s.B+cost <= n {
		s = appendLog(s, n, now, cost)
		c := int64(len(s.Log.Times))
		r.Allowed = true
		r.Remaining = n - s.B
		if s.B > 0 {
			r.Reset = FromMicros(s.Log.Times[(s.A+s.B-1)%c] + w - now)
		}
		return s
	}
	r.Remaining = max(0, n-s.B) // a reserve's view may hold more than n
	if s.B == 0 {
		// Nothing live, so only a cost above n is refused.
		r.RetryAfter = FromMicros(w)
		return s
	}
	c := int64(len(s.Log.Times))
	r.Reset = FromMicros(s.Log.Times[(s.A+s.B-1)%c] + w - now)
	if cost <= n {
		// The request fits once the oldest s.B+cost-n entries have left.
		oldest := s.Log.Times[(s.A+s.B+cost-n-1)%c]
		r.RetryAfter = FromMicros(oldest + w - now)
	} else {
		r.RetryAfter = FromMicros(w)
	}
	return s
}

// expireLog forgets a sliding log's times at or before now-w: they left
// the window (now-w, now].
func expireLog(s State, now, w int64) State {
	for s.B > 0 && s.Log.Times[s.A] <= now-w {
		s.A++
		if s.A == int64(len(s.Log.Times)) {
			s.A = 0
		}
		s.B--
	}
	return s
}

// appendLog adds cost times now after the live entries of a sliding log
// whose live entries and cost fit in n, growing its ring (doubling, up to
// n) when it must; it writes only outside the live part.
func appendLog(s State, n, now, cost int64) State {
	if need := s.B + cost; s.Log == nil || int64(len(s.Log.Times)) < need {
		size := int64(4)
		if s.Log != nil {
			size = 2 * int64(len(s.Log.Times))
		}
		s = relayoutLog(s, min(n, max(size, need)), s.B)
	}
	c := int64(len(s.Log.Times))
	for i := int64(0); i < cost; i++ {
		s.Log.Times[(s.A+s.B)%c] = now
		s.B++
	}
	return s
}

// relayoutLog moves the newest keep live entries of a sliding log into a
// new ring of size entries, oldest first. Keeping only the newest n when an
// adaptive policy shrank the count below the live entries is exact: while
// more than n are live every request is denied, and a request fits once
// all but the newest n-cost have left, which the newest n tell.
func relayoutLog(s State, size, keep int64) State {
	ring := make([]int64, size)
	if s.Log != nil {
		old := s.Log.Times
		m := int64(len(old))
		for i := int64(0); i < keep; i++ {
			ring[i] = old[(s.A+s.B-keep+i)%m]
		}
	}
	return State{A: 0, B: keep, C: s.C, Log: &Ring{Times: ring}}
}

// MaxInFlightRetry caps an InFlight denial's RetryAfter: a slot frees when
// some request in flight finishes, which no one can foresee, and at the
// latest when the soonest lease ends; until then, clients are told to try
// again within a second.
const MaxInFlightRetry = time.Second

// stepInFlight admits a request while fewer than Count leases are live. Its
// state is the sliding log's, each entry a lease taken at its time and live
// for Window, so it counts what the log counts; only its RetryAfter differs
// (see MaxInFlightRetry). Reset is when the newest lease ends at the latest.
func stepInFlight(l *Limit, s State, now, cost int64, r *Result) State {
	s = stepSlidingLog(l, s, now, cost, r)
	if !r.Allowed {
		r.RetryAfter = min(r.RetryAfter, MaxInFlightRetry)
	}
	return s
}

// EndLease ends (renew false) or renews up to n live leases of an InFlight
// limit taken at token (µs: the At of the decision that took them, or of
// their last renewal). Ending frees their slots now; renewing moves them to
// now, so they live another Window. A lease that already ended (released,
// or expired because its gateway went quiet) is not found. It returns the
// new state and how many leases it found.
func EndLease(l *Limit, s State, now, token, n int64, renew bool) (State, int64) {
	w := l.windowUS
	if s.Log == nil || token <= now-w {
		return s, 0
	}
	c := int64(len(s.Log.Times))
	kept := make([]int64, 0, s.B)
	found := int64(0)
	for i := int64(0); i < s.B; i++ {
		t := s.Log.Times[(s.A+i)%c]
		switch {
		case t <= now-w: // expired
		case t == token && found < n:
			found++
		default:
			kept = append(kept, t)
		}
	}
	if renew {
		// Entries stay in time order: now is at or after every live one.
		for i := int64(0); i < found; i++ {
			kept = append(kept, now)
		}
	}
	ring := make([]int64, max(int64(len(kept)), min(l.Count, 4)))
	copy(ring, kept)
	return State{A: 0, B: int64(len(kept)), C: s.C, Log: &Ring{Times: ring}}, found
}

// CancelShaped gives back the place a request of cost units took in a
// LeakyBucket limit's queue when it leaves before its release at release
// (µs: its decision's At plus the Delay this limit gave it), as a client
// that gives up does. The queue is cost emission intervals shorter, so the
// rate over any max_delay is kept; a place freed in the middle of the
// queue is taken at its end, so the next request may be released at the
// same instant as the last one queued. A request already released gives
// nothing back.
func CancelShaped(l *Limit, s State, now, release, cost int64) State {
	if l.Algorithm != LeakyBucket || release <= now {
		return s
	}
	n := l.Count
	ahead := aheadOf(s, now, n) - cost*l.windowUS
	if ahead <= 0 {
		return State{A: now}
	}
	return State{A: now + ahead/n, B: ahead % n}
}

// slidingEstimate is Cloudflare's estimate of the requests in the sliding
// window ending el µs into the current window: the previous window's count
// weighted by its overlap, plus the current count. The Lua script computes the
// same IEEE double operations in the same order.
func slidingEstimate(prev, curr, w, el int64) float64 {
	return float64(float64(prev)*float64(w-el))/float64(w) + float64(curr)
}

// counterWindows moves a SlidingCounter state to the window starting at
// start: the current count becomes the previous one a window on, and both
// are forgotten further on.
func counterWindows(s State, start, w int64) State {
	switch s.A {
	case start:
	case start - w:
		s.A, s.B, s.C = start, 0, s.B
	default:
		s.A, s.B, s.C = start, 0, 0
	}
	return s
}

func stepSlidingCounter(l *Limit, s State, now, cost int64, r *Result) State {
	w, n := l.windowUS, l.Count
	mustBePositive(w, n)
	start := windowStart(now, w)
	s = counterWindows(s, start, w)
	el := now - start
	est := slidingEstimate(s.C, s.B, w, el)
	*r = Result{Quota: n}
	if est+float64(cost) <= float64(n) {
		s.B += cost
		r.Allowed = true
		r.Remaining = int64(math.Floor(float64(n) - (est + float64(cost))))
	} else {
		r.Remaining = max(0, int64(math.Floor(float64(n)-est)))
		r.RetryAfter = FromMicros(slidingCounterWait(s, w, n, el, cost))
	}
	switch {
	case s.B > 0:
		r.Reset = FromMicros(start + 2*w - now)
	case s.C > 0:
		r.Reset = FromMicros(start + w - now)
	}
	return s
}

// slidingCounterWait returns how many µs after el (into the window starting
// at s.A) a request of cost units is first admitted, if nothing else arrives.
func slidingCounterWait(s State, w, n, el, cost int64) int64 {
	if cost > n {
		return w
	}
	fits := func(prev, curr, at int64) bool {
		return slidingEstimate(prev, curr, w, at)+float64(cost) <= float64(n)
	}
	// First chance: later in this window, as the previous window fades.
	if s.B+cost <= n && s.C > 0 {
		at := int64(math.Ceil(float64(w) - float64(float64(n-s.B-cost)*float64(w))/float64(s.C)))
		at = max(at, el)
		for at < w && !fits(s.C, s.B, at) {
			at++
		}
		if at < w {
			return at - el
		}
	}
	// Otherwise in the next window, where this window's count fades.
	at := int64(0)
	if s.B > 0 {
		at = max(0, int64(math.Ceil(float64(w)-float64(float64(n-cost)*float64(w))/float64(s.B))))
		for at < w && !fits(s.B, 0, at) {
			at++
		}
	}
	return w + at - el
}

// Token bucket in integer units: one token is Window µs worth of units and
// the bucket refills Count units per µs, so every quantity is exact.
func stepTokenBucket(l *Limit, s State, now, cost int64, r *Result) State {
	w, n, b := l.windowUS, l.Count, l.burst
	mustBePositive(w, n)
	capacity := b * w
	if elapsed := now - s.B; s.A > 0 && elapsed > 0 {
		if elapsed >= ceilDiv(s.A, n) {
			s.A = 0
		} else {
			s.A -= elapsed * n
		}
	}
	s.B = max(s.B, now)
	*r = Result{Quota: n}
	need := cost * w
	if cost <= b && s.A+need <= capacity {
		s.A += need
		r.Allowed = true
		r.Remaining = (capacity - s.A) / w
		r.Reset = FromMicros(ceilDiv(s.A, n))
		return s
	}
	r.Remaining = max(0, (capacity-s.A)/w) // a Charge may overdraw
	r.Reset = FromMicros(ceilDiv(s.A, n))
	if cost <= b {
		r.RetryAfter = FromMicros(ceilDiv(s.A+need-capacity, n))
	} else {
		r.RetryAfter = FromMicros(w)
	}
	return s
}

// aheadOf returns how far the theoretical arrival time in s lies after now,
// in 1/n µs (0 when it has passed).
func aheadOf(s State, now, n int64) int64 {
	if s.A < now {
		return 0
	}
	return (s.A-now)*n + s.B
}

// gcraAdvance returns the theoretical arrival time (µs and fraction in 1/n µs)
// at or after now, moved on by cost emission intervals of w/n µs each.
func gcraAdvance(s State, now, w, n, cost int64) (tatUS, tatFrac int64) {
	tatUS, tatFrac = s.A, s.B
	if tatUS < now {
		tatUS, tatFrac = now, 0
	}
	total := tatFrac + cost*w
	return tatUS + total/n, total % n
}

func stepGCRA(l *Limit, s State, now, cost int64, r *Result) State {
	w, n, b := l.windowUS, l.Count, l.burst
	mustBePositive(w, n)
	// Distances from now are kept in 1/n µs, so one request is w units.
	tolerance := b * w
	prev := aheadOf(s, now, n)
	*r = Result{Quota: n}
	if cost <= b {
		tatUS, tatFrac := gcraAdvance(s, now, w, n, cost)
		ahead := (tatUS-now)*n + tatFrac
		if ahead <= tolerance {
			r.Allowed = true
			r.Remaining = (tolerance - ahead) / w
			r.Reset = FromMicros(ceilDiv(ahead, n))
			return State{A: tatUS, B: tatFrac}
		}
		r.RetryAfter = FromMicros(ceilDiv(ahead-tolerance, n))
	}
	r.Remaining = max(0, (tolerance-prev)/w) // a Charge may overdraw
	r.Reset = FromMicros(ceilDiv(prev, n))
	if cost > b {
		r.RetryAfter = FromMicros(w)
	}
	return s
}

// stepLeakyBucket shapes: a request is released at the later of now and the
// time the previous one's slot ends, so releases are w/n µs apart per unit of
// cost. It is refused when its release would be more than MaxDelay away, or
// when the requests waiting (itself included) would cost more than the queue
// size b.
func stepLeakyBucket(l *Limit, s State, now, cost int64, r *Result) State {
	w, n, b := l.windowUS, l.Count, l.burst
	mustBePositive(w, n)
	// In 1/n µs: the longest wait, and how far ahead the queue may reach.
	maxWait, queue := l.maxDelayUS*n, b*w
	wait := aheadOf(s, now, n)
	*r = Result{Quota: n}
	if cost <= b {
		tatUS, tatFrac := gcraAdvance(s, now, w, n, cost)
		next := (tatUS-now)*n + tatFrac
		if wait <= maxWait && next <= queue {
			r.Allowed = true
			r.Delay = FromMicros(ceilDiv(wait, n))
			r.Remaining = shaperRoom(next, maxWait, queue, w)
			r.Reset = FromMicros(ceilDiv(next, n))
			return State{A: tatUS, B: tatFrac}
		}
		// Both distances shrink by n per µs: wait for the larger excess.
		r.RetryAfter = FromMicros(ceilDiv(max(wait-maxWait, next-queue), n))
	} else {
		r.RetryAfter = FromMicros(w)
	}
	r.Remaining = shaperRoom(wait, maxWait, queue, w)
	r.Reset = FromMicros(ceilDiv(wait, n))
	return s
}

// shaperRoom returns how many more requests of cost 1 a shaper admits when
// the queue reaches ahead units (1/n µs) past now.
func shaperRoom(ahead, maxWait, queue, w int64) int64 {
	if ahead > maxWait || ahead > queue {
		return 0
	}
	return min((maxWait-ahead)/w+1, (queue-ahead)/w)
}

// WindowCount is one window of a counting algorithm's state: the window's
// start (µs since the epoch) and the units of cost counted in it.
type WindowCount struct {
	Start, Count int64
}

// CountedWindows returns the windows a FixedWindow or SlidingCounter state
// counts, newest first: the current window and, for SlidingCounter, the one
// before it. n is 0 for the other algorithms, which do not count per window.
// Eventual mode shares these counts between nodes (see WithCounts); the
// window starts are the step function's own, so it never aligns a window
// itself.
func CountedWindows(l *Limit, s State) (windows [2]WindowCount, n int) {
	switch l.Algorithm {
	case FixedWindow:
		return [2]WindowCount{{s.A, s.B}}, 1
	case SlidingCounter:
		return [2]WindowCount{{s.A, s.B}, {s.A - l.windowUS, s.C}}, 2
	}
	return windows, 0
}

// CountsUntil returns when (µs) the window starting at start, one that
// CountedWindows reported under l, stops counting in any decision: its end
// for FixedWindow (a calendar month or year ends when it does), the end of
// the window after it for SlidingCounter, which weighs the window before
// the current one. It returns start for the other algorithms. Eventual
// mode's shared store keeps a window's count until then.
func CountsUntil(l *Limit, start int64) int64 {
	switch l.Algorithm {
	case FixedWindow:
		_, end := l.FixedWindowAt(start)
		return end
	case SlidingCounter:
		return start + 2*l.windowUS
	}
	return start
}

// CountedSince returns the start of the window a FixedWindow or
// SlidingCounter state counts now (after) and the units counted in it
// since before: a request's cost when it was committed, a charge's whole
// cost, nothing for a denial or a check. ok is false for the other
// algorithms. Eventual mode shares these units with the fleet.
func CountedSince(l *Limit, before, after State) (start, units int64, ok bool) {
	now, n := CountedWindows(l, after)
	if n == 0 {
		return 0, 0, false
	}
	was, _ := CountedWindows(l, before)
	units = now[0].Count
	if was[0].Start == now[0].Start {
		units -= was[0].Count
	}
	return now[0].Start, units, true
}

// WithCounts returns s with the counts of the windows CountedWindows
// reports replaced by counts, in the same order.
func WithCounts(l *Limit, s State, counts [2]int64) State {
	switch l.Algorithm {
	case FixedWindow:
		s.B = counts[0]
	case SlidingCounter:
		s.B, s.C = counts[0], counts[1]
	}
	return s
}
