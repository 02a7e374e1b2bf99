// Package stores opens the store a gateway config describes (memory, or Redis
// exact or eventual behind the failure policy) and shares it across the
// config's reloads: equal configs get the same store, so counters survive a
// reload and one Redis client serves every handler that names it.
package stores

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/core/store/redis"
	"github.com/tollgate/tollgate/internal/refcount"
)

// Config describes a store.
type Config struct {
	// Redis, if set, makes the store Redis; nil means the memory store.
	Redis *redis.Options
	// MaxKeys caps the keys the memory store tracks (also the local
	// fallback's and eventual mode's); 0 means the memory store's default.
	MaxKeys int
	// OnError is the Redis failure policy.
	OnError core.OnError
	// Eventual decides locally and syncs counts with Redis every
	// SyncInterval instead of asking Redis on every request.
	Eventual bool
	// SyncInterval is eventual mode's sync period; 0 means 1s.
	SyncInterval time.Duration
}

// identity is what makes two configs the same store: every field but the
// Redis clock, which only tests set.
func (c *Config) identity() string {
	shown := *c
	if c.Redis != nil {
		r := *c.Redis
		r.Clock = nil
		shown.Redis = &r
	}
	b, _ := json.Marshal(shown)
	return string(b)
}

// Handle is a shared open store. Release it when the config that acquired it
// is unloaded; the store closes when its last handle is released.
type Handle struct {
	// Store decides requests.
	Store core.Store
	// Failover is the failure-policy wrapper of a Redis store in exact mode,
	// nil otherwise (for breaker state and error counts).
	Failover *core.FailoverStore
	// Eventual is the eventual-mode store, nil otherwise.
	Eventual *redis.EventualStore
	// Redis is the Redis store underneath, nil for the memory store.
	Redis *redis.Store

	key     string
	closers []func() error

	mu        sync.Mutex
	listeners map[int]func(open bool, err error)
	nextID    int
}

// handles are the open stores, by config identity.
var handles refcount.Pool[*Handle]

// Acquire returns the shared store for c, opening it if no live handle has
// the same config. Errors name the field and value at fault.
func Acquire(c Config) (*Handle, error) {
	key := c.identity()
	return handles.Acquire(key, func() (*Handle, error) {
		h, err := open(c)
		if err == nil {
			h.key = key
		}
		return h, err
	})
}

func open(c Config) (*Handle, error) {
	if c.MaxKeys < 0 {
		return nil, fmt.Errorf("max_keys: %d must not be negative", c.MaxKeys)
	}
	local, err := memory.New(memory.Options{MaxKeys: c.MaxKeys})
	if err != nil {
		return nil, err
	}
	h := &Handle{listeners: map[int]func(bool, error){}}
	if c.Redis == nil {
		if c.Eventual {
			return nil, errors.New("mode: eventual needs the redis store")
		}
		h.Store = local
		return h, nil
	}
	shared, err := redis.New(*c.Redis)
	if err != nil {
		return nil, err
	}
	h.closers = append(h.closers, shared.Close)
	h.Redis = shared
	if c.Eventual {
		ev, err := redis.NewEventual(shared, redis.EventualOptions{
			SyncInterval: c.SyncInterval, MaxKeys: c.MaxKeys,
			OnStateChange: h.notify,
		})
		if err != nil {
			_ = shared.Close()
			return nil, err
		}
		h.Store, h.Eventual = ev, ev
		h.closers = append([]func() error{ev.Close}, h.closers...)
		return h, nil
	}
	fo, err := core.NewFailoverStore(shared, core.FailoverOptions{
		OnError: c.OnError, Local: local, OnStateChange: h.notify,
	})
	if err != nil {
		_ = shared.Close()
		return nil, err
	}
	h.Store, h.Failover = fo, fo
	h.closers = append([]func() error{fo.Close}, h.closers...)
	return h, nil
}

// CheckPolicy reports whether the store can decide p (eventual mode counts
// requests, so it takes only the counter algorithms).
func (h *Handle) CheckPolicy(p *core.Policy) error {
	if h.Eventual != nil {
		return redis.CheckPolicy(p)
	}
	return nil
}

// FactorSync returns how an adaptive policy's factor is shared: through
// Redis for a Redis store (the fleet tightens together), nil in memory (each
// node on its own).
func (h *Handle) FactorSync(scope string) core.FactorSync {
	if h.Redis == nil {
		return nil
	}
	return h.Redis.FactorSync(scope)
}

// OnStateChange registers f to hear when the Redis breaker opens (with the
// error) or closes (nil), and in eventual mode of failed syncs (open true);
// each change is reported once. The returned func unregisters f.
func (h *Handle) OnStateChange(f func(open bool, err error)) (unregister func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := h.nextID
	h.nextID++
	h.listeners[id] = f
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.listeners, id)
	}
}

func (h *Handle) notify(open bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range h.listeners {
		f(open, err)
	}
}

// Release gives the handle back; the last release closes the store.
func (h *Handle) Release() error { return handles.Release(h.key, (*Handle).close) }

func (h *Handle) close() error {
	var errs []error
	for _, c := range h.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// Live returns how many distinct stores are open (for tests).
func Live() int { return handles.Len() }
