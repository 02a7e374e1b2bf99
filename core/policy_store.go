package core

import (
	"github.com/tollgate/tollgate/core/algo"
)

// StoreSide is a Store implementation's side of a Policy: the state the
// policy names in a store (Scope, LimitID and their hashes, how long an
// idle key's state is kept) and the step functions run on that state under
// the store's lock for one key (Apply, ApplyLease, ApplyCancel), or the
// modes a store that runs them itself (the Redis store's Lua) needs. Users
// of a policy call none of it; a store outside core (an adapter's own
// database) does, so it is exported, behind Policy.StoreSide.
//
// It is the policy itself under another method set: converting costs
// nothing, and it holds nothing of its own.
type StoreSide Policy

// StoreSide returns the side of p a Store implementation uses.
func (p *Policy) StoreSide() *StoreSide { return (*StoreSide)(p) }

// Policy returns the policy p is the store side of.
func (p *StoreSide) Policy() *Policy { return (*Policy)(p) }

// Penalty returns the index among the policy's limits of its penalty box
// (an algo.Penalty limit), or -1 without one.
func (p *StoreSide) Penalty() int { return p.penalty }

// ChargesAfterResponse reports whether the policy is a charging twin
// (Family.Charging): its
// decisions charge what a response cost and decide nothing (a store must
// never answer one from a copy of the state).
func (p *StoreSide) ChargesAfterResponse() bool { return p.charges }

// LimitMode tells a store that runs the step functions itself (the Redis
// store's Lua) how p treats limit i: LimitStep (a request's cost is
// stepped, all or nothing), LimitCheck (algo.Check), LimitCharge
// (algo.Charge, always kept) or LimitReport (stepped at cost 0, kept as it
// was).
func (p *StoreSide) LimitMode(i int) LimitMode {
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
// StoreSide.LimitMode).
type LimitMode int

// The limit modes.
const (
	LimitStep LimitMode = iota
	LimitCheck
	LimitCharge
	LimitReport
)

// Scope returns the identity of the policy's state in a store: equal for
// policies with the same name and the same limits' algorithms and windows,
// whatever their counts.
func (p *StoreSide) Scope() string { return p.scope }

// LimitID returns a short identity of limit i's counters (its algorithm
// and window, not its count), so a store can name its state after it: a
// limit whose count changes keeps its state.
func (p *StoreSide) LimitID(i int) string { return p.limitIDs[i] }

// ScopeHash returns a hash of Scope(), fixed for the process's life and
// seeded apart from NameHash, for stores that index state by it.
func (p *StoreSide) ScopeHash() uint64 { return p.scopeHash }

// NameHash returns a hash of Name() alone, fixed for the process's life:
// the policies of one name (a policy and its reloads with limits added,
// removed or changed) share it, for stores that find a key's state under
// one and carry each limit's state over to another (see LimitIDs).
func (p *StoreSide) NameHash() uint64 { return p.nameHash }

// LimitIDs returns every limit's LimitID, in order; the slice is the
// policy's own and must not be changed.
func (p *StoreSide) LimitIDs() []string { return p.limitIDs }

// IdleMicros returns how long after its last request (µs) a key's state
// is equivalent to a fresh one, so a store may forget it.
func (p *StoreSide) IdleMicros() int64 { return p.idleUS }

// ApplyCancel gives back the places a shaped request took in p's
// LeakyBucket limits (see CancelShaped), on states (one per limit, in
// order) at now (µs). It is what a store runs under its lock for one key.
func (p *StoreSide) ApplyCancel(states []algo.State, now int64, s *Shaped) {
	limits := p.Policy().Limits()
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
func (p *StoreSide) ApplyLease(states []algo.State, now, token, cost int64, renew bool) int64 {
	found := int64(-1)
	limits := p.Policy().Limits()
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
func (p *StoreSide) Apply(states []algo.State, now, cost int64, d *Decision) {
	limits := p.cur.Load().limits
	if p.adapt != nil {
		limits = p.Policy().current().limits
	}
	if d.Policy != p.Policy() { // a Decision reused for the policy's requests: no write barrier
		d.Policy = p.Policy()
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
// response (see Family.Charging): under p, they check (algo.Check) while the
// others decide as in applyStacked; under its charging twin (Family.Charging), they are charged
// (algo.Charge) and the others only report.
//
//go:noinline
func (p *StoreSide) applyPhased(limits []algo.Limit, states []algo.State, now, cost int64, d *Decision) {
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
func (p *StoreSide) applyStacked(limits []algo.Limit, states []algo.State, now, cost int64, d *Decision) {
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
func (p *StoreSide) dropDenied(limits []algo.Limit, states, next []algo.State, now, cost int64, d *Decision) {
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
func (p *StoreSide) penalize(limits []algo.Limit, next []algo.State, now, cost int64, d *Decision) {
	i := p.penalty
	if i < 0 || cost == 0 || !d.Results[i].Allowed {
		return
	}
	l := &limits[i]
	next[i] = algo.StepInto(l, algo.Penalize(l, next[i], now), now, 0, &d.Results[i])
}
