// Package memory is tollgate's in-process store, the embedded default.
//
// Keys are spread over shards, each with its own lock, map and
// least-recently-used list, so parallel requests rarely contend and deciding
// for a key already tracked allocates nothing. The number of tracked keys is
// capped: inserting into a full shard first drops keys whose state has
// expired and then the least recently used one, so rotating keys (an attacker
// cycling client IPs) cannot grow memory past the cap.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/tollgate/tollgate/core"
)

// DefaultMaxKeys is the cap on tracked keys when Options.MaxKeys is 0.
const DefaultMaxKeys = 1 << 20

// shardCount is a power of two well above any core count we expect to share
// one gateway process, so two requests rarely meet on one lock.
const shardCount = 256

// Options configures a Store.
type Options struct {
	// MaxKeys caps the (policy, key) pairs tracked at once; 0 means
	// DefaultMaxKeys. The cap is split evenly over the shards, so with very few
	// keys a shard may evict slightly before MaxKeys keys are tracked in all.
	MaxKeys int
	// Clock tells the time; nil means the process's monotonic clock.
	Clock core.Clock
}

// Store is the in-memory store. Its zero value is not usable; call New.
type Store struct {
	shards   [shardCount]shard
	clock    core.Clock
	seed     maphash.Seed
	perShard int
	evicted  atomic.Int64
}

type shard struct {
	mu sync.Mutex
	m  map[entryKey]*entry
	// lru is a circular list through sentinel: lru.next is the most recently
	// used entry, lru.prev the least.
	lru entry
	_   [40]byte // keep neighbouring shards' locks off one cache line
}

type entryKey struct {
	scope string // Policy.Scope()
	key   string
}

type entry struct {
	k          entryKey
	states     []core.State
	expiresAt  int64 // µs; after it the states equal fresh ones
	prev, next *entry
}

// New returns a Store.
func New(opts Options) (*Store, error) {
	if opts.MaxKeys < 0 {
		return nil, fmt.Errorf("max_keys: %d must not be negative", opts.MaxKeys)
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.Clock == nil {
		opts.Clock = core.NewMonotonicClock()
	}
	s := &Store{clock: opts.Clock, seed: maphash.MakeSeed()}
	s.perShard = max(1, (opts.MaxKeys+shardCount-1)/shardCount)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[entryKey]*entry)
		sh.lru.next, sh.lru.prev = &sh.lru, &sh.lru
	}
	return s, nil
}

// MustNew is New for options known to be valid; it panics on error.
func MustNew(opts Options) *Store {
	s, err := New(opts)
	if err != nil {
		panic(err)
	}
	return s
}

// Decide applies p to key at the store's clock. It never fails.
func (s *Store) Decide(_ context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	s.DecideAt(p, key, cost, s.clock.NowMicros(), d)
	return nil
}

// DecideAt applies p to key as if at now (µs).
func (s *Store) DecideAt(p *core.Policy, key string, cost, now int64, d *core.Decision) {
	k := entryKey{scope: p.Scope(), key: key}
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(k.key)
	h.WriteByte(0)
	h.WriteString(k.scope)
	sh := &s.shards[h.Sum64()%shardCount]

	sh.mu.Lock()
	e := sh.m[k]
	if e == nil {
		e = s.insert(sh, k, len(p.Limits()), now)
	} else {
		e.unlink()
	}
	sh.pushFront(e)
	p.Apply(e.states, now, cost, d)
	e.expiresAt = now + p.IdleMicros()
	sh.mu.Unlock()
}

// insert adds a fresh entry for k to sh, making room first. sh.mu is held.
func (s *Store) insert(sh *shard, k entryKey, limits int, now int64) *entry {
	var reuse *entry
	// Drop expired entries from the cold end, a few per insert, so memory
	// follows the live keys even when the cap is never reached.
	for i := 0; i < 2; i++ {
		old := sh.lru.prev
		if old == &sh.lru || old.expiresAt > now {
			break
		}
		reuse = s.drop(sh, old)
	}
	if len(sh.m) >= s.perShard {
		reuse = s.drop(sh, sh.lru.prev)
	}
	e := reuse
	if e == nil || cap(e.states) < limits {
		e = &entry{states: make([]core.State, limits)}
	} else {
		states := e.states[:limits]
		for i := range states {
			// Keep a sliding log's ring if it fits: Step only reads its live part.
			states[i] = core.State{Log: states[i].Log[:0:cap(states[i].Log)]}
		}
		*e = entry{states: states}
	}
	e.k = k
	sh.m[k] = e
	return e
}

func (s *Store) drop(sh *shard, e *entry) *entry {
	e.unlink()
	delete(sh.m, e.k)
	s.evicted.Add(1)
	return e
}

func (sh *shard) pushFront(e *entry) {
	e.prev, e.next = &sh.lru, sh.lru.next
	sh.lru.next.prev = e
	sh.lru.next = e
}

func (e *entry) unlink() {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// Len returns how many (policy, key) pairs are tracked now.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Evicted returns how many entries were dropped, expired or evicted, so far.
func (s *Store) Evicted() int64 { return s.evicted.Load() }

// MaxKeys returns the effective cap on tracked keys.
func (s *Store) MaxKeys() int { return s.perShard * shardCount }

var _ core.Store = (*Store)(nil)
