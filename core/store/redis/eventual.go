package redis

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/core"
)

// EventualOptions configures an EventualStore.
type EventualOptions struct {
	// SyncInterval is how often a node pushes its counts to Redis and pulls
	// the fleet's; 0 means 1s. It must be at least 20ms (Kong's sync_rate floor).
	SyncInterval time.Duration
	// MaxKeys caps the keys tracked locally; 0 means 100,000.
	MaxKeys int
	// Clock tells local time; nil means the monotonic clock. Windows are
	// aligned to it, so nodes' clocks must agree to well under a window.
	Clock core.Clock
	// OnStateChange, if set, is called once when syncs start failing (failing
	// true, with the error; counts stay local and are pushed at the next
	// sync) and once when a sync succeeds again (false, nil).
	OnStateChange func(failing bool, err error)
}

// EventualStore decides every request locally, from the fleet's counts as of
// the last sync plus what this node allowed since, and pushes its counts to
// Redis and pulls the fleet's every SyncInterval (Kong's sync_rate). Decisions
// never wait for Redis. Only the counting algorithms can be shared this way:
// fixed_window and sliding_counter.
//
// The price is overshoot: between two syncs each node only knows its own new
// requests, so a fleet of k nodes can admit up to about k × (the requests
// one node admits per SyncInterval) beyond the limit per window.
type EventualStore struct {
	redis    *Store
	opts     EventualOptions
	mu       sync.Mutex
	entries  map[denyKey]*eventualEntry
	stop     chan struct{}
	done     chan struct{}
	syncs    atomic.Int64
	failures atomic.Int64
}

type eventualEntry struct {
	policy   *core.Policy
	key      string
	limits   []eventualLimit
	lastUsed int64
}

// eventualLimit is one limit's view of the fleet's counts: per window, what
// Redis said at the last sync plus what this node added since.
type eventualLimit struct {
	start                   int64 // current window start, µs
	currGlobal, currPending int64
	prevGlobal, prevPending int64 // the window before start
}

// NewEventual returns an eventually consistent store over s and starts its
// sync loop; Close stops it.
func NewEventual(s *Store, opts EventualOptions) (*EventualStore, error) {
	if opts.SyncInterval == 0 {
		opts.SyncInterval = time.Second
	}
	if opts.SyncInterval < 20*time.Millisecond {
		return nil, fmt.Errorf("sync_interval: %s must be at least 20ms", opts.SyncInterval)
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
	e := &EventualStore{redis: s, opts: opts, entries: map[denyKey]*eventualEntry{}, stop: make(chan struct{}), done: make(chan struct{})}
	go e.loop()
	return e, nil
}

// CheckPolicy reports whether p can be decided eventually.
func CheckPolicy(p *core.Policy) error {
	for i, l := range p.Limits() {
		if l.Algorithm != core.FixedWindow && l.Algorithm != core.SlidingCounter {
			return fmt.Errorf("policy %q limit %d (%s): eventual mode counts requests, so it needs fixed_window or sliding_counter, not %s",
				p.Name(), i+1, l.Rate(), l.Algorithm)
		}
	}
	return nil
}

// Syncs returns how many syncs completed.
func (e *EventualStore) Syncs() int64 { return e.syncs.Load() }

// Decide decides locally; it never calls Redis.
func (e *EventualStore) Decide(_ context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	if err := CheckPolicy(p); err != nil {
		return err
	}
	now := e.opts.Clock.NowMicros()
	limits := p.Limits()
	e.mu.Lock()
	defer e.mu.Unlock()
	k := denyKey{p.Scope(), key}
	ent := e.entries[k]
	if ent == nil {
		if len(e.entries) >= e.opts.MaxKeys {
			e.evictOne()
		}
		ent = &eventualEntry{policy: p, key: key, limits: make([]eventualLimit, len(limits))}
		e.entries[k] = ent
	}
	ent.lastUsed = now
	d.Start(p, cost)
	d.At = now
	allowed := true
	for i := range limits {
		l := &limits[i]
		el := &ent.limits[i]
		el.roll(now, int64(l.Window/time.Microsecond))
		st := core.State{A: el.start, B: el.currGlobal + el.currPending, C: el.prevGlobal + el.prevPending}
		_, d.Results[i] = core.Step(l, st, now, cost)
		allowed = allowed && d.Results[i].Allowed
	}
	if allowed {
		for i := range ent.limits {
			ent.limits[i].currPending += cost
		}
	} else {
		for i := range limits {
			if d.Results[i].Allowed {
				el := &ent.limits[i]
				st := core.State{A: el.start, B: el.currGlobal + el.currPending, C: el.prevGlobal + el.prevPending}
				_, d.Results[i] = core.Step(&limits[i], st, now, 0)
			}
		}
	}
	d.Summarize(allowed)
	return nil
}

// roll moves the counts to the window holding now.
func (el *eventualLimit) roll(now, w int64) {
	start := now - now%w
	switch {
	case el.start == start:
	case el.start == start-w:
		el.prevGlobal, el.prevPending = el.currGlobal, el.currPending
		el.currGlobal, el.currPending = 0, 0
		el.start = start
	default:
		*el = eventualLimit{start: start}
	}
}

// evictOne drops an entry with nothing left to push. e.mu is held.
func (e *EventualStore) evictOne() {
	for k, ent := range e.entries {
		pending := false
		for _, el := range ent.limits {
			pending = pending || el.currPending > 0 || el.prevPending > 0
		}
		if !pending {
			delete(e.entries, k)
			return
		}
	}
}

func (e *EventualStore) loop() {
	defer close(e.done)
	t := time.NewTicker(e.opts.SyncInterval)
	defer t.Stop()
	wasFailing := false
	for {
		select {
		case <-e.stop:
			e.Sync(context.Background()) // push what is left
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

// windowKey names one limit's count for one window.
func (e *EventualStore) windowKey(ent *eventualEntry, i int, start int64) string {
	return e.redis.prefix + "{" + ent.policy.Name() + ":" + ent.key + "}:" + ent.policy.LimitID(i) + ":" + strconv.FormatInt(start, 10)
}

type pushed struct {
	ent                  *eventualEntry
	i                    int
	start                int64
	curr, prev           *goredis.IntCmd
	currDelta, prevDelta int64
}

// Sync pushes every pending count to Redis and pulls the fleet's counts for
// the keys this node tracks, in one pipeline.
func (e *EventualStore) Sync(ctx context.Context) error {
	now := e.opts.Clock.NowMicros()
	var work []pushed
	e.mu.Lock()
	for k, ent := range e.entries {
		idle := true
		for i, l := range ent.policy.Limits() {
			w := int64(l.Window / time.Microsecond)
			el := &ent.limits[i]
			el.roll(now, w)
			if now-ent.lastUsed < 2*w || el.currPending > 0 || el.prevPending > 0 {
				idle = false
			}
			work = append(work, pushed{ent: ent, i: i, start: el.start, currDelta: el.currPending, prevDelta: el.prevPending})
		}
		if idle {
			delete(e.entries, k)
			work = work[:len(work)-len(ent.limits)]
		}
	}
	e.mu.Unlock()
	if len(work) == 0 {
		e.syncs.Add(1)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.redis.timeout)
	defer cancel()
	_, err := e.redis.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for j := range work {
			wk := &work[j]
			l := wk.ent.policy.Limits()[wk.i]
			w := int64(l.Window / time.Microsecond)
			ttl := time.Duration(3*w) * time.Microsecond
			currKey, prevKey := e.windowKey(wk.ent, wk.i, wk.start), e.windowKey(wk.ent, wk.i, wk.start-w)
			wk.curr = p.IncrBy(ctx, currKey, wk.currDelta)
			p.PExpire(ctx, currKey, ttl)
			wk.prev = p.IncrBy(ctx, prevKey, wk.prevDelta)
			p.PExpire(ctx, prevKey, ttl)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("eventual sync: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, wk := range work {
		el := &wk.ent.limits[wk.i]
		switch el.start {
		case wk.start: // still the same window: the pushed deltas are in Redis now
			el.currGlobal, el.currPending = wk.curr.Val(), el.currPending-wk.currDelta
			el.prevGlobal, el.prevPending = wk.prev.Val(), el.prevPending-wk.prevDelta
		case wk.start + int64(wk.ent.policy.Limits()[wk.i].Window/time.Microsecond):
			// The window rolled during the sync: what was current is now previous.
			el.prevGlobal, el.prevPending = wk.curr.Val(), el.prevPending-wk.currDelta
		}
	}
	e.syncs.Add(1)
	return nil
}

// Close stops the sync loop after a last push.
func (e *EventualStore) Close() error {
	select {
	case <-e.stop:
	default:
		close(e.stop)
	}
	<-e.done
	return nil
}

var _ core.Store = (*EventualStore)(nil)
