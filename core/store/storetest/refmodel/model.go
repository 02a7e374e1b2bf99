// Package refmodel is the conformance suite's oracle (see Model): each
// algorithm of core/algo written plainly from its definition.
package refmodel

import (
	"math"
	"math/big"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// Model is the conformance suite's oracle: each algorithm written plainly
// from its definition, over plain history (the requests a sliding log holds,
// a count per aligned window, token and arrival times as exact rationals),
// sharing nothing with core's step functions but the limits' validated
// parameters. A store passes when it answers every request exactly as the
// model does. Time must not go backwards.
type Model struct {
	limits map[string]modelLimit // by limitID
}

// NewModel returns an empty model.
func NewModel() *Model { return &Model{limits: map[string]modelLimit{}} }

// limitID names limit i of p for key: usage is kept per limit, so the
// policies of one name share each limit they have in common (a reload that
// adds, removes or changes a limit keeps the others' usage).
func limitID(p *core.Policy, i int, key string) string {
	return p.Name() + "\x00" + p.StoreSide().LimitID(i) + "\x00" + key
}

// hist returns the histories of p's limits for key, new ones for those
// that have none if create (else nil for them).
func (m *Model) hist(p *core.Policy, key string, create bool) []modelLimit {
	limits := p.Limits()
	hist := make([]modelLimit, len(limits))
	for i := range limits {
		id := limitID(p, i, key)
		h, ok := m.limits[id]
		if !ok && create {
			h = newModelLimit(&limits[i])
			m.limits[id] = h
		}
		hist[i] = h
	}
	return hist
}

// modelLimit is one limit's history for one key. decide returns the verdict
// on a request of cost units at now and, if it is allowed, the change that
// commits it.
type modelLimit interface {
	decide(now, cost int64) (algo.Result, func())
	// charge takes cost units whatever the limit has left (a response's
	// cost, charged after it: algo.Limit.AfterResponse).
	charge(now, cost int64)
	// use makes the next decisions those of l: the limit, or the view of it
	// a request below a reserve's priority has (algo.Limit.Unreserved), whose
	// count or burst is smaller over the same history.
	use(l *algo.Limit)
}

// Decide is the model's answer to a request of cost units for key under p at
// now (µs): every limit allows it or none consumes anything; the deciding
// limit is, when allowed, the one with the least remaining (the longer window
// on a tie, the first of equal windows), when denied, the denying one with
// the longest retry-after (the first on a tie).
func (m *Model) Decide(p *core.Policy, key string, now, cost int64) core.Decision {
	limits := p.Limits()
	hist := m.hist(p, key, true)
	d := core.Decision{Policy: p, Cost: cost, At: now, N: len(limits)}
	commits := make([]func(), len(limits))
	allowed := true
	for i := range limits {
		hist[i].use(&limits[i])
		switch p.StoreSide().LimitMode(i) {
		case core.LimitCharge:
			// Taken after the response, whatever is left: at most a full
			// limit's worth (MaxCharge), then reported as cost 0 sees it.
			hist[i].charge(now, min(cost, limits[i].MaxCharge()))
			d.Results[i], _ = hist[i].decide(now, 0)
		case core.LimitReport:
			d.Results[i], _ = hist[i].decide(now, 0)
		case core.LimitCheck:
			// Passes while a unit is left (a request of cost 1, or 0 for a
			// free one), and takes nothing.
			d.Results[i], _ = hist[i].decide(now, min(cost, 1))
			if d.Results[i].Allowed {
				d.Results[i], _ = hist[i].decide(now, 0)
			}
		default:
			d.Results[i], commits[i] = hist[i].decide(now, cost)
		}
		allowed = allowed && d.Results[i].Allowed
	}
	if allowed {
		for _, c := range commits {
			if c != nil {
				c()
			}
		}
	} else {
		// Nothing consumed: a limit that would have allowed reports what a
		// request of cost 0 sees.
		for i := range limits {
			if d.Results[i].Allowed && p.StoreSide().LimitMode(i) == core.LimitStep {
				d.Results[i], _ = hist[i].decide(now, 0)
			}
		}
		// A penalty box counts the denial, unless the key is in it or the
		// request costs nothing (an operator's read), or it is a charge.
		if i := p.StoreSide().Penalty(); i >= 0 && cost > 0 && d.Results[i].Allowed && !p.StoreSide().ChargesAfterResponse() {
			box := hist[i].(*penaltyModel)
			box.deny(now)
			d.Results[i], _ = box.decide(now, 0)
		}
	}
	best := -1
	for i := range limits {
		r, w := d.Results[i], limits[i].Window
		switch {
		case allowed && i == p.StoreSide().Penalty():
			// A penalty box decides only the requests it refuses.
		case allowed && (best < 0 || r.Remaining < d.Results[best].Remaining ||
			r.Remaining == d.Results[best].Remaining && w > limits[best].Window):
			best = i
		case !allowed && !r.Allowed && (best < 0 || r.RetryAfter > d.Results[best].RetryAfter):
			best = i
		}
	}
	r := d.Results[best]
	d.Index, d.Quota, d.Remaining, d.Reset = best, r.Quota, r.Remaining, r.Reset
	if allowed {
		for i := range limits {
			d.Delay = max(d.Delay, d.Results[i].Delay)
		}
	} else {
		d.RetryAfter = r.RetryAfter
	}
	d.Allowed = allowed
	if !allowed && p.Shadow() {
		d.Allowed, d.Shadowed = true, true
	}
	return d
}

// Reset forgets key's state under p in limit (or core.AllLimits), as an
// operator's reset does.
func (m *Model) Reset(p *core.Policy, key string, limit int) {
	for i := range p.Limits() {
		if limit == core.AllLimits || i == limit {
			delete(m.limits, limitID(p, i, key))
		}
	}
}

// EndLease is the model's answer to ending (or renewing) the lease a
// request of cost units took under p for key at token: how many of its
// slots the first in_flight limit still held.
func (m *Model) EndLease(p *core.Policy, key string, now, token, cost int64, renew bool) int64 {
	found := int64(-1)
	hist := m.hist(p, key, false)
	for i, l := range p.Limits() {
		if l.Algorithm != algo.InFlight {
			continue
		}
		if hist[i] == nil {
			return 0
		}
		f := hist[i].(*logModel).end(now, token, cost, renew)
		if found < 0 {
			found = f
		}
	}
	return max(found, 0)
}

// CancelShaped is the model's answer to a shaped request leaving early:
// each limit that delayed it (s.Delays) gives back its places if it has
// not released it yet.
func (m *Model) CancelShaped(s *core.Shaped, now int64) {
	for i, h := range m.hist(s.Policy, s.Key, false) {
		if meter, ok := h.(*meterModel); ok && meter.shaper && s.Delays[i] > 0 {
			meter.cancel(now, s.At+s.Delays[i], s.Cost)
		}
	}
}

func newModelLimit(l *algo.Limit) modelLimit {
	w, n := l.Window.Microseconds(), l.Count
	switch l.Algorithm {
	case algo.FixedWindow:
		return &fixedModel{w: w, n: n, months: l.CalendarMonths(), counts: map[int64]int64{}}
	case algo.SlidingLog:
		return &logModel{w: w, n: n}
	case algo.InFlight:
		return &logModel{w: w, n: n, inFlight: true}
	case algo.SlidingCounter:
		return &counterModel{w: w, n: n, counts: map[int64]int64{}}
	case algo.TokenBucket:
		return &bucketModel{w: w, n: n, b: l.EffectiveBurst()}
	case algo.GCRA:
		return &meterModel{w: w, n: n, b: l.EffectiveBurst()}
	case algo.LeakyBucket:
		return &meterModel{w: w, n: n, b: l.EffectiveBurst(), shaper: true, maxDelay: l.MaxDelay.Microseconds()}
	case algo.Penalty:
		return &penaltyModel{w: w, n: n, box: l.MaxDelay.Microseconds(), denials: map[int64]int64{}}
	}
	panic("model: unknown algorithm " + l.Algorithm.String())
}

func us(v int64) time.Duration { return time.Duration(v) * time.Microsecond }

// alignedStart is the start of the epoch-aligned window of length w holding t.
func alignedStart(t, w int64) int64 { return t - ((t%w)+w)%w }

// fixedModel: at most n units per window aligned to the epoch.
type fixedModel struct {
	w, n   int64
	months int64 // a calendar window: 1 (a month) or 12 (a year) in UTC
	counts map[int64]int64
}

// window is the window holding t: aligned to the epoch, or the calendar
// month or year (UTC) that holds it.
func (m *fixedModel) window(t int64) (start, end int64) {
	switch m.months {
	case 1:
		d := time.UnixMicro(t).UTC()
		first := time.Date(d.Year(), d.Month(), 1, 0, 0, 0, 0, time.UTC)
		return first.UnixMicro(), first.AddDate(0, 1, 0).UnixMicro()
	case 12:
		y := time.UnixMicro(t).UTC().Year()
		return time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro(), time.Date(y+1, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	}
	start = alignedStart(t, m.w)
	return start, start + m.w
}

func (m *fixedModel) decide(now, cost int64) (algo.Result, func()) {
	start, end := m.window(now)
	used := m.counts[start]
	r := algo.Result{Quota: m.n, Reset: us(end - now)}
	if used+cost <= m.n {
		r.Allowed, r.Remaining = true, m.n-used-cost
		return r, func() { m.counts[start] += cost }
	}
	r.Remaining = max(0, m.n-used)
	r.RetryAfter = r.Reset
	if cost > m.n {
		r.RetryAfter = us(m.w)
	}
	return r, nil
}

func (m *fixedModel) use(l *algo.Limit) { m.n = l.Count }

func (m *fixedModel) charge(now, cost int64) {
	start, _ := m.window(now)
	m.counts[start] += cost
}

// logModel: at most n units in any window (t-w, t]; one time per unit.
// In flight, each time is a lease's, live for w unless ended or renewed,
// and a denial's retry is capped at algo.MaxInFlightRetry.
type logModel struct {
	w, n     int64
	times    []int64 // every allowed unit, oldest first
	inFlight bool
}

// end ends (or renews, moving them to now) up to cost live leases taken at
// token, and returns how many it found.
func (m *logModel) end(now, token, cost int64, renew bool) int64 {
	var kept []int64
	found := int64(0)
	for _, t := range m.live(now) {
		if t == token && found < cost {
			found++
			continue
		}
		kept = append(kept, t)
	}
	for i := int64(0); renew && i < found; i++ {
		kept = append(kept, now)
	}
	m.times = kept
	return found
}

func (m *logModel) use(l *algo.Limit) { m.n = l.Count }

// charge adds cost times, keeping the newest n: a request fits only once
// all but n-cost of the times have left, which the newest n tell.
func (m *logModel) charge(now, cost int64) {
	times := m.live(now)
	for i := int64(0); i < cost; i++ {
		times = append(times, now)
	}
	if int64(len(times)) > m.n {
		times = times[int64(len(times))-m.n:]
	}
	m.times = times
}

func (m *logModel) live(now int64) []int64 {
	for i, t := range m.times {
		if t > now-m.w {
			return m.times[i:]
		}
	}
	return nil
}

func (m *logModel) decide(now, cost int64) (algo.Result, func()) {
	live := m.live(now)
	k := int64(len(live))
	r := algo.Result{Quota: m.n}
	if k+cost <= m.n {
		r.Allowed, r.Remaining = true, m.n-k-cost
		switch {
		case cost > 0:
			r.Reset = us(m.w)
		case k > 0:
			r.Reset = us(live[k-1] + m.w - now)
		}
		return r, func() {
			for i := int64(0); i < cost; i++ {
				m.times = append(m.live(now), now)
			}
		}
	}
	r.Remaining = max(0, m.n-k) // a reserve's view may see more than its n
	r.RetryAfter = us(m.w)
	if k > 0 {
		r.Reset = us(live[k-1] + m.w - now)
		if cost <= m.n {
			// Enough units must leave for cost to fit: the (k+cost-n)th oldest.
			r.RetryAfter = us(live[k+cost-m.n-1] + m.w - now)
		}
	}
	if m.inFlight {
		r.RetryAfter = min(r.RetryAfter, algo.MaxInFlightRetry)
	}
	return r, nil
}

// counterModel: Cloudflare's estimate, the previous aligned window's count
// weighted by its overlap with the sliding window plus the current count,
// must stay within n.
type counterModel struct {
	w, n   int64
	counts map[int64]int64
}

// estimate is the definition's expression, in doubles (the one place the
// model and the step function must agree to the bit).
func estimate(prev, curr, w, el int64) float64 {
	return float64(float64(prev)*float64(w-el))/float64(w) + float64(curr)
}

func (m *counterModel) decide(now, cost int64) (algo.Result, func()) {
	start := alignedStart(now, m.w)
	prev, curr, el := m.counts[start-m.w], m.counts[start], now-start
	est := estimate(prev, curr, m.w, el)
	r := algo.Result{Quota: m.n}
	var commit func() // nil: a denial commits nothing
	if est+float64(cost) <= float64(m.n) {
		r.Allowed = true
		r.Remaining = int64(math.Floor(float64(m.n) - (est + float64(cost))))
		curr += cost
		commit = func() { m.counts[start] += cost }
	} else {
		r.Remaining = max(0, int64(math.Floor(float64(m.n)-est)))
		r.RetryAfter = us(m.wait(prev, curr, el, cost))
	}
	// The estimate reaches 0 when the newest counted window has faded.
	switch {
	case curr > 0:
		r.Reset = us(start + 2*m.w - now)
	case prev > 0:
		r.Reset = us(start + m.w - now)
	}
	return r, commit
}

func (m *counterModel) use(l *algo.Limit) { m.n = l.Count }

func (m *counterModel) charge(now, cost int64) { m.counts[alignedStart(now, m.w)] += cost }

// wait is the first µs after el (into the current window) at which cost
// fits, nothing else arriving: the estimate only falls within a window, so
// a binary search finds it, in this window or the next.
func (m *counterModel) wait(prev, curr, el, cost int64) int64 {
	if cost > m.n {
		return m.w
	}
	fits := func(p, c, at int64) bool { return estimate(p, c, m.w, at)+float64(cost) <= float64(m.n) }
	first := func(p, c, from int64) (int64, bool) {
		if !fits(p, c, m.w-1) {
			return 0, false
		}
		lo, hi := from, m.w-1
		for lo < hi {
			mid := lo + (hi-lo)/2
			if fits(p, c, mid) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return lo, true
	}
	if at, ok := first(prev, curr, el); ok {
		return at - el
	}
	if at, ok := first(curr, 0, 0); ok {
		return m.w + at - el
	}
	return 2*m.w - el
}

// rational helpers for the bucket models.
func rat(v int64) *big.Rat { return new(big.Rat).SetInt64(v) }

func floorRat(r *big.Rat) int64 {
	q := new(big.Int).Div(r.Num(), r.Denom()) // Euclidean: floor for a positive denominator
	return q.Int64()
}

func ceilRat(r *big.Rat) int64 { return -floorRat(new(big.Rat).Neg(r)) }

// bucketModel: a bucket of b tokens refilled at n per w µs; a request takes
// cost tokens. It keeps the tokens missing from a full bucket, which views
// of the limit with a smaller b (a reserve's) share.
type bucketModel struct {
	w, n, b int64
	missing *big.Rat
	last    int64
}

func (m *bucketModel) use(l *algo.Limit) { m.b = l.EffectiveBurst() }

// charge takes cost tokens, which may leave the bucket owing some.
func (m *bucketModel) charge(now, cost int64) {
	m.decide(now, 0) // refilled to now
	m.missing = new(big.Rat).Add(m.missing, rat(cost))
}

func (m *bucketModel) decide(now, cost int64) (algo.Result, func()) {
	if m.missing == nil {
		m.missing, m.last = rat(0), now
	}
	// Refill since the last request, until nothing is missing.
	missing := new(big.Rat).Sub(m.missing, new(big.Rat).Mul(rat(now-m.last), big.NewRat(m.n, m.w)))
	if missing.Sign() < 0 {
		missing = rat(0)
	}
	m.missing, m.last = missing, now
	tokens := new(big.Rat).Sub(rat(m.b), missing)
	// Time to refill the missing tokens, in µs: missing × w / n.
	refillTime := func(missing *big.Rat) int64 { return ceilRat(new(big.Rat).Mul(missing, big.NewRat(m.w, m.n))) }
	r := algo.Result{Quota: m.n}
	if cost <= m.b && rat(cost).Cmp(tokens) <= 0 {
		after := new(big.Rat).Add(missing, rat(cost))
		r.Allowed, r.Remaining = true, floorRat(new(big.Rat).Sub(tokens, rat(cost)))
		r.Reset = us(refillTime(after))
		return r, func() { m.missing = after }
	}
	r.Remaining = max(0, floorRat(tokens)) // a charge may leave it owing
	r.Reset = us(refillTime(missing))
	r.RetryAfter = us(m.w)
	if cost <= m.b {
		r.RetryAfter = us(refillTime(new(big.Rat).Sub(rat(cost), tokens)))
	}
	return r, nil
}

// meterModel is GCRA (a virtual scheduling meter: each unit is due T = w/n
// µs after the previous; up to b units may be early) and, with shaper, the
// leaky bucket that holds a request until its turn (at most maxDelay, and
// never more than b units queued).
type meterModel struct {
	w, n, b  int64
	shaper   bool
	maxDelay int64
	tat      *big.Rat // the theoretical arrival time of the next unit, µs
}

// cancel gives back the cost units a request released at release queued,
// if it is not released yet: the schedule ends cost intervals sooner, and
// never before now.
func (m *meterModel) cancel(now, release, cost int64) {
	if release <= now || m.tat == nil {
		return
	}
	m.tat = new(big.Rat).Sub(m.tat, new(big.Rat).Mul(rat(cost), big.NewRat(m.w, m.n)))
	if m.tat.Cmp(rat(now)) < 0 {
		m.tat = rat(now)
	}
}

func (m *meterModel) use(l *algo.Limit) { m.b = l.EffectiveBurst() }

// charge schedules cost more units after the last, however far ahead.
func (m *meterModel) charge(now, cost int64) {
	tat := rat(now)
	if m.tat != nil && m.tat.Cmp(tat) > 0 {
		tat = m.tat
	}
	m.tat = new(big.Rat).Add(tat, new(big.Rat).Mul(rat(cost), big.NewRat(m.w, m.n)))
}

func (m *meterModel) decide(now, cost int64) (algo.Result, func()) {
	t := rat(now)
	interval := big.NewRat(m.w, m.n)
	tat := t
	if m.tat != nil && m.tat.Cmp(t) > 0 {
		tat = m.tat
	}
	wait := new(big.Rat).Sub(tat, t) // how far the schedule runs ahead of now
	newTat := new(big.Rat).Add(tat, new(big.Rat).Mul(rat(cost), interval))
	ahead := new(big.Rat).Sub(newTat, t)
	tolerance := new(big.Rat).Mul(rat(m.b), interval) // b units early at most
	maxWait := rat(m.maxDelay)
	// room: requests of cost 1 still admitted with the schedule a ahead.
	room := func(a *big.Rat) int64 {
		slack := floorRat(new(big.Rat).Quo(new(big.Rat).Sub(tolerance, a), interval))
		if !m.shaper {
			return slack
		}
		if a.Cmp(maxWait) > 0 || a.Cmp(tolerance) > 0 {
			return 0
		}
		return min(floorRat(new(big.Rat).Quo(new(big.Rat).Sub(maxWait, a), interval))+1, slack)
	}
	fits := ahead.Cmp(tolerance) <= 0 && (!m.shaper || wait.Cmp(maxWait) <= 0)
	r := algo.Result{Quota: m.n}
	if cost <= m.b && fits {
		r.Allowed, r.Remaining, r.Reset = true, room(ahead), us(ceilRat(ahead))
		if m.shaper {
			r.Delay = us(ceilRat(wait))
		}
		return r, func() { m.tat = newTat }
	}
	r.Remaining, r.Reset = max(0, room(wait)), us(ceilRat(wait)) // a charge may run it far ahead
	r.RetryAfter = us(m.w)
	if cost <= m.b {
		over := new(big.Rat).Sub(ahead, tolerance)
		if m.shaper {
			if late := new(big.Rat).Sub(wait, maxWait); late.Cmp(over) > 0 {
				over = late
			}
		}
		r.RetryAfter = us(ceilRat(over))
	}
	return r, nil
}

// penaltyModel: the times the policy's other limits denied the key, per
// window aligned to the epoch; the n-th in one window refuses the key for
// box µs, and the count starts again.
type penaltyModel struct {
	w, n, box int64
	denials   map[int64]int64
	until     int64 // the box's end, µs
}

func (m *penaltyModel) deny(now int64) {
	start := alignedStart(now, m.w)
	m.denials[start]++
	if m.denials[start] >= m.n {
		m.denials[start], m.until = 0, now+m.box
	}
}

func (m *penaltyModel) decide(now, _ int64) (algo.Result, func()) {
	r := algo.Result{Quota: m.n}
	if now < m.until {
		r.Reset, r.RetryAfter = us(m.until-now), us(m.until-now)
		return r, nil
	}
	start := alignedStart(now, m.w)
	r.Allowed, r.Remaining = true, max(0, m.n-m.denials[start])
	if m.denials[start] > 0 {
		r.Reset = us(start + m.w - now)
	}
	return r, func() {}
}

func (m *penaltyModel) charge(int64, int64) {}

func (m *penaltyModel) use(*algo.Limit) {}
