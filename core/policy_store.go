package core

import (
	"sync/atomic"

	"github.com/tollgate/tollgate/core/algo"
)

// A Store implementation's side of Policy: the state a policy names in a
// store (Scope, LimitID and their hashes, how long an idle key's state is
// kept) and the step functions run on that state under the store's lock
// for one key (Apply, ApplyLease, ApplyCancel), or the modes a store that
// runs them itself (the Redis store's Lua) needs. Users of a policy call
// none of it; a store outside core (an adapter's own database) does, so it
// is exported.

// LimitMode tells a store that runs the step functions itself (the Redis
// store's Lua) how p treats limit i: LimitStep (a request's cost is
// stepped, all or nothing), LimitCheck (algo.Check), LimitCharge
// (algo.Charge, always kept) or LimitReport (stepped at cost 0, kept as it
// was).
func (p *Policy) LimitMode(i int) LimitMode {
	after := p.limits[i].AfterResponse
	switch {
	case p.charges && after:
		return LimitCharge
	case p.charges:
		return LimitReport
	case after:
		return LimitCheck
	}
	return LimitStep
}

// LimitMode is how a policy's decision treats one of its limits (see
// Policy.LimitMode).
type LimitMode int

// The limit modes.
const (
	LimitStep LimitMode = iota
	LimitCheck
	LimitCharge
	LimitReport
)

// Derived is a slot for a value derived from the policy and its limits in
// force (the header renderer keeps its fields there, with the limits they
// were derived from), so it is derived once, not per request.
func (p *Policy) Derived() *atomic.Value { return &p.derived }

// Scope returns the identity of the policy's state in a store: equal for
// policies with the same name and the same limits' algorithms and windows,
// whatever their counts.
func (p *Policy) Scope() string { return p.scope }

// LimitID returns a short identity of limit i's counters (its algorithm
// and window, not its count), so a store can name its state after it: a
// limit whose count changes keeps its state.
func (p *Policy) LimitID(i int) string { return p.limitIDs[i] }

// ScopeHash returns a hash of Scope(), fixed for the process's life and
// seeded apart from NameHash, for stores that index state by it.
func (p *Policy) ScopeHash() uint64 { return p.scopeHash }

// NameHash returns a hash of Name() alone, fixed for the process's life:
// the policies of one name (a policy and its reloads with limits added,
// removed or changed) share it, for stores that find a key's state under
// one and carry each limit's state over to another (see LimitIDs).
func (p *Policy) NameHash() uint64 { return p.nameHash }

// LimitIDs returns every limit's LimitID, in order; the slice is the
// policy's own and must not be changed.
func (p *Policy) LimitIDs() []string { return p.limitIDs }

// IdleMicros returns how long after its last request (µs) a key's state
// is equivalent to a fresh one, so a store may forget it.
func (p *Policy) IdleMicros() int64 { return p.idleUS }

// HoldsLeases reports whether p has an InFlight limit: a request it allows
// holds a lease until its gateway ends it (see ApplyLease).
func (p *Policy) HoldsLeases() bool { return p.leases }

// ApplyCancel gives back the places a shaped request took in p's
// LeakyBucket limits (see CancelShaped), on states (one per limit, in
// order) at now (µs). It is what a store runs under its lock for one key.
func (p *Policy) ApplyCancel(states []algo.State, now int64, s *Shaped) {
	limits := p.Limits()
	for i := range limits {
		if s.Delays[i] > 0 {
			states[i] = algo.CancelShaped(&limits[i], states[i], now, s.At+s.Delays[i], s.Cost)
		}
	}
}

// ApplyLease ends (renew false) or renews the leases a request of cost
// units took at token (its decision's At, or its last renewal's) in every
// InFlight limit of p, on states (one per limit, in order) at now (µs), as
// EndLease does. It is what a store runs under its lock for one key, and
// returns how many of the first InFlight limit's leases it found.
func (p *Policy) ApplyLease(states []algo.State, now, token, cost int64, renew bool) int64 {
	found := int64(-1)
	limits := p.Limits()
	for i := range limits {
		if limits[i].Algorithm != algo.InFlight {
			continue
		}
		var f int64
		states[i], f = algo.EndLease(&limits[i], states[i], now, token, cost, renew)
		if found < 0 {
			found = f
		}
	}
	return max(found, 0)
}

// Apply runs every limit of p on states (one per limit, in order) for a
// request of cost units at now (µs), fills d, and commits the new states into
// states only if every limit allowed the request. It is what a store runs
// under its lock for one key.
func (p *Policy) Apply(states []algo.State, now, cost int64, d *Decision) {
	limits := p.cur.Load().limits
	if p.adapt != nil {
		limits = p.current().limits
	}
	if d.Policy != p { // a Decision reused for the policy's requests: no write barrier
		d.Policy = p
	}
	d.N, d.Cost, d.Fallback, d.At = len(limits), cost, false, now
	if len(limits) == 1 && p.oneStep {
		// One limit: a denied Step's state only forgets what expired, so it
		// is always the one to keep, and its result is the decision.
		r := &d.Results[0]
		states[0] = algo.StepInto(&limits[0], states[0], now, cost, r)
		d.summarizeOne(r)
		return
	}
	if p.phased {
		p.applyPhased(limits, states, now, cost, d)
		return
	}
	p.applyStacked(limits, states, now, cost, d)
}

// applyPhased is Apply for a policy with limits charged after the
// response (see Charging): under p, they check (algo.Check) while the
// others decide as in applyStacked; under p.Charging(), they are charged
// (algo.Charge) and the others only report.
//
//go:noinline
func (p *Policy) applyPhased(limits []algo.Limit, states []algo.State, now, cost int64, d *Decision) {
	var next [MaxLimits]algo.State
	allowed := true
	for i := range limits {
		l, r := &limits[i], &d.Results[i]
		switch p.LimitMode(i) {
		case LimitCharge:
			next[i] = algo.StepInto(l, algo.Charge(l, states[i], now, cost), now, 0, r)
		case LimitReport:
			next[i] = algo.StepInto(l, states[i], now, 0, r)
		case LimitCheck:
			next[i] = algo.Check(l, states[i], now, cost, r)
		default:
			next[i] = algo.StepInto(l, states[i], now, cost, r)
		}
		allowed = allowed && r.Allowed
	}
	if !allowed && !p.charges {
		p.dropDenied(limits, states, next[:], now, cost, d)
	}
	copy(states, next[:len(limits)])
	d.Summarize(allowed)
}

// applyStacked is Apply for more than one limit: apart, so the next
// states' array is on the stack only for stacked limits.
//
//go:noinline
func (p *Policy) applyStacked(limits []algo.Limit, states []algo.State, now, cost int64, d *Decision) {
	var next [MaxLimits]algo.State
	allowed := true
	for i := range limits {
		next[i] = algo.StepInto(&limits[i], states[i], now, cost, &d.Results[i])
		allowed = allowed && d.Results[i].Allowed
	}
	if !allowed {
		p.dropDenied(limits, states, next[:], now, cost, d)
	}
	copy(states, next[:len(limits)])
	d.Summarize(allowed)
}

// dropDenied undoes a denied request of cost units in next, the states
// after it (states before): nothing is consumed. Each limit that would
// have taken the cost (a check took nothing already) takes the state a
// request of cost 0 leaves (expired history forgotten) and reports what it
// still has; a sliding log's ring may hold the dropped request's times past
// its live part, and keeping the older state instead would count them. A
// penalty box counts the denial.
func (p *Policy) dropDenied(limits []algo.Limit, states, next []algo.State, now, cost int64, d *Decision) {
	for i := range limits {
		if d.Results[i].Allowed && p.LimitMode(i) == LimitStep {
			l := &limits[i]
			next[i] = algo.StepInto(l, algo.Dropped(l, states[i], next[i], cost), now, 0, &d.Results[i])
			d.Results[i].Allowed = true
		}
	}
	p.penalize(limits, next, now, cost, d)
}

// penalize counts a denied request of cost units in p's penalty box, if
// it has one and the key is not in it already (the box's own denials do
// not count, nor requests of cost 0, which an operator's read makes), and
// reports the box as it is after it.
func (p *Policy) penalize(limits []algo.Limit, next []algo.State, now, cost int64, d *Decision) {
	i := p.penalty
	if i < 0 || cost == 0 || !d.Results[i].Allowed {
		return
	}
	l := &limits[i]
	next[i] = algo.StepInto(l, algo.Penalize(l, next[i], now), now, 0, &d.Results[i])
}
