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
	mu    sync.Mutex // held to change table or n
	table atomic.Pointer[table]
	n     int // live entries
	// shared are the entryAux its one-limit entries share, the last few
	// made (sharedAux); guarded by mu.
	shared *[sharedAuxes]*entryAux
	_      [32]byte // keep neighbouring shards' locks off one cache line
}

// sharedAuxes is how many shared entryAux a shard keeps: one per policy
// in use, for a few policies; with more, entries of a policy whose own
// was pushed out get a new one.
const sharedAuxes = 4

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

// entry is one (policy, key)'s state: one cache line, 64 bytes, a size
// class whose objects start on a line, so a decision on a one-limit policy
// touches one line of it, and 100k keys' entries lie on 100k lines. The
// identity's first half is its slot's hash; what inserts and sweeps read
// is apart, in aux.
type entry struct {
	mu       sync.Mutex
	id2      uint64 // the identity's second half; never changes once published
	lastUsed int64  // µs; dropped once it is dead; guarded by mu
	inline   [1]algo.State
	aux      *entryAux
}

// entryAux is what an entry's inserts and sweeps read, not its decisions:
// 64 bytes, as the entry. The entries of a one-limit policy that carry
// nothing (no states of their own, none parked) share one, so a table of
// them holds one heap object per key, not two, for the collector to
// scan. An entry's aux is written only before the entry is published
// (takeOver, through own).
type entryAux struct {
	idle   int64        // µs after lastUsed when the states equal fresh ones
	layout []string     // the policy's LimitIDs: which limit each state is
	states []algo.State // nil for one limit: the entry's inline state
	parked *[]parked    // states of limits the key had under a same-named policy, not under this one
}

// own returns e's aux to write, first copying one that may be shared
// (neither states nor parked states of its own; a private one of that
// kind is copied again, needlessly but harmlessly).
func (e *entry) own() *entryAux {
	if e.aux.states == nil && e.aux.parked == nil {
		a := *e.aux
		e.aux = &a
	}
	return e.aux
}

// held returns e's states.
func (e *entry) held() []algo.State {
	if e.aux.states != nil {
		return e.aux.states
	}
	return e.inline[:]
}

// parked is the state of a limit (by LimitID) that a key's entry carries
// for another policy of its name: one whose limits a reload changed, or
// another policy of the name deciding the same key. The entry that next
// takes the key over for that policy takes the state back.
type parked struct {
	id    string
	state algo.State
}

// dead marks an entry dropped from its table in lastUsed: a decision that
// finds it looks the key up again.
const dead = -1

// newEntry makes an entry of a policy of limits layout; sh.mu is held.
func (sh *shard) newEntry(id2 uint64, layout []string, idle, now int64) *entry {
	if len(layout) > 1 {
		return &entry{id2: id2, lastUsed: now, aux: &entryAux{idle: idle, layout: layout, states: make([]algo.State, len(layout))}}
	}
	return &entry{id2: id2, lastUsed: now, aux: sh.sharedAux(layout, idle)}
}

// sharedAux returns an aux one-limit entries of layout and idle share:
// one the shard made for them, or a new one in place of its oldest.
// sh.mu is held.
func (sh *shard) sharedAux(layout []string, idle int64) *entryAux {
	if sh.shared == nil {
		sh.shared = new([sharedAuxes]*entryAux)
	}
	for _, a := range sh.shared {
		// The same LimitIDs slice: the same policy's.
		if a != nil && a.idle == idle && len(a.layout) == len(layout) && unsafe.SliceData(a.layout) == unsafe.SliceData(layout) {
			return a
		}
	}
	a := &entryAux{idle: idle, layout: layout}
	copy(sh.shared[1:], sh.shared[:sharedAuxes-1])
	sh.shared[0] = a
	return a
}

func newTable(size int) *table {
	return &table{mask: uint64(size - 1), slots: make([]slot, size)}
}

// put stores e, whose identity starts with id1, in the first free slot of
// its probe chain. sh.mu is held.
func (t *table) put(e *entry, id1 uint64) {
	i := id1 & t.mask
	for t.slots[i].entry.Load() != nil {
		i = (i + 1) & t.mask
	}
	t.slots[i].entry.Store(e)
	t.slots[i].hash.Store(id1)
	t.used++
}

// sibling returns a live entry of id1's probe chain with another id2: the
// key's state under another policy of the same name; nil if none. Without
// sh.mu held, it is a hint that insert confirms.
func (t *table) sibling(id1, id2 uint64) *entry {
	for i := id1 & t.mask; ; i = (i + 1) & t.mask {
		e := t.slots[i].entry.Load()
		if e == nil {
			return nil
		}
		if e != tombstone && t.slots[i].hash.Load() == id1 && e.id2 != id2 {
			return e
		}
	}
}

// find returns the entry with identity (id1, id2), or nil.
func (t *table) find(id1, id2 uint64) *entry {
	for i := id1 & t.mask; ; i = (i + 1) & t.mask {
		e := t.slots[i].entry.Load()
		if e == nil {
			return nil
		}
		if t.slots[i].hash.Load() == id1 && e != tombstone && e.id2 == id2 {
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
	id2 := uint64(strhash(unsafe.Pointer(&key), s.seed2)) ^ ps.ScopeHash()
	sh := &s.shards[(id1>>32)%shardCount]
	for {
		e := sh.table.Load().find(id1, id2)
		if e == nil {
			e = s.insert(sh, id1, id2, ps.LimitIDs(), ps.IdleMicros(), now)
		}
		e.mu.Lock()
		if e.lastUsed == dead {
			// Evicted between the lookup and the lock: look again.
			e.mu.Unlock()
			continue
		}
		now = max(now, e.lastUsed)
		if p.NumLimits() == 1 {
			ps.Apply(e.inline[:], now, cost, d) // e.held(), without reading aux
		} else {
			ps.Apply(e.aux.states, now, cost, d)
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
// the other with its limits folded in.
func (s *Store) identity(p *core.Policy, key string) (id1, id2 uint64) {
	ps := p.StoreSide()
	return uint64(strhash(unsafe.Pointer(&key), s.seed)) ^ ps.NameHash(),
		uint64(strhash(unsafe.Pointer(&key), s.seed2)) ^ ps.ScopeHash()
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
	t := sh.table.Load()
	e := t.find(id1, id2)
	if e == nil {
		if t.sibling(id1, id2) == nil {
			return
		}
		// The key's state is under another policy of the name: take it over
		// as a decision would, so the limits p shares with it are read.
		ps := p.StoreSide()
		e = s.insert(sh, id1, id2, ps.LimitIDs(), ps.IdleMicros(), s.now())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lastUsed == dead {
		return
	}
	e.lastUsed = f(e.held(), e.lastUsed)
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
func (s *Store) insert(sh *shard, id1, id2 uint64, layout []string, idle, now int64) *entry {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.table.Load()
	if e := t.find(id1, id2); e != nil {
		return e
	}
	e := sh.newEntry(id2, layout, idle, now)
	if old := t.sibling(id1, id2); old != nil {
		s.takeOver(sh, t, e, old, id1)
	}
	s.sweep(sh, t, now)
	if 4*(t.used+1) > 3*len(t.slots) {
		t = s.rebuild(sh, t)
	}
	t.put(e, id1)
	sh.n++
	return e
}

// takeOver moves into e the state of each limit of e's that old holds too
// (by LimitID) and drops old, under old's lock, so no decision on old is
// lost: one that still comes for old's policy (a request of the config a
// reload replaces) looks its key up again and takes the state back. sh.mu
// is held; id1 is the identity's first half both share.
func (s *Store) takeOver(sh *shard, t *table, e, old *entry, id1 uint64) {
	old.mu.Lock()
	defer old.mu.Unlock()
	if old.lastUsed == dead {
		return
	}
	// Every state old holds, its own and those it carries, goes to e's
	// limit of the same identity, or is carried on; the rings too, since
	// old is dropped below.
	var carried []parked
	place := func(id string, st algo.State) {
		if i := slices.Index(e.aux.layout, id); i >= 0 {
			e.held()[i] = st
		} else if len(carried) < maxParked {
			carried = append(carried, parked{id, st})
		}
	}
	oldStates := old.held()
	for j, id := range old.aux.layout {
		place(id, oldStates[j])
	}
	if old.aux.parked != nil {
		for _, p := range *old.aux.parked {
			place(p.id, p.state)
		}
	}
	if len(carried) > 0 {
		e.own().parked = &carried // before idle: then e's aux is its own
	}
	if old.aux.idle > e.aux.idle {
		e.own().idle = old.aux.idle // a carried state lives as long as it did
	}
	e.lastUsed = max(e.lastUsed, old.lastUsed) // a key's clock never runs back
	for i := id1 & t.mask; ; i = (i + 1) & t.mask {
		if t.slots[i].entry.Load() == old {
			s.drop(sh, t, i, old)
			return
		}
	}
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
			nt.put(e, t.slots[i].hash.Load())
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
		if e.lastUsed+e.aux.idle <= now {
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
	e.lastUsed = dead
	t.slots[i].entry.Store(tombstone)
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
