package redis

import (
	"sync"
	"time"

	"github.com/tollgate/tollgate/core"
)

// denyCacheSize caps the keys the deny cache remembers.
const denyCacheSize = 100_000

// denyCache remembers keys Redis denied a request of cost 1 until its
// RetryAfter passes, and denies their cost-1 requests locally meanwhile,
// without a round trip. The verdict is exact: RetryAfter is the earliest time
// the request could pass with nothing else arriving, and other nodes'
// requests only push that time later; the deciding limit's Remaining stays
// 0 throughout. Only the other limits of a stack report their Remaining as it
// was at the denial (they may have refilled since).
type denyCache struct {
	mu      sync.Mutex
	entries map[denyKey]denied
	hits    int64
}

type denyKey struct{ scope, key string }

type denied struct {
	until    int64 // µs on the store's local clock
	at       int64 // when Redis denied it
	decision core.Decision
}

func newDenyCache() *denyCache { return &denyCache{entries: map[denyKey]denied{}} }

// lookup fills d and returns true if key is known to be denied at now for a
// request of cost.
func (c *denyCache) lookup(p *core.Policy, key string, cost, now int64, d *core.Decision) bool {
	c.mu.Lock()
	e, ok := c.entries[denyKey{p.Scope(), key}]
	if ok && now >= e.until {
		delete(c.entries, denyKey{p.Scope(), key})
		ok = false
	}
	if ok && cost == 1 {
		c.hits++
	}
	c.mu.Unlock()
	if !ok || cost != 1 {
		return false
	}
	*d = e.decision
	d.Policy, d.Cost = p, cost
	passed := time.Duration(now-e.at) * time.Microsecond
	d.RetryAfter -= passed
	d.Reset = max(0, d.Reset-passed)
	for i := 0; i < d.N; i++ {
		r := &d.Results[i]
		r.Reset = max(0, r.Reset-passed)
		if !r.Allowed {
			r.RetryAfter = max(0, r.RetryAfter-passed)
		}
	}
	return true
}

// remember records a denial decided by Redis at now.
func (c *denyCache) remember(p *core.Policy, key string, cost, now int64, d *core.Decision) {
	if d.Allowed || d.RetryAfter <= 0 || cost != 1 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= denyCacheSize {
		for k, e := range c.entries {
			if now >= e.until {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= denyCacheSize {
			clear(c.entries)
		}
	}
	c.entries[denyKey{p.Scope(), key}] = denied{until: now + int64(d.RetryAfter/time.Microsecond), at: now, decision: *d}
}

func (c *denyCache) hitCount() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits
}
