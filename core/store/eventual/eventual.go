// Package eventual is tollgate's eventually consistent store: every request
// is decided locally, by the same StoreSide.Apply the memory store runs, on
// states that hold the fleet's counts as of the last sync plus what this
// node counted since. Every sync interval a node pushes
// its counts to a shared count store (Redis) and reads the fleet's back.
// Decisions never wait for the shared store.
//
// Only the counting algorithms can be shared this way: fixed_window and
// sliding_counter, whose states are per-window counts (algo.CountedWindows).
// The sync moves counts and nothing else: the windows are the step
// function's own.
//
// The price is overshoot: between two syncs each node only knows its own new
// requests, so a fleet of k nodes can admit up to about k × (the requests
// one node admits per sync interval) beyond the limit per window.
package eventual

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// Options configures a Store.
type Options struct {
	// SyncInterval is how often a node pushes its counts and pulls the
	// fleet's; 0 means 1s, and it must be at least MinSyncInterval.
	SyncInterval time.Duration
	// MaxKeys caps the keys tracked locally; 0 means 100,000.
	MaxKeys int
	// Clock tells local time; nil means the monotonic clock. Windows are
	// aligned to it, so nodes' clocks must agree to well under a window.
	Clock core.Clock
	// Manual turns the sync loop off: the caller calls Sync (tests, and the
	// conformance suite's sync after every decision).
	Manual bool
	// OnError is what a decision does, while syncs fail, on a key this
	// node has no view of the fleet's counts for (first seen since the
	// last sync that succeeded): OnErrorLocal (the default) decides it
	// locally like every other key; OnErrorAllow and OnErrorDeny decide
	// nothing (core.Decision.Undecided, marked Fallback); OnErrorFail
	// returns the sync's error. Keys with a view keep deciding locally.
	OnError core.OnError
	// OnStateChange, if set, is called once when syncs start failing (failing
	// true, with the error; counts stay local and are pushed at the next
	// sync) and once when a sync succeeds again (false, nil).
	OnStateChange func(failing bool, err error)
}

// Store is the eventually consistent store. Create it with New.
type Store struct {
	shared   core.CountStore
	opts     Options
	mu       sync.Mutex
	syncMu   sync.Mutex // one Sync or Reset at a time: a reset is not undone by a push in flight
	entries  map[entryKey]*entry
	byName   map[entryKey][]*entry // entries by policy name (in scope) and key
	stop     chan struct{}
	done     chan struct{}
	syncs    atomic.Int64
	failures atomic.Int64
	syncErr  error // the last sync's error, nil once one succeeds; under mu
}

type entryKey struct{ scope, key string }

// entry is one key's local view under one policy.
type entry struct {
	policy   *core.Policy
	key      string
	states   []algo.State // the fleet's counts at the last sync plus pending
	pending  []pending    // what this node counted and has not pushed
	lastUsed int64
	viewed   bool // a sync read the fleet's counts of its windows
	// touched is set by a decision and cleared by the sync that reads the
	// entry: a key no request has touched since the last sync costs the
	// shared store nothing (its view is refreshed at the sync after its
	// next request, the same one-interval staleness a new key has).
	touched bool
}

// pending is units this node counted in one window of one limit.
type pending struct {
	limit int
	start int64
	units int64
}

// add counts units in limit's window at start.
func (e *entry) add(limit int, start, units int64) {
	for i := range e.pending {
		if p := &e.pending[i]; p.limit == limit && p.start == start {
			p.units += units
			return
		}
	}
	e.pending = append(e.pending, pending{limit, start, units})
}

// unpushed returns the units counted in limit's window at start and not
// yet pushed.
func (e *entry) unpushed(limit int, start int64) int64 {
	for _, p := range e.pending {
		if p.limit == limit && p.start == start {
			return p.units
		}
	}
	return 0
}

// New returns an eventually consistent store over shared and, unless
// opts.Manual, starts its sync loop; Close stops it.
func New(shared core.CountStore, opts Options) (*Store, error) {
	if opts.SyncInterval == 0 {
		opts.SyncInterval = time.Second
	}
	if err := CheckSyncInterval(opts.SyncInterval); err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	if opts.OnError > core.OnErrorFail {
		return nil, fmt.Errorf("on_error: unknown value %d", opts.OnError)
	}
	if opts.MaxKeys < 0 {
		return nil, fmt.Errorf("max_keys: %d must not be negative", opts.MaxKeys)
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = 100_000
	}
	if opts.Clock == nil {
		opts.Clock = core.NewMonotonicClock()
	}
	e := &Store{shared: shared, opts: opts, entries: map[entryKey]*entry{}, byName: map[entryKey][]*entry{}, stop: make(chan struct{}), done: make(chan struct{})}
	if opts.Manual {
		close(e.done)
	} else {
		go e.loop()
	}
	return e, nil
}

// MinSyncInterval is the shortest interval eventual mode syncs at (a common
// sync floor among gateways).
const MinSyncInterval = 20 * time.Millisecond

// CheckSyncInterval reports whether d can be eventual mode's sync interval
// (0 means the default).
func CheckSyncInterval(d time.Duration) error {
	if d != 0 && d < MinSyncInterval {
		return fmt.Errorf("%s must be at least %s", d, MinSyncInterval)
	}
	return nil
}

// CheckLimits reports whether limits, those of the policy named policy,
// can be decided eventually: eventual mode counts requests per window, so
// every limit must count (fixed_window or sliding_counter). It is the one
// place the rule is checked and worded.
func CheckLimits(policy string, limits []algo.Limit) error {
	for i := range limits {
		if _, n := algo.CountedWindows(&limits[i], algo.State{}); n == 0 {
			return fmt.Errorf("policy %q limit %d (%s): eventual mode counts requests, so it needs fixed_window or sliding_counter, not %s",
				policy, i+1, limits[i].Rate(), limits[i].Algorithm)
		}
	}
	return nil
}

// CheckPolicy is CheckLimits for p's limits (each plan's policy is
// checked on its own).
func CheckPolicy(p *core.Policy) error { return CheckLimits(p.Name(), p.Limits()) }

// Syncs returns how many syncs completed.
func (e *Store) Syncs() int64 { return e.syncs.Load() }

// Decide decides locally with StoreSide.Apply; it never calls the shared store.
// p must be one CheckPolicy accepts, as config.Compile checks once when a
// config is loaded: the request path does not check it again.
func (e *Store) Decide(_ context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	now := e.opts.Clock.NowMicros()
	ps := p.StoreSide()
	e.mu.Lock()
	defer e.mu.Unlock()
	k := entryKey{ps.Scope(), key}
	ent := e.entries[k]
	if ent == nil {
		if len(e.entries) >= e.opts.MaxKeys {
			e.evictOne()
		}
		ent = &entry{policy: p, key: key, states: make([]algo.State, len(p.Configured()))}
		e.entries[k] = ent
		nk := entryKey{p.Name(), key}
		e.byName[nk] = append(e.byName[nk], ent)
	}
	// The clock was read before the lock: a concurrent decision may have
	// moved the key on since. Its time only moves forward, as in the
	// memory store, or a state moved back a window forgets the new one's
	// count.
	if siblings := e.byName[entryKey{p.Name(), key}]; len(siblings) > 1 {
		e.refresh(ent, siblings)
		for _, sib := range siblings {
			sib.touched = true // the next sync reads every view of the key (see refresh)
		}
	}
	if !ent.viewed && e.syncErr != nil && e.opts.OnError != core.OnErrorLocal {
		// No count of the fleet's, and no way to get one now.
		if e.opts.OnError == core.OnErrorFail {
			return fmt.Errorf("eventual: no view of the fleet's counts of this key while syncs fail: %w", e.syncErr)
		}
		d.Undecided(p, cost, e.opts.OnError == core.OnErrorAllow)
		d.Fallback = true
		return nil
	}
	now = max(now, ent.lastUsed)
	ent.lastUsed = now
	ent.touched = true
	// Count what each step function counted: a committed request's cost,
	// a charge's cost even past the limit, nothing for a check or a denial.
	var before [core.MaxLimits]algo.State
	copy(before[:], ent.states)
	ps.Apply(ent.states, now, cost, d)
	limits := p.Limits()
	for i := range limits {
		if start, units, ok := algo.CountedSince(&limits[i], before[i], ent.states[i]); ok && units > 0 {
			ent.add(i, start, units)
		}
	}
	return nil
}

// refresh takes, for each limit of ent that another policy of its name
// has too, that entry's view if it was used after ent: this node's count
// of a limit is one, whichever of the name's policies counted last (a
// reload that added, removed or changed a limit keeps the others' usage;
// a new entry starts from its siblings). ent's time moves on to the
// newest view it took: a key's clock never runs back. e.mu is held.
func (e *Store) refresh(ent *entry, siblings []*entry) {
	newest := ent.lastUsed
	for i, id := range ent.policy.StoreSide().LimitIDs() {
		latest, from := ent.lastUsed, -1
		var src *entry
		for _, other := range siblings {
			if other == ent || other.lastUsed <= latest {
				continue
			}
			if j := slices.Index(other.policy.StoreSide().LimitIDs(), id); j >= 0 {
				latest, from, src = other.lastUsed, j, other
			}
		}
		if src != nil {
			ent.states[i] = src.states[from] // counted windows only: no ring to share
			newest = max(newest, latest)
		}
	}
	ent.lastUsed = newest
}

// remove drops the entry at k from both indexes. e.mu is held.
func (e *Store) remove(k entryKey, ent *entry) {
	delete(e.entries, k)
	nk := entryKey{ent.policy.Name(), ent.key}
	list := slices.DeleteFunc(e.byName[nk], func(o *entry) bool { return o == ent })
	if len(list) == 0 {
		delete(e.byName, nk)
	} else {
		e.byName[nk] = list
	}
}

// evictOne drops an entry with nothing left to push. e.mu is held.
func (e *Store) evictOne() {
	for k, ent := range e.entries {
		if len(ent.pending) == 0 {
			e.remove(k, ent)
			return
		}
	}
}

func (e *Store) loop() {
	defer close(e.done)
	t := time.NewTicker(e.opts.SyncInterval)
	defer t.Stop()
	wasFailing := false
	for {
		select {
		case <-e.stop:
			_ = e.Sync(context.Background()) // push what is left
			return
		case <-t.C:
			err := e.Sync(context.Background())
			if err != nil {
				e.failures.Add(1)
			}
			if failing := err != nil; failing != wasFailing {
				wasFailing = failing
				if e.opts.OnStateChange != nil {
					e.opts.OnStateChange(failing, err)
				}
			}
		}
	}
}

// slot names one window of one limit of one entry in a sync.
type slot struct {
	ent   *entry
	limit int
	start int64
}

// Sync pushes every pending count to the shared store and reads back the
// fleet's counts of the windows the local states count, in one round trip,
// for the keys a decision touched since the last sync: an idle key costs
// the shared store nothing, so a sync's cost grows with the keys in use,
// not with the keys held. Entries idle past their policy's idle time with
// nothing pending are dropped.
func (e *Store) Sync(ctx context.Context) error {
	e.syncMu.Lock()
	defer e.syncMu.Unlock()
	now := e.opts.Clock.NowMicros()
	var work []core.SharedCount
	index := map[slot]int{}
	e.mu.Lock()
	for k, ent := range e.entries {
		if len(ent.pending) == 0 && now-ent.lastUsed >= ent.policy.StoreSide().IdleMicros() {
			e.remove(k, ent)
			continue
		}
		if !ent.touched && len(ent.pending) == 0 {
			continue
		}
		ent.touched = false
		at := func(limit int, start int64) *core.SharedCount {
			s := slot{ent, limit, start}
			if i, ok := index[s]; ok {
				return &work[i]
			}
			index[s] = len(work)
			work = append(work, sharedCount(ent.policy, ent.key, limit, start, now))
			return &work[len(work)-1]
		}
		for _, p := range ent.pending {
			at(p.limit, p.start).Add += p.units
		}
		ent.pending = ent.pending[:0]
		limits := ent.policy.Limits()
		for i := range limits {
			w, n := algo.CountedWindows(&limits[i], ent.states[i])
			for _, win := range w[:n] {
				at(i, win.Start)
			}
		}
	}
	if len(work) == 0 { // nothing to push or read: Redis is not asked, and syncErr stands
		e.mu.Unlock()
		e.syncs.Add(1)
		return nil
	}
	e.mu.Unlock()
	err := e.shared.AddCounts(ctx, work)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		// Nothing reached the fleet: keep the counts, and the keys to read,
		// for the next sync.
		for s, i := range index {
			s.ent.touched = true
			if work[i].Add > 0 {
				s.ent.add(s.limit, s.start, work[i].Add)
			}
		}
		e.syncErr = fmt.Errorf("eventual sync: %w", err)
		return e.syncErr
	}
	// Each window the states count now takes the fleet's total plus what
	// this node counted during the round trip. A window the state moved to
	// meanwhile was not read: it keeps its local count until the next sync.
	updated := map[slot]bool{}
	for s := range index {
		ent, limit := s.ent, s.limit
		once := slot{ent, limit, 0} // one update per (entry, limit)
		if updated[once] {
			continue
		}
		updated[once] = true
		l := &ent.policy.Limits()[limit]
		st := ent.states[limit]
		w, n := algo.CountedWindows(l, st)
		counts := [2]int64{w[0].Count, w[1].Count}
		for j := 0; j < n; j++ {
			if i, ok := index[slot{ent, limit, w[j].Start}]; ok {
				counts[j] = work[i].Total + ent.unpushed(limit, w[j].Start)
			}
		}
		ent.states[limit] = algo.WithCounts(l, st, counts)
		ent.viewed = true
	}
	e.syncErr = nil
	e.syncs.Add(1)
	return nil
}

// clockSkew is how long a window's shared count outlives the window (as
// this node's clock tells it), for nodes whose clocks lag this one's.
const clockSkew = time.Second

// sharedCount is the SharedCount of l's window that starts at start, with
// how long the shared store keeps it: until the window stops counting (as
// the step function says) plus clockSkew, whenever the sync that asks is,
// and, while the window counts, a count it creates at least the span the
// window counts for. A window past that is counted by no one: its count
// goes at once (Keep 0 or less).
func sharedCount(p *core.Policy, key string, limit int, start, now int64) core.SharedCount {
	until := algo.CountsUntil(&p.Limits()[limit], start)
	c := core.SharedCount{Policy: p, Key: key, Limit: limit, Start: start,
		Keep: algo.FromMicros(until-now) + clockSkew}
	if now < until {
		c.KeepNew = algo.FromMicros(until - start)
	}
	return c
}

// windowsNow returns key's states under p as this node holds them, moved
// to now by a request of cost 0 (so the step function, not this store,
// says which windows count now), and a SharedCount for each window each
// limit counts (all limits, or only limit).
func (e *Store) windowsNow(p *core.Policy, key string, limit int, now int64) ([]algo.State, []core.SharedCount) {
	ps := p.StoreSide()
	states := make([]algo.State, len(p.Limits()))
	if ent := e.entries[entryKey{ps.Scope(), key}]; ent != nil {
		copy(states, ent.states)
	}
	var probe core.Decision
	ps.Apply(states, now, 0, &probe)
	var windows []core.SharedCount
	limits := p.Limits()
	for i := range limits {
		if limit != core.AllLimits && i != limit {
			continue
		}
		w, n := algo.CountedWindows(&limits[i], states[i])
		for _, win := range w[:n] {
			windows = append(windows, sharedCount(p, key, i, win.Start, now))
		}
	}
	return states, windows
}

// Inspect reads key's usage as the fleet counts it (core.Operator): the
// shared counts of the windows that count now, plus what this node counted
// and has not pushed, in one round trip; d is what a request of cost 0
// would see on them. No count changes. p is one CheckPolicy accepted, as
// for Decide.
func (e *Store) Inspect(ctx context.Context, p *core.Policy, key string, d *core.Decision) error {
	now := e.opts.Clock.NowMicros()
	e.mu.Lock()
	states, windows := e.windowsNow(p, key, core.AllLimits, now)
	e.mu.Unlock()
	if err := e.shared.AddCounts(ctx, windows); err != nil { // Add 0: a read
		return fmt.Errorf("eventual inspect: %w", err)
	}
	e.mu.Lock()
	ps := p.StoreSide()
	ent := e.entries[entryKey{ps.Scope(), key}]
	limits := p.Limits()
	for i := range limits {
		w, n := algo.CountedWindows(&limits[i], states[i])
		counts := [2]int64{w[0].Count, w[1].Count}
		for j := 0; j < n; j++ {
			for _, c := range windows {
				if c.Limit == i && c.Start == w[j].Start {
					counts[j] = c.Total
				}
			}
			if ent != nil {
				counts[j] += ent.unpushed(i, w[j].Start)
			}
		}
		states[i] = algo.WithCounts(&limits[i], states[i], counts)
	}
	e.mu.Unlock()
	ps.Apply(states, now, 0, d)
	return nil
}

// Reset forgets key's counts under p in limit or every limit
// (core.Operator): the fleet's shared counts of the windows that count
// now, and this node's view and unpushed counts. Other nodes forget theirs
// when they read the key again, at the sync after they next decide it
// (a node reads only the keys it uses), except what they counted and have
// not pushed yet: up to one sync interval of their admissions survives a
// reset, the same bound as eventual mode's overshoot. p is one
// CheckPolicy accepted, as for Decide.
func (e *Store) Reset(ctx context.Context, p *core.Policy, key string, limit int) error {
	e.syncMu.Lock()
	defer e.syncMu.Unlock()
	e.mu.Lock()
	_, windows := e.windowsNow(p, key, limit, e.opts.Clock.NowMicros())
	// This node's view of each limit reset is forgotten under every policy
	// of the name that has the limit (see refresh).
	var ids []string
	for i, id := range p.StoreSide().LimitIDs() {
		if limit == core.AllLimits || i == limit {
			ids = append(ids, id)
		}
	}
	for _, ent := range e.byName[entryKey{p.Name(), key}] {
		reset := func(i int) bool { return slices.Contains(ids, ent.policy.StoreSide().LimitID(i)) }
		kept := ent.pending[:0]
		for _, pd := range ent.pending {
			if !reset(pd.limit) {
				kept = append(kept, pd)
			}
		}
		ent.pending = kept
		for i := range ent.states {
			if reset(i) {
				ent.states[i] = algo.State{}
			}
		}
	}
	e.mu.Unlock()
	if err := e.shared.DeleteCounts(ctx, windows); err != nil {
		return fmt.Errorf("eventual reset: %w", err)
	}
	return nil
}

// Close stops the sync loop after a last push.
func (e *Store) Close() error {
	select {
	case <-e.stop:
	default:
		close(e.stop)
	}
	<-e.done
	if e.opts.Manual {
		return e.Sync(context.Background())
	}
	return nil
}

var (
	_ core.Store    = (*Store)(nil)
	_ core.Operator = (*Store)(nil)
)
