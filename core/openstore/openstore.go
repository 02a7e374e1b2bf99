// Package openstore opens the store a gateway config describes and shares
// it across the config's reloads: equal configs get the same store, so
// counters survive a reload and one Redis client serves every handler that
// names it. It composes the stores of core/store (each a sibling of the
// others, none importing another) and makes a policy a gate rule over
// them; adapters reach stores only through it.
package openstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/internal/refcount"
	"github.com/tollgate/tollgate/core/store/eventual"
	"github.com/tollgate/tollgate/core/store/failover"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/core/store/redis"
)

// Config is a checked store config: the store a config's policies run
// on, which Open opens.
type Config struct {
	// Redis, if set, makes the store Redis; nil means the memory store.
	Redis *redis.Options
	// MaxKeys caps the keys the memory store tracks (also the local
	// fallback's and eventual mode's); 0 means each one's default
	// (memory.DefaultMaxKeys; eventual mode's, 100,000).
	MaxKeys int
	// OnError is the Redis failure policy.
	OnError core.OnError
	// Eventual decides locally and syncs counts with Redis every
	// SyncInterval instead of asking Redis on every request.
	Eventual bool
	// SyncInterval is eventual mode's sync period; 0 means 1s.
	SyncInterval time.Duration
	// External, if set, is a shared store its adapter opens itself (a
	// gateway's own database), composed as Redis is: OnError's failure
	// policy around it, one store per ID across reloads, closed with the
	// last handle. It takes the place of Redis, and not eventual mode.
	External *External `json:",omitempty"`
	// ModeSetting names the setting that chose eventual mode in
	// CheckPolicy's errors (an adapter's own field); "" names none. It is
	// not part of what makes two configs the same store.
	ModeSetting string `json:"-"`
}

// External is a shared store an adapter opens: what Open returns decides
// requests (a failover.Pinger is probed while it fails; a core.Operator
// shows and resets keys) and close gives it back.
type External struct {
	// ID is what makes two configs the same store (the connection and
	// what the store keeps apart).
	ID string
	// Kind names the store to operators ("postgres").
	Kind string
	// Open opens the store, when no live handle has the same ID.
	Open func() (s core.Store, close func() error, err error) `json:"-"`
}

// CheckPolicy reports whether a store opened from c can decide p (eventual
// mode counts requests, so it takes only the counting algorithms).
// The config package makes this check when it compiles a config.
func (c *Config) CheckPolicy(p *core.Policy) error {
	if !c.Eventual {
		return nil
	}
	err := eventual.CheckPolicy(p)
	if err != nil && c.ModeSetting != "" {
		err = fmt.Errorf("%s: %w", c.ModeSetting, err)
	}
	return err
}

// identity is what makes two configs the same store.
func identity(c *Config) string {
	b, _ := json.Marshal(c)
	return string(b)
}

// Handle is a shared open store. Release it when the config that acquired it
// is unloaded; the store closes when its last handle is released.
type Handle struct {
	// Store decides requests.
	Store core.Store
	// Failover is the failure-policy wrapper of a Redis store in exact mode,
	// nil otherwise (for breaker state and error counts).
	Failover *failover.Store
	// Eventual is the eventual-mode store, nil otherwise.
	Eventual *eventual.Store
	// Redis is the Redis store underneath, nil for the memory store.
	Redis *redis.Store
	// Kind names an External store to operators ("" for the others).
	Kind string

	key     string
	closers []func() error

	mu        sync.Mutex
	listeners map[int]func(open bool, err error)
	nextID    int
	logging   bool // LogStateChanges registered
}

// handles are the open stores, by config identity.
var handles refcount.Pool[*Handle]

// Acquire returns the shared store for c, opening it if no live handle has
// the same config. Errors name the field and value at fault.
func Acquire(c Config) (*Handle, error) {
	key := identity(&c)
	return handles.Acquire(key, func() (*Handle, error) {
		h, err := open(c)
		if err == nil {
			h.key = key
		}
		return h, err
	})
}

// TestClockFileEnv names the environment variable that sets the time of
// every store a process opens, in binaries built with the build tag
// tollgate_testclock (the integration tests' builds of a plugin
// server): the file it names holds a Unix time in µs, read on every
// decision. A binary built without the tag (every production build) never
// reads it: its stores keep their own clocks whatever the environment says.
const TestClockFileEnv = "TOLLGATE_TEST_CLOCK_FILE"

func open(c Config) (*Handle, error) {
	clock := testClock() // nil, but in the tests' builds: the stores' own clocks
	local, err := memory.New(memory.Options{MaxKeys: c.MaxKeys, Clock: clock})
	if err != nil {
		return nil, err
	}
	h := &Handle{listeners: map[int]func(bool, error){}}
	if c.External != nil {
		return h.openExternal(c, local)
	}
	if c.Redis == nil {
		if c.Eventual {
			return nil, errors.New("mode: eventual needs the redis store")
		}
		h.Store = local
		return h, nil
	}
	opts := *c.Redis
	opts.Clock = clock
	shared, err := redis.New(opts)
	if err != nil {
		return nil, err
	}
	h.closers = append(h.closers, shared.Close)
	h.Redis = shared
	if c.Eventual {
		ev, err := eventual.New(shared, eventual.Options{
			SyncInterval: c.SyncInterval, MaxKeys: c.MaxKeys, Clock: clock,
			OnError: c.OnError, OnStateChange: h.notify,
		})
		if err != nil {
			_ = shared.Close()
			return nil, err
		}
		h.Store, h.Eventual = ev, ev
		h.closers = append([]func() error{ev.Close}, h.closers...)
		return h, nil
	}
	fo, err := failover.New(shared, failover.Options{
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

// openExternal opens c.External behind c.OnError's failure policy.
func (h *Handle) openExternal(c Config, local core.Store) (*Handle, error) {
	if c.Redis != nil || c.Eventual {
		return nil, errors.New("store: an external store takes the place of Redis, and has no eventual mode")
	}
	shared, closeShared, err := c.External.Open()
	if err != nil {
		return nil, err
	}
	fo, err := failover.New(shared, failover.Options{OnError: c.OnError, Local: local, OnStateChange: h.notify})
	if err != nil {
		_ = closeShared()
		return nil, err
	}
	h.Store, h.Failover, h.Kind = fo, fo, c.External.Kind
	h.closers = []func() error{fo.Close, closeShared}
	return h, nil
}

// Rule returns p as a gate rule over this store, an adaptive policy's
// factor shared through it (syncScope, prefixed to the policy's scope,
// names the shared factor). p must be one the store's
// Config.CheckPolicy accepted (the config package checks it): the
// request path does not check it again.
func (h *Handle) Rule(p *core.Policy, emptyKey gate.EmptyKey, syncScope string) gate.Rule {
	if a := p.Adaptive(); a != nil {
		// With Redis, every node's controller moves one shared factor.
		a.SetSync(h.FactorSync(syncScope + p.StoreSide().Scope()))
	}
	return gate.Rule{Limiter: core.NewLimiter(p, h.Store), EmptyKey: emptyKey}
}

// FactorSync returns how an adaptive policy's factor is shared: through
// Redis for a Redis store (the fleet tightens together), nil in memory (each
// node on its own).
func (h *Handle) FactorSync(scope string) adaptive.FactorSync {
	if h.Redis == nil {
		return nil
	}
	return h.Redis.FactorSync(scope)
}

// LogStateChanges logs the store's state changes with printf, once per
// handle however often it is asked (an adapter whose configs are never
// closed, such as plugin instances, asks once per config): a line when
// the shared store starts failing and one when it answers again, never one
// per request.
func (h *Handle) LogStateChanges(printf func(format string, args ...any)) {
	h.mu.Lock()
	first := !h.logging
	h.logging = true
	h.mu.Unlock()
	if first {
		h.OnStateChange(func(failing bool, err error) {
			if failing {
				printf("tollgate: rate-limit store failing (%v); its failure policy decides until it answers again", err)
			} else {
				printf("tollgate: rate-limit store answering again")
			}
		})
	}
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
