// Package memory is tollgate's in-process store, the embedded default.
//
// A (policy, key) pair is identified by a 128-bit hash of both (two
// independent 64-bit hashes with a per-store random seed): the chance that
// two of a million tracked keys ever share one is below 10^-26, and storing
// no key bytes keeps a key's hot state in one cache line.
//
// Usage is kept per limit. The first hash covers the policy's name and the
// key, the second its limits too, so the state a key had under a policy
// whose limits have since changed (a reload that adds, removes or changes
// one) sits in the same probe chain: the first decision under the new
// limits carries each unchanged limit's state over from it and drops it.
//
// Keys are spread over shards. A shard's index is an open-addressed table
// whose slots hold the entries themselves, so a decision on a tracked key
// misses the cache once, and hold no pointers, so the collector does not
// scan a million keys. A one-limit policy's state lies in its entry; a
// sliding log's ring of times lies apart, named by its entry's index in a
// shard-wide slice of ring headers, and holds no pointers: a key costs
// the collector one small object to mark and none to scan. Readers probe it without a lock (an entry is
// published by storing its hash last), and each entry has its own lock,
// so a decision on a tracked key takes exactly one lock, the key's own,
// and allocates nothing. Only inserts, evictions and a table's rebuild
// take the shard's lock; a rebuild moves the live entries to a new table
// and leaves the old ones dead, and a decision that meets a dead entry
// waits for the shard's change and looks again.
//
// The number of tracked keys is capped: inserting into a full shard drops
// expired keys it samples and otherwise the least recently used of the
// sample (as Redis approximates LRU), so rotating keys (an attacker cycling
// client IPs) cannot grow memory past the cap. Each insert also drops the
// expired keys of its sample, and a table is rebuilt for its live keys, so
// memory follows the live keys below the cap.
package memory

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// DefaultMaxKeys is the cap on tracked keys when Options.MaxKeys is 0.
const DefaultMaxKeys = 1 << 20

// MaxMaxKeys is the largest cap on tracked keys: 2^30 (a billion keys is
// hundreds of GB of states; a larger number is a typo).
const MaxMaxKeys = 1 << 30

// maxParked bounds the states an entry carries for other policies of its
// name: twice the limits of one policy.
const maxParked = 2 * core.MaxLimits

// shardCount is a power of two well above any core count we expect to share
// one gateway process, so two inserts rarely meet on one lock.
const shardCount = 256

// sampleSize is how many entries an insert looks at to find expired or
// least recently used ones.
const sampleSize = 8

// Options configures a Store.
type Options struct {
	// MaxKeys caps the (policy, key) pairs tracked at once; 0 means
	// DefaultMaxKeys. The cap is split evenly over the 256 shards, rounded up
	// to a multiple of 256 (Store.MaxKeys reports it), and a shard may evict
	// before the whole store is full.
	MaxKeys int
	// Clock tells the time; nil means the process's monotonic clock.
	Clock core.Clock
}

// Store is the in-memory store. Its zero value is not usable; call New.
type Store struct {
	shards [shardCount]shard
	clock  core.Clock
	// monotonic is set when clock is the process's monotonic clock, read
	// then without a call through the interface.
	monotonic   bool
	seed, seed2 uintptr
	perShard    int
}

type shard struct {
	mu sync.Mutex // held to change table, n, auxes, free or shared
	// ringMu is held to change rings or freeRings. A decision growing
	// its ring takes it under its entry's lock; nothing takes an entry's
	// lock under it.
	ringMu sync.Mutex
	// rings are the ringed entries' sliding-log rings, by index (entry.c):
	// a decision's state points at its entry's. Grown by copy under
	// ringMu, so a decision reads its own without it; an entry's ring is
	// written under its lock and ringMu.
	rings     atomic.Pointer[[]algo.Ring]
	freeRings []uint32
	table     atomic.Pointer[table]
	n         int // live entries
	// auxes are the entryAux entries name by index (entry.aux). Grown by
	// copy under mu, so a decision reads it without mu; an index is
	// reused (free) only once no entry names it.
	auxes atomic.Pointer[[]*entryAux]
	free  []uint32
	// shared are the auxes one-limit entries share, the last few made
	// (sharedAux), with what tells them apart, so an insert finds its
	// own without reading them; index 0 is none.
	shared [sharedAuxes]sharedRef
}

// sharedRef names a shared aux and its policy's limit layout and idle
// time.
type sharedRef struct {
	index  uint32
	idle   int64
	layout *string // the first of the policy's LimitIDs: the same slice is the same policy's
}

// sharedAuxes is how many shared entryAux a shard keeps: one per policy
// in use, for a few policies; with more, entries of a policy whose own
// was pushed out get a new one.
const sharedAuxes = 4

// table is an open-addressed hash table of entries, held in its slots,
// with linear probing, kept at most three quarters full. A slot goes from
// empty to an entry and from an entry to a tombstone, never back, so a
// reader probing without the shard's lock sees a consistent chain; a
// rebuild moves the live entries to a new table and leaves the old ones
// dead. Entries hold no pointers, so the collector does not look into a
// table of a million keys.
type table struct {
	mask  uint64
	used  int // slots not empty (entries and tombstones)
	slots []entry
}

// Slot hashes that are no identity: an identity's first half below 2 is
// moved up by 2 (identity).
const (
	empty     = 0
	tombstone = 1
)

// entry is one (policy, key)'s state, in its table's slot: one cache
// line, 64 bytes, so a decision on a one-limit policy misses the cache
// once (a sliding log's, once more for its ring), and 100k keys' entries
// lie on 100k lines. What inserts and sweeps read besides (idle time,
// limit layout, the states of a policy of stacked limits) is apart, in
// the shard's auxes.
type entry struct {
	hash     atomic.Uint64 // the identity's first half, stored last when inserted; or empty or tombstone
	mu       sync.Mutex
	id2      uint64 // the identity's second half; set before hash
	lastUsed int64  // µs; dead once it is dropped or moved; guarded by mu
	// a, b, c are an inline entry's state, an algo.State's A, B and C; a
	// ringed entry's c is the index of its ring in the shard's rings
	// instead (a sliding log's C is always 0).
	a, b, c int64
	aux     uint32 // the index of its entryAux in the shard's auxes
	inline  bool   // its one state is a, b, c; else its aux's states
	ringed  bool   // inline, and its state's Log is the shard's rings[c]
}

// entryAux is what an entry's inserts and sweeps read, not its decisions
// on an inline state. The inline entries of a one-limit policy that carry
// nothing (no states parked) share one. An entry's aux is set only before
// the entry is published (insert, takeOver).
type entryAux struct {
	idle   int64        // µs after lastUsed when the states equal fresh ones
	layout []string     // the policy's LimitIDs: which limit each state is
	states []algo.State // nil for an inline entry
	parked *[]parked    // states of limits the key had under a same-named policy, not under this one
	users  int          // entries that name it; guarded by the shard's mu
	cached bool         // among the shard's shared auxes
}

// parked is the state of a limit (by LimitID) that a key's entry carries
// for another policy of its name: one whose limits a reload changed, or
// another policy of the name deciding the same key. The entry that next
// takes the key over for that policy takes the state back.
type parked struct {
	id    string
	state algo.State
}

// dead marks an entry dropped from its table, or moved to a new one, in
// lastUsed: a decision that finds it looks the key up again.
const dead = -1

// inlines reports whether a policy of limits keeps its one state in its
// entries, and whether that state has a ring of times, kept in the
// shard's rings.
func inlines(limits []algo.Limit) (inline, ringed bool) {
	if len(limits) != 1 {
		return false, false
	}
	return true, limits[0].Algorithm == algo.SlidingLog || limits[0].Algorithm == algo.InFlight
}

// awaitChange returns once the shard's change in progress is done: the
// eviction or rebuild that left an entry dead, which a decision met.
func (sh *shard) awaitChange() {
	sh.mu.Lock()
	//lint:ignore SA2001 the empty section waits for the lock's holder
	sh.mu.Unlock()
}

// auxAt returns the aux of index i. A decision calls it under an entry's
// lock for the entry's own aux, which does not change while it lives.
func (sh *shard) auxAt(i uint32) *entryAux { return (*sh.auxes.Load())[i] }

// addAux gives a an index, one that is free or a new one; sh.mu is held.
func (sh *shard) addAux(a *entryAux) uint32 {
	if n := len(sh.free); n > 0 {
		i := sh.free[n-1]
		sh.free = sh.free[:n-1]
		(*sh.auxes.Load())[i] = a
		return i
	}
	var grown []*entryAux
	if cur := sh.auxes.Load(); cur != nil {
		grown = append(*cur, a) // past the old length: no reader of it looks there
	} else {
		grown = []*entryAux{nil, a} // index 0 is none
	}
	sh.auxes.Store(&grown)
	return uint32(len(grown) - 1)
}

// release is called when an entry naming aux i is dropped. sh.mu is held.
func (sh *shard) release(i uint32) {
	sh.auxAt(i).users--
	sh.freeUnused(i)
}

// freeUnused frees aux i's index if no entry names it and it is not
// shared. sh.mu is held.
func (sh *shard) freeUnused(i uint32) {
	if a := sh.auxAt(i); a.users == 0 && !a.cached {
		(*sh.auxes.Load())[i] = nil
		sh.free = append(sh.free, i)
	}
}

// sharedAux returns the index of an aux the inline entries of layout and
// idle share: one the shard made for them, or a new one in place of its
// oldest. sh.mu is held.
func (sh *shard) sharedAux(layout []string, idle int64) uint32 {
	first := unsafe.SliceData(layout)
	for _, r := range sh.shared {
		if r.index != 0 && r.layout == first && r.idle == idle {
			return r.index
		}
	}
	i := sh.addAux(&entryAux{idle: idle, layout: layout, cached: true})
	if out := sh.shared[sharedAuxes-1].index; out != 0 {
		sh.auxAt(out).cached = false
		sh.freeUnused(out)
	}
	copy(sh.shared[1:], sh.shared[:sharedAuxes-1])
	sh.shared[0] = sharedRef{index: i, idle: idle, layout: first}
	return i
}

// own gives e, not yet published, an aux of its own to write, copying a
// shared one. sh.mu is held.
func (sh *shard) own(e *entry) *entryAux {
	a := sh.auxAt(e.aux)
	if !a.cached && a.users == 1 {
		return a
	}
	mine := &entryAux{idle: a.idle, layout: a.layout, states: a.states, parked: a.parked, users: 1}
	sh.release(e.aux)
	e.aux = sh.addAux(mine)
	return mine
}

// held returns e's states to read and write under e.mu: an inline
// entry's one state copied into buf (keep writes it back), or its aux's.
func (sh *shard) held(e *entry, buf *[1]algo.State) []algo.State {
	if e.inline {
		buf[0] = algo.State{A: e.a, B: e.b, C: e.c}
		if e.ringed {
			buf[0].C, buf[0].Log = 0, sh.ringAt(e.c)
		}
		return buf[:]
	}
	return sh.auxAt(e.aux).states
}

// keep writes back an inline entry's state that held copied into buf.
func (sh *shard) keep(e *entry, buf *[1]algo.State) {
	if !e.inline {
		return
	}
	e.a, e.b = buf[0].A, buf[0].B
	if !e.ringed {
		e.c = buf[0].C
		return
	}
	sh.keepRing(e.c, buf[0].Log)
}

// ringAt returns the ring of index i, or nil if it has none. A decision
// calls it under the lock of the entry that owns i; the ring it returns
// is the shard's, valid only under that lock.
func (sh *shard) ringAt(i int64) *algo.Ring {
	r := &(*sh.rings.Load())[i]
	if r.Times == nil {
		return nil
	}
	return r
}

// keepRing makes ring the ring of index i if it is another than the one
// there (Step grew it, a lease's end laid it out anew, a reset dropped
// it), under the lock of the entry that owns i.
func (sh *shard) keepRing(i int64, ring *algo.Ring) {
	if ring == sh.ringAt(i) {
		return
	}
	sh.ringMu.Lock()
	r := &(*sh.rings.Load())[i]
	if r.Times = nil; ring != nil {
		r.Times = ring.Times
	}
	sh.ringMu.Unlock()
}

// addRing returns a ring index for a new entry, free or new, holding no
// ring. sh.mu is held.
func (sh *shard) addRing() int64 {
	sh.ringMu.Lock()
	defer sh.ringMu.Unlock()
	if n := len(sh.freeRings); n > 0 {
		i := sh.freeRings[n-1]
		sh.freeRings = sh.freeRings[:n-1]
		return int64(i)
	}
	var grown []algo.Ring
	if cur := sh.rings.Load(); cur != nil {
		grown = append(*cur, algo.Ring{}) // past the old length: no reader of it looks there
	} else {
		grown = []algo.Ring{{}}
	}
	sh.rings.Store(&grown)
	return int64(len(grown) - 1)
}

// releaseRing frees ring index i, of an entry being dropped: its ring goes
// to the collector, unless a state taken over or parked holds it (in a
// copy: see takeOver). sh.mu and the entry's lock are held.
func (sh *shard) releaseRing(i int64) {
	sh.ringMu.Lock()
	(*sh.rings.Load())[i] = algo.Ring{}
	sh.freeRings = append(sh.freeRings, uint32(i))
	sh.ringMu.Unlock()
}

func newTable(size int) *table {
	return &table{mask: uint64(size - 1), slots: make([]entry, size)}
}

// reserve returns the first empty slot of id1's probe chain, counted as
// used but not yet published (its hash is still empty). sh.mu is held.
func (t *table) reserve(id1 uint64) *entry {
	i := id1 & t.mask
	for t.slots[i].hash.Load() != empty {
		i = (i + 1) & t.mask
	}
	t.used++
	return &t.slots[i]
}

// sibling returns a live entry of id1's probe chain with another id2: the
// key's state under another policy of the same name; nil if none. Without
// sh.mu held, it is a hint that insert confirms.
func (t *table) sibling(id1, id2 uint64) *entry {
	for i := id1 & t.mask; ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		h := e.hash.Load()
		if h == empty {
			return nil
		}
		if h == id1 && e.id2 != id2 {
			return e
		}
	}
}

// find returns the entry with identity (id1, id2), or nil.
func (t *table) find(id1, id2 uint64) *entry {
	for i := id1 & t.mask; ; i = (i + 1) & t.mask {
		e := &t.slots[i]
		h := e.hash.Load()
		if h == empty {
			return nil
		}
		if h == id1 && e.id2 == id2 {
			return e
		}
	}
}

// CheckMaxKeys reports whether n is a usable cap on tracked keys: 0 (a
// store's default) up to MaxMaxKeys, in the one wording every config
// reports.
func CheckMaxKeys(n int) error {
	if n < 0 || n > MaxMaxKeys {
		return fmt.Errorf("max_keys: %d must be between 0 (the default) and %d", n, MaxMaxKeys)
	}
	return nil
}

// New returns a Store.
func New(opts Options) (*Store, error) {
	if err := CheckMaxKeys(opts.MaxKeys); err != nil {
		return nil, err
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.Clock == nil {
		opts.Clock = core.NewMonotonicClock()
	}
	_, monotonic := opts.Clock.(core.MonotonicClock)
	s := &Store{clock: opts.Clock, monotonic: monotonic, seed: randomSeed(), seed2: randomSeed()}
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

// Decide applies p to key at the store's clock. It never fails. A key's
// clock never runs backwards: a request that read the clock just before a
// later one that took the key's lock first is decided at the later time.
func (s *Store) Decide(_ context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	// s.now and s.identity, written out, and no helper around the rest:
	// this is the hot path, where each call costs 10 to 20 instructions of
	// about 420 (a helper taken in costs as much, copying the key to take
	// its address).
	var now int64
	if s.monotonic {
		now = core.MonotonicMicros()
	} else {
		now = s.clock.NowMicros()
	}
	ps := p.StoreSide()
	id1 := uint64(strhash(unsafe.Pointer(&key), s.seed)) ^ ps.NameHash()
	if id1 <= tombstone {
		id1 += 2
	}
	id2 := uint64(strhash(unsafe.Pointer(&key), s.seed2)) ^ ps.ScopeHash()
	sh := &s.shards[(id1>>32)%shardCount]
	for {
		e := sh.table.Load().find(id1, id2)
		if e == nil {
			e = s.insert(sh, id1, id2, p, now)
		}
		e.mu.Lock()
		if e.lastUsed == dead {
			// Dropped or moved between the lookup and the lock: look
			// again once the shard's change is done.
			e.mu.Unlock()
			sh.awaitChange()
			continue
		}
		now = max(now, e.lastUsed)
		switch {
		case e.ringed:
			st := [1]algo.State{{A: e.a, B: e.b, Log: sh.ringAt(e.c)}}
			ps.Apply(st[:], now, cost, d)
			e.a, e.b = st[0].A, st[0].B
			sh.keepRing(e.c, st[0].Log)
		case e.inline:
			st := [1]algo.State{{A: e.a, B: e.b, C: e.c}}
			ps.Apply(st[:], now, cost, d)
			e.a, e.b, e.c = st[0].A, st[0].B, st[0].C
		default:
			ps.Apply(sh.auxAt(e.aux).states, now, cost, d)
		}
		e.lastUsed = now
		e.mu.Unlock()
		return nil
	}
}

// now reads the store's clock.
func (s *Store) now() int64 {
	if s.monotonic {
		return core.MonotonicMicros()
	}
	return s.clock.NowMicros()
}

// identity returns the 128-bit identity of key under p: two independent
// hashes of the key (the runtime's string hash, AES-based where the CPU has
// it, as Go's maps use against chosen keys), one with the policy's name and
// the other with its limits folded in. The first half is never a slot's
// empty or tombstone mark.
func (s *Store) identity(p *core.Policy, key string) (id1, id2 uint64) {
	ps := p.StoreSide()
	id1 = uint64(strhash(unsafe.Pointer(&key), s.seed)) ^ ps.NameHash()
	if id1 <= tombstone {
		id1 += 2
	}
	return id1, uint64(strhash(unsafe.Pointer(&key), s.seed2)) ^ ps.ScopeHash()
}

// strhash is the runtime's hash of the string *p with seed h: what
// hash/maphash.String computes, without its two wrapping calls. The runtime
// keeps it for packages that link to it (go.dev/issue/67401).
//
//go:linkname strhash runtime.strhash
//go:noescape
func strhash(p unsafe.Pointer, h uintptr) uintptr

// randomSeed returns a random hash seed: the runtime seeds math/rand/v2's
// generator unpredictably, so keys cannot be chosen to collide.
func randomSeed() uintptr { return uintptr(rand.Uint64()) }

// Inspect fills d with what a request of cost 0 for key would see under p
// now, changing nothing (core.Operator): the key's states are copied, and
// a key the store does not hold is a fresh one.
func (s *Store) Inspect(_ context.Context, p *core.Policy, key string, d *core.Decision) error {
	states := make([]algo.State, len(p.Limits()))
	now := s.now()
	s.withEntry(p, key, func(held []algo.State, last int64) int64 {
		copy(states, held) // Step with cost 0 writes no ring slot it returns
		for i := range states {
			if states[i].Log != nil {
				// A ringed entry's is its slot in the shard's rings,
				// which its next decision may change.
				states[i].Log = &algo.Ring{Times: states[i].Log.Times}
			}
		}
		now = max(now, last)
		return last
	})
	p.StoreSide().Apply(states, now, 0, d)
	return nil
}

// Reset forgets key's state under p in one limit or all, under the key's
// lock: atomic with concurrent decisions (core.Operator).
func (s *Store) Reset(_ context.Context, p *core.Policy, key string, limit int) error {
	s.withEntry(p, key, func(held []algo.State, last int64) int64 {
		if limit == core.AllLimits {
			clear(held)
		} else {
			held[limit] = algo.State{}
		}
		return last
	})
	return nil
}

// withEntry runs f on key's states under p and its last use, under the
// key's lock, if the store holds the key; f returns the key's new last use.
func (s *Store) withEntry(p *core.Policy, key string, f func(states []algo.State, lastUsed int64) int64) {
	id1, id2 := s.identity(p, key)
	sh := &s.shards[(id1>>32)%shardCount]
	for {
		t := sh.table.Load()
		e := t.find(id1, id2)
		if e == nil {
			if t.sibling(id1, id2) == nil {
				return
			}
			// The key's state is under another policy of the name: take it over
			// as a decision would, so the limits p shares with it are read.
			e = s.insert(sh, id1, id2, p, s.now())
		}
		e.mu.Lock()
		if e.lastUsed == dead {
			e.mu.Unlock()
			sh.awaitChange()
			continue
		}
		var buf [1]algo.State
		e.lastUsed = f(sh.held(e, &buf), e.lastUsed)
		sh.keep(e, &buf)
		e.mu.Unlock()
		return
	}
}

// CancelShaped gives back the places a shaped request took, under the
// key's lock (core.ShapeStore). It never fails.
func (s *Store) CancelShaped(_ context.Context, sh *core.Shaped) error {
	now := s.now()
	s.withEntry(sh.Policy, sh.Key, func(held []algo.State, last int64) int64 {
		sh.Policy.StoreSide().ApplyCancel(held, max(now, last), sh)
		return last
	})
	return nil
}

// EndLease ends or renews a lease this store's decision took (see
// core.LeaseStore). It never fails.
func (s *Store) EndLease(_ context.Context, l *core.Lease, renew bool) (found, now int64, err error) {
	found, now = s.EndLeaseAt(l, renew, s.now())
	return found, now, nil
}

// EndLeaseAt is EndLease as if at now (µs); it returns the slots found and
// the time it ended or renewed them at (a key's clock never runs back).
func (s *Store) EndLeaseAt(l *core.Lease, renew bool, now int64) (int64, int64) {
	var found int64 // 0 when the store forgot the key: nothing live
	s.withEntry(l.Policy, l.Key, func(states []algo.State, last int64) int64 {
		now = max(now, last)
		found = l.Policy.StoreSide().ApplyLease(states, now, l.Token, l.Cost, renew)
		return now
	})
	return found, now
}

// insert returns the entry for the identity, adding one if no other insert
// did meanwhile, after making room. A new entry takes over the state of
// each of its limits from the key's entry under another policy of the same
// name (see the package doc), and that entry is dropped.
func (s *Store) insert(sh *shard, id1, id2 uint64, p *core.Policy, now int64) *entry {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.table.Load()
	if e := t.find(id1, id2); e != nil {
		return e
	}
	if 4*(t.used+1) > 3*len(t.slots) {
		t = s.rebuild(sh, t)
	}
	ps := p.StoreSide()
	layout, idle := ps.LimitIDs(), ps.IdleMicros()
	e := t.reserve(id1)
	e.id2, e.lastUsed, e.a, e.b, e.c = id2, now, 0, 0, 0
	if e.inline, e.ringed = inlines(p.Limits()); e.inline {
		e.aux = sh.sharedAux(layout, idle)
		sh.auxAt(e.aux).users++
		if e.ringed {
			e.c = sh.addRing()
		}
	} else {
		e.aux = sh.addAux(&entryAux{idle: idle, layout: layout, users: 1, states: make([]algo.State, len(layout))})
	}
	if old := t.sibling(id1, id2); old != nil {
		s.takeOver(sh, e, old)
	}
	s.sweep(sh, t, now)
	e.hash.Store(id1) // published
	sh.n++
	return e
}

// takeOver moves into e, not yet published, the state of each limit of
// e's that old holds too (by LimitID) and drops old, under old's lock, so
// no decision on old is lost: one that still comes for old's policy (a
// request of the config a reload replaces) looks its key up again and
// takes the state back. sh.mu is held.
func (s *Store) takeOver(sh *shard, e, old *entry) {
	old.mu.Lock()
	defer old.mu.Unlock()
	if old.lastUsed == dead {
		return
	}
	// Every state old holds, its own and those it carries, goes to e's
	// limit of the same identity, or is carried on; the rings too, since
	// old is dropped below.
	var mine [1]algo.State
	states := sh.held(e, &mine)
	layout := sh.auxAt(e.aux).layout
	var carried []parked
	place := func(id string, st algo.State) {
		if i := slices.Index(layout, id); i >= 0 {
			states[i] = st
		} else if len(carried) < maxParked {
			carried = append(carried, parked{id, st})
		}
	}
	var theirs [1]algo.State
	oldAux := sh.auxAt(old.aux)
	held := sh.held(old, &theirs)
	if old.ringed && held[0].Log != nil {
		// Its ring is old's slot in the shard's rings, freed below.
		held[0].Log = &algo.Ring{Times: held[0].Log.Times}
	}
	for j, st := range held {
		place(oldAux.layout[j], st)
	}
	if oldAux.parked != nil {
		for _, p := range *oldAux.parked {
			place(p.id, p.state)
		}
	}
	sh.keep(e, &mine)
	if len(carried) > 0 {
		sh.own(e).parked = &carried
	}
	if oldAux.idle > sh.auxAt(e.aux).idle {
		sh.own(e).idle = oldAux.idle // a carried state lives as long as it did
	}
	e.lastUsed = max(e.lastUsed, old.lastUsed) // a key's clock never runs back
	s.drop(sh, old)
}

// rebuild moves the live entries of t into a new table, at most half full
// (smaller than t when many have gone), leaving the tombstones behind,
// and publishes it. Each moved entry is left dead in t, under its lock,
// so a decision that finds it there looks again. sh.mu is held.
func (s *Store) rebuild(sh *shard, t *table) *table {
	size := 8
	for 2*(sh.n+1) > size {
		size *= 2
	}
	nt := newTable(size)
	for i := range t.slots {
		e := &t.slots[i]
		if e.hash.Load() <= tombstone {
			continue
		}
		e.mu.Lock()
		if e.lastUsed != dead {
			moved := nt.reserve(e.hash.Load())
			moved.id2, moved.lastUsed, moved.a, moved.b, moved.c, moved.aux, moved.inline, moved.ringed = e.id2, e.lastUsed, e.a, e.b, e.c, e.aux, e.inline, e.ringed
			moved.hash.Store(e.hash.Load())
			e.lastUsed = dead
		}
		e.mu.Unlock()
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
	var oldestUsed int64
	start := (uint64(now) * 0x9E3779B97F4A7C15) >> 17
	seen := 0
	for k := uint64(0); k < uint64(len(t.slots)) && seen < sampleSize; k++ {
		e := &t.slots[(start+k)&t.mask]
		if e.hash.Load() <= tombstone || !e.mu.TryLock() {
			continue
		}
		seen++
		if e.lastUsed+sh.auxAt(e.aux).idle <= now {
			s.drop(sh, e)
		} else if oldest == nil || e.lastUsed < oldestUsed {
			oldest, oldestUsed = e, e.lastUsed
		}
		e.mu.Unlock()
	}
	if sh.n >= s.perShard && oldest != nil && oldest.mu.TryLock() {
		s.drop(sh, oldest)
		oldest.mu.Unlock()
	}
}

// drop removes e from its table, leaving a tombstone. sh.mu and e.mu are
// held.
func (s *Store) drop(sh *shard, e *entry) {
	e.lastUsed = dead
	e.hash.Store(tombstone)
	sh.release(e.aux)
	if e.ringed {
		sh.releaseRing(e.c)
	}
	sh.n--
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

// MaxKeys returns the effective cap on tracked keys.
func (s *Store) MaxKeys() int { return s.perShard * shardCount }

var _ core.Store = (*Store)(nil)
