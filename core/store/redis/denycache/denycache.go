// Package denycache holds the states of keys a shared store just denied,
// as the store holds them, and answers the keys' next requests from them
// while the step functions deny there: a key over its limit then costs no
// round trip until its Retry-After.
package denycache

import (
	"sync"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// size caps the keys a Cache remembers.
const size = 100_000

// Hold is the longest a Cache answers for a key without asking the
// store: an operator's reset made elsewhere (another node, or the keys
// command) reaches this node within it. A denied key then costs one
// round trip a second per node.
const Hold = time.Second

// Cache holds the states of keys Redis just denied, as Redis holds them,
// and answers their next requests by running StoreSide.Apply on those states:
// while the step functions deny a request there, it is denied without a
// round trip; once they would allow it, Redis decides. A local denial is
// exact for this node: other nodes' requests only add to what Redis holds,
// and more counted never turns a denial into an allowance. The values it
// reports (remaining, reset, retry-after) are those of the states held, as
// if nothing else arrived, which is what Redis reports too. An entry lives
// until the RetryAfter of the denial that made it, at most Hold; a sliding
// log holding more than 64 live times is not sent, so it is not cached.
// Times are µs: the store's clock's for a denial, the local clock's for
// now.
type Cache struct {
	mu      sync.Mutex
	entries map[denyKey]*held
	hits    int64
	epoch   int64 // resets so far (forget)
}

// denyKey is a policy's name and a key: one entry whatever the policy's
// limits, so a decision under another policy of the name (a reload's, with
// a limit added, removed or changed) drops what the old one held.
type denyKey struct{ name, key string }

type held struct {
	scope   string // the policy whose states these are (StoreSide.Scope)
	states  []algo.State
	at      int64 // when Redis denied, on Redis's clock (µs)
	localAt int64 // the same moment on the local clock
	until   int64 // local µs after which Redis is asked again
}

// New returns an empty Cache.
func New() *Cache { return &Cache{entries: map[denyKey]*held{}} }

// Lookup runs p on the states held for key, if any, at the local time now
// translated to Redis's clock. It fills d and returns true if the limits
// deny the request there; otherwise it drops the entry and returns false.
func (c *Cache) Lookup(p *core.Policy, key string, cost, now int64, d *core.Decision) bool {
	ps := p.StoreSide()
	if ps.ChargesAfterResponse() || ps.Penalty() >= 0 {
		// A charge is taken whatever is left, and a denial counts in a
		// penalty box: Redis must see both.
		return false
	}
	k := denyKey{p.Name(), key}
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.entries[k]
	if !ok {
		return false
	}
	if now >= h.until || h.scope != ps.Scope() {
		// Another policy of the name decides in Redis, and moves the
		// limits these states share with it on.
		delete(c.entries, k)
		return false
	}
	ps.Apply(h.states, h.at+(now-h.localAt), cost, d)
	if d.Allowed && !d.Shadowed {
		// The step would allow it: Redis decides, and may have more to say.
		delete(c.entries, k)
		return false
	}
	c.hits++
	return true
}

// Remember holds the states Redis returned with a denial it decided at the
// local time now; epoch is what Epoch said before the store was asked.
func (c *Cache) Remember(p *core.Policy, key string, now, epoch int64, d *core.Decision, states []algo.State) {
	if d.Allowed && !d.Shadowed || d.RetryAfter <= 0 || p.HoldsLeases() {
		// A lease another node ends frees a slot no local copy would see.
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch != c.epoch {
		return // a reset came between the decision and its reply
	}
	if len(c.entries) >= size {
		for k, e := range c.entries {
			if now >= e.until {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= size {
			clear(c.entries)
		}
	}
	c.entries[denyKey{p.Name(), key}] = &held{scope: p.StoreSide().Scope(), states: states, at: d.At, localAt: now,
		until: now + int64(min(d.RetryAfter, Hold)/time.Microsecond)}
}

// Forget drops what the cache holds for key after an operator reset it in
// Redis, and moves the epoch on: a denial decided before the reset whose
// reply arrives after it is not remembered (Remember's epoch).
func (c *Cache) Forget(p *core.Policy, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	delete(c.entries, denyKey{p.Name(), key})
}

// Epoch is what a decision reads before it asks Redis, for Remember.
func (c *Cache) Epoch() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// Hits is how many requests Lookup denied.
func (c *Cache) Hits() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits
}
