// Package memory is tollgate's in-process store, the embedded default.
//
// Keys are spread over shards, each with its own lock and map, so parallel
// requests rarely contend, and deciding for a key already tracked allocates
// nothing. The number of tracked keys is capped: inserting into a full shard
// drops expired keys it samples and otherwise the least recently used of the
// sample (as Redis approximates LRU), so rotating keys (an attacker cycling
// client IPs) cannot grow memory past the cap. Each insert also samples a few
// keys and drops the expired ones, so memory follows the live keys even below
// the cap.
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

// sampleSize is how many entries an insert looks at to find expired or
// least recently used ones.
const sampleSize = 8

// Options configures a Store.
type Options struct {
	// MaxKeys caps the (policy, key) pairs tracked at once; 0 means
	// DefaultMaxKeys. The cap is split evenly over the shards, so a shard may
	// evict slightly before MaxKeys keys are tracked in all.
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
	// m indexes entries by the hash of (policy scope, key); entries whose
	// hashes collide chain through entry.collide.
	m map[uint64]*entry
	n int      // entries, chained ones included
	_ [40]byte // keep neighbouring shards' locks off one cache line
}

type entry struct {
	scope     string // Policy.Scope()
	key       string
	states    []core.State
	lastUsed  int64 // µs
	expiresAt int64 // µs; after it the states equal fresh ones
	collide   *entry
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
		sh.m = make(map[uint64]*entry)
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
	h := maphash.String(s.seed, key) ^ p.ScopeHash()
	sh := &s.shards[(h>>32)%shardCount]
	scope := p.Scope()

	sh.mu.Lock()
	e := sh.m[h]
	for e != nil && (e.key != key || e.scope != scope) {
		e = e.collide
	}
	if e == nil {
		e = s.insert(sh, h, scope, key, len(p.Limits()), now)
	}
	p.Apply(e.states, now, cost, d)
	e.lastUsed = now
	e.expiresAt = now + p.IdleMicros()
	sh.mu.Unlock()
}

// insert adds a fresh entry to sh, making room first. sh.mu is held.
func (s *Store) insert(sh *shard, h uint64, scope, key string, limits int, now int64) *entry {
	reuse := s.sweep(sh, now)
	e := reuse
	if e == nil || cap(e.states) < limits {
		e = &entry{states: make([]core.State, limits)}
	} else {
		states := e.states[:limits]
		for i := range states {
			// Keep a sliding log's ring for reuse: Step reads only its live part.
			states[i] = core.State{Log: states[i].Log[:0]}
		}
		*e = entry{states: states}
	}
	e.scope, e.key = scope, key
	e.collide = sh.m[h]
	sh.m[h] = e
	sh.n++
	return e
}

// sweep looks at a few entries of sh from a random place, drops the expired
// ones, and if sh is still full drops the least recently used of them. It
// returns a dropped entry for reuse, or nil. sh.mu is held.
func (s *Store) sweep(sh *shard, now int64) *entry {
	var dropped, oldest *entry
	var oldestHash uint64
	seen := 0
	for h, head := range sh.m {
		for e := head; e != nil; e = e.collide {
			if e.expiresAt <= now {
				s.drop(sh, h, e)
				dropped = e
			} else if oldest == nil || e.lastUsed < oldest.lastUsed {
				oldest, oldestHash = e, h
			}
			seen++
		}
		if seen >= sampleSize {
			break
		}
	}
	if sh.n >= s.perShard && oldest != nil {
		s.drop(sh, oldestHash, oldest)
		dropped = oldest
	}
	return dropped
}

func (s *Store) drop(sh *shard, h uint64, e *entry) {
	if sh.m[h] == e {
		if e.collide == nil {
			delete(sh.m, h)
		} else {
			sh.m[h] = e.collide
		}
	} else {
		for prev := sh.m[h]; prev != nil; prev = prev.collide {
			if prev.collide == e {
				prev.collide = e.collide
				break
			}
		}
	}
	e.collide = nil
	sh.n--
	s.evicted.Add(1)
}

// Len returns how many (policy, key) pairs are tracked now.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// Evicted returns how many entries were dropped, expired or evicted, so far.
func (s *Store) Evicted() int64 { return s.evicted.Load() }

// MaxKeys returns the effective cap on tracked keys.
func (s *Store) MaxKeys() int { return s.perShard * shardCount }

var _ core.Store = (*Store)(nil)
