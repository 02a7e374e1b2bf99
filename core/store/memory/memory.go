// Package memory is tollgate's in-process store, the embedded default.
//
// Keys are spread over shards. A shard's index is an open-addressed table
// that readers probe without a lock (entries are published atomically and
// never change identity), and each entry has its own lock, so a decision on a
// tracked key takes exactly one lock, the key's own, and allocates nothing.
// Only inserts and evictions take the shard's lock.
//
// The number of tracked keys is capped: inserting into a full shard drops
// expired keys it samples and otherwise the least recently used of the
// sample (as Redis approximates LRU), so rotating keys (an attacker cycling
// client IPs) cannot grow memory past the cap. Each insert also drops the
// expired keys of its sample, so memory follows the live keys below the cap.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tollgate/tollgate/core"
)

// DefaultMaxKeys is the cap on tracked keys when Options.MaxKeys is 0.
const DefaultMaxKeys = 1 << 20

// shardCount is a power of two well above any core count we expect to share
// one gateway process, so two inserts rarely meet on one lock.
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
	mu    sync.Mutex // held to change table or n
	table atomic.Pointer[table]
	n     int      // live entries
	_     [40]byte // keep neighbouring shards' locks off one cache line
}

// table is an open-addressed hash table of entries with linear probing,
// kept at most three quarters full. A slot's entry only ever goes from nil to an entry
// and from an entry to tombstone, so a reader probing without the shard's
// lock sees a consistent chain. Each slot repeats its entry's hash so a probe
// rejects other keys without touching their entries.
type table struct {
	mask  uint64
	used  int // slots not nil (entries and tombstones)
	slots []slot
}

type slot struct {
	entry atomic.Pointer[entry]
	hash  atomic.Uint64 // stored after entry: 0 until then
}

// tombstone marks a slot whose entry was dropped.
var tombstone = &entry{}

// entry is one (policy, key)'s state. Its first cache line holds what a
// decision touches: the lock, the identity to confirm, the times and a short
// key's bytes, so a lookup costs one miss for the slot and one for the entry.
type entry struct {
	mu sync.Mutex
	// hash, key and scope never change once the entry is published.
	hash uint64
	key  string // points into keyBytes when the key fits there
	// Guarded by mu.
	dead      bool  // dropped from the table: look the key up again
	lastUsed  int64 // µs
	expiresAt int64 // µs; after it the states equal fresh ones
	keyBytes  [inlineKeyLen]byte
	scope     string // Policy.Scope()
	states    []core.State
	inline    [1]core.State // states of a one-limit policy, saving a pointer chase
}

// inlineKeyLen is the longest key stored inside its entry (an IPv6 address
// in text is at most 39 bytes).
const inlineKeyLen = 40

// newEntry returns an entry for key, with the key's bytes copied inside it
// when they fit.
func newEntry(h uint64, scope, key string, limits int, now int64) *entry {
	e := &entry{hash: h, scope: scope, key: key, lastUsed: now, expiresAt: now}
	if n := copy(e.keyBytes[:], key); n == len(key) && n > 0 {
		e.key = unsafe.String(&e.keyBytes[0], n)
	}
	if limits == 1 {
		e.states = e.inline[:]
	} else {
		e.states = make([]core.State, limits)
	}
	return e
}

func newTable(size int) *table {
	return &table{mask: uint64(size - 1), slots: make([]slot, size)}
}

// put stores e in the first free slot of its probe chain. sh.mu is held.
func (t *table) put(e *entry) {
	i := e.hash & t.mask
	for t.slots[i].entry.Load() != nil {
		i = (i + 1) & t.mask
	}
	t.slots[i].entry.Store(e)
	t.slots[i].hash.Store(e.hash)
	t.used++
}

// find returns the live-table entry for (h, scope, key), or nil.
func (t *table) find(h uint64, scope, key string) *entry {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		e := t.slots[i].entry.Load()
		if e == nil {
			return nil
		}
		if t.slots[i].hash.Load() == h && e != tombstone && e.key == key && e.scope == scope {
			return e
		}
	}
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
		sh.table.Store(newTable(8))
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

// DecideAt applies p to key as if at now (µs). A key's clock never runs
// backwards: a request that read the clock just before a later one that took
// the key's lock first is decided at the later time.
func (s *Store) DecideAt(p *core.Policy, key string, cost, now int64, d *core.Decision) {
	h := maphash.String(s.seed, key) ^ p.ScopeHash()
	sh := &s.shards[(h>>32)%shardCount]
	scope := p.Scope()
	for {
		e := sh.table.Load().find(h, scope, key)
		if e == nil {
			e = s.insert(sh, h, scope, key, len(p.Limits()), now)
		}
		e.mu.Lock()
		if e.dead {
			// Evicted between the lookup and the lock: look again.
			e.mu.Unlock()
			continue
		}
		now = max(now, e.lastUsed)
		p.Apply(e.states, now, cost, d)
		e.lastUsed = now
		e.expiresAt = now + p.IdleMicros()
		e.mu.Unlock()
		return
	}
}

// insert returns the entry for the key, adding a fresh one if no other
// insert did meanwhile, after making room.
func (s *Store) insert(sh *shard, h uint64, scope, key string, limits int, now int64) *entry {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.table.Load()
	if e := t.find(h, scope, key); e != nil {
		return e
	}
	s.sweep(sh, t, now)
	if 4*(t.used+1) > 3*len(t.slots) {
		t = s.rebuild(sh, t)
	}
	e := newEntry(h, scope, key, limits, now)
	t.put(e)
	sh.n++
	return e
}

// rebuild copies the live entries of t into a new table (twice as large if
// they fill more than a third of t), leaving the tombstones behind, and
// publishes it. sh.mu is held.
func (s *Store) rebuild(sh *shard, t *table) *table {
	size := len(t.slots)
	if 3*(sh.n+1) > size {
		size *= 2
	}
	nt := newTable(size)
	for i := range t.slots {
		if e := t.slots[i].entry.Load(); e != nil && e != tombstone {
			nt.put(e)
		}
	}
	sh.table.Store(nt)
	return nt
}

// sweep looks at up to sampleSize entries of t from a pseudo-random slot,
// drops the expired ones, and if the shard is still full drops the least
// recently used of them. Entries busy deciding are skipped: they are in use.
// sh.mu is held.
func (s *Store) sweep(sh *shard, t *table, now int64) {
	var oldest *entry
	var oldestSlot uint64
	var oldestUsed int64
	start := (uint64(now) * 0x9E3779B97F4A7C15) >> 17
	seen := 0
	for k := uint64(0); k < uint64(len(t.slots)) && seen < sampleSize; k++ {
		i := (start + k) & t.mask
		e := t.slots[i].entry.Load()
		if e == nil || e == tombstone || !e.mu.TryLock() {
			continue
		}
		seen++
		if e.expiresAt <= now {
			s.drop(sh, t, i, e)
		} else if oldest == nil || e.lastUsed < oldestUsed {
			oldest, oldestSlot, oldestUsed = e, i, e.lastUsed
		}
		e.mu.Unlock()
	}
	if sh.n >= s.perShard && oldest != nil && oldest.mu.TryLock() {
		s.drop(sh, t, oldestSlot, oldest)
		oldest.mu.Unlock()
	}
}

// drop removes e from slot i of t. sh.mu and e.mu are held.
func (s *Store) drop(sh *shard, t *table, i uint64, e *entry) {
	e.dead = true
	t.slots[i].entry.Store(tombstone)
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
