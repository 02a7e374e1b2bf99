package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// Store keeps the state of every (policy, key) and decides requests
// atomically: all limits of the policy are checked and committed together.
type Store interface {
	// Decide applies policy p to key for a request of cost units and fills d.
	// An error means the store could not decide (d is then undefined).
	// d need not be zeroed: every field it reports is written (Results
	// past N are left as they were), so a caller may reuse one Decision
	// for request after request.
	Decide(ctx context.Context, p *Policy, key string, cost int64, d *Decision) error
}

// MaxKeyLen is the longest request key used as it is; longer keys are
// replaced by a hash (see BoundKey), so no header can bloat a store.
const MaxKeyLen = 128

// BoundKey returns key if it is at most MaxKeyLen bytes, and otherwise
// "sha256:" and the hex SHA-256 of key (71 bytes).
func BoundKey(key string) string {
	if len(key) <= MaxKeyLen {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Limiter applies one policy over one store.
type Limiter struct {
	policy *Policy
	store  Store
}

// NewLimiter returns a limiter applying p over s.
func NewLimiter(p *Policy, s Store) *Limiter { return &Limiter{policy: p, store: s} }

// Policy returns the limiter's policy.
func (l *Limiter) Policy() *Policy { return l.policy }

// Store returns the limiter's store.
func (l *Limiter) Store() Store { return l.store }

// Decide decides a request of cost units (at least 0) for key, bounded by
// BoundKey, into d.
func (l *Limiter) Decide(ctx context.Context, key string, cost int64, d *Decision) error {
	return l.DecideFor(ctx, l.policy, key, cost, d)
}

// DecideFor is Decide under p, one of the limiter's policy's Family
// (another plan's policy, the one below a reserve, the charging twin),
// which name the same counters.
func (l *Limiter) DecideFor(ctx context.Context, p *Policy, key string, cost int64, d *Decision) error {
	if cost < 0 {
		return fmt.Errorf("cost: %d must not be negative", cost)
	}
	return l.store.Decide(ctx, p, BoundKey(key), cost, d)
}

// Operator is a store whose keys operators can read and reset (see
// Limiter.Inspect and Limiter.Reset).
type Operator interface {
	// Inspect fills d with what a request of cost 0 for key would see under
	// p now, changing nothing.
	Inspect(ctx context.Context, p *Policy, key string, d *Decision) error
	// Reset forgets key's state under p in limit (an index of p.Limits(),
	// or AllLimits), atomically with concurrent decisions.
	Reset(ctx context.Context, p *Policy, key string, limit int) error
}

// AllLimits makes Operator.Reset forget a key's state in every limit.
const AllLimits = -1

// Inspect reads key's usage under p (the limiter's policy or one of its
// plans' variants) without changing it.
func (l *Limiter) Inspect(ctx context.Context, p *Policy, key string, d *Decision) error {
	op, ok := l.store.(Operator)
	if !ok {
		return fmt.Errorf("policy %q: its store cannot show a key", p.Name())
	}
	return op.Inspect(ctx, p, BoundKey(key), d)
}

// Reset forgets key's usage under the limiter's policy (every plan's: they
// share it) in limit, an index of its limits, or in AllLimits.
func (l *Limiter) Reset(ctx context.Context, key string, limit int) error {
	if limit != AllLimits && (limit < 0 || limit >= len(l.policy.Limits())) {
		return fmt.Errorf("policy %q: no limit %d", l.policy.Name(), limit)
	}
	op, ok := l.store.(Operator)
	if !ok {
		return fmt.Errorf("policy %q: its store cannot reset a key", l.policy.Name())
	}
	return op.Reset(ctx, l.policy, BoundKey(key), limit)
}

// Lease is what a request allowed by a policy that holds leases (an
// InFlight limit) gives back when its response is finished: see
// Limiter.Lease and Limiter.EndLease.
type Lease struct {
	// Policy is the policy (or plan variant) that decided, Key the key as
	// the store holds it (bounded).
	Policy *Policy
	Key    string
	// Token is the µs the lease was taken or last renewed at (the store's
	// clock), which names it in the store; Cost is how many slots it holds.
	Token, Cost int64
	// Fallback marks a lease the failure policy's local store took while the
	// shared store failed.
	Fallback bool
}

// Shaped is what a request a shaper holds gives back when it leaves
// before its release: see Limiter.Shaped and StoreSide.ApplyCancel.
type Shaped struct {
	// Policy is the policy (or plan variant) that decided, Key the key as
	// the store holds it (bounded).
	Policy *Policy
	Key    string
	// At is when the store decided (µs, its clock), Cost the units taken,
	// and Delays each limit's delay in µs (0 for a limit that did not
	// shape).
	At, Cost int64
	Delays   [MaxLimits]int64
	// Fallback marks a decision the failure policy's local store made.
	Fallback bool
}

// ShapeStore is a store that can give a shaped request's places back.
type ShapeStore interface {
	// CancelShaped runs StoreSide.ApplyCancel for s at the store's now, in one
	// round trip.
	CancelShaped(ctx context.Context, s *Shaped) error
}

// Shaped returns what an allowed decision d of this limiter that holds the
// request (a Delay) gives back if it leaves early, and false when d holds
// nothing or the store cannot give places back.
func (l *Limiter) Shaped(key string, d *Decision) (Shaped, bool) {
	if d.Delay <= 0 || !d.Allowed || d.Shadowed || d.Cost == 0 {
		return Shaped{}, false // every unshaped decision: checked before the store
	}
	if _, ok := l.store.(ShapeStore); !ok {
		return Shaped{}, false
	}
	s := Shaped{Policy: d.Policy, Key: BoundKey(key), At: d.At, Cost: d.Cost, Fallback: d.Fallback}
	for i := 0; i < d.N; i++ {
		s.Delays[i] = int64(d.Results[i].Delay / time.Microsecond)
	}
	return s, true
}

// CancelShaped gives s's places back on the limiter's store.
func (l *Limiter) CancelShaped(ctx context.Context, s *Shaped) error {
	return l.store.(ShapeStore).CancelShaped(ctx, s)
}

// LeaseStore is a store that holds leases.
type LeaseStore interface {
	// EndLease ends (renew false) or renews l in one round trip, as
	// StoreSide.ApplyLease does, at the store's now (µs), which it returns with
	// how many of l's slots it found still held (not released, not expired).
	EndLease(ctx context.Context, l *Lease, renew bool) (found, now int64, err error)
}

// Lease returns the lease an allowed decision d of this limiter took, and
// false when d took none (its policy holds no leases, or it denied).
func (l *Limiter) Lease(key string, d *Decision) (Lease, bool) {
	if !d.Policy.HoldsLeases() || !d.Allowed || d.Shadowed || d.Cost == 0 || d.N == 0 {
		return Lease{}, false
	}
	return Lease{Policy: d.Policy, Key: BoundKey(key), Token: d.At, Cost: d.Cost, Fallback: d.Fallback}, true
}

// EndLease ends or renews a lease on the limiter's store (see LeaseStore).
// A renewal moves the lease to the store's now and keeps only the slots
// still held. It reports whether any were.
func (l *Limiter) EndLease(ctx context.Context, lease *Lease, renew bool) (bool, error) {
	ls, ok := l.store.(LeaseStore)
	if !ok {
		return false, fmt.Errorf("policy %q: its store holds no leases (in_flight limits need the memory or Redis store)", lease.Policy.Name())
	}
	found, now, err := ls.EndLease(ctx, lease, renew)
	if err == nil && renew {
		lease.Token, lease.Cost = now, found
	}
	return found > 0, err
}

// Allow decides one request of cost 1 for key.
func (l *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	var d Decision
	err := l.Decide(ctx, key, 1, &d)
	return d, err
}

// SharedCount is one window's count of one counting limit (FixedWindow or
// SlidingCounter) of one key, as eventual mode shares it between nodes.
type SharedCount struct {
	// Policy and Key name the state; Limit is the limit's index in
	// Policy.Limits().
	Policy *Policy
	Key    string
	Limit  int
	// Start is the window's start in µs, as CountedWindows reports it.
	Start int64
	// Add is the units this node counted since it last shared them (0 to
	// only read).
	Add int64
	// Keep is how long from now the shared store keeps the window's count
	// at least: until the window stops counting (algo.CountsUntil), plus a
	// margin for nodes whose clocks lag; 0 or less: it forgets it at once.
	// Relative, so the store needs no clock of its own; an expiry it set
	// only moves later.
	Keep time.Duration
	// KeepNew is how long from now the store keeps a count it did not hold
	// before, at least: the span the window counts for (from its start to
	// algo.CountsUntil), so whoever reads the store finds a window's count
	// that long after the push that created it, late in its window or not.
	// 0 once the window has stopped counting.
	KeepNew time.Duration
	// Total is set by AddCounts: the fleet's units in that window.
	Total int64
}

// CountStore is a shared store that keeps plain per-window counts: eventual
// mode pushes its nodes' counts to it and reads the fleet's back.
type CountStore interface {
	// AddCounts adds every count's Add to the shared count of its window and
	// sets its Total, in one round trip.
	AddCounts(ctx context.Context, counts []SharedCount) error
	// DeleteCounts forgets the shared count of every count's window (an
	// operator's reset), in one round trip.
	DeleteCounts(ctx context.Context, counts []SharedCount) error
}
