// Package failover is the failure policy around a shared store: while the
// shared store (Redis) fails, a breaker skips it and a fallback decides:
// another store running the same policy (on_error local, a memory store), or
// a verdict no limit made (allow or deny), or the error itself (fail).
package failover

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/memory"
)

// Pinger is a store that can be probed for health.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Options configures a Store.
type Options struct {
	// OnError picks the fallback; the zero value is core.OnErrorLocal.
	OnError core.OnError
	// Local is the fallback store for core.OnErrorLocal; nil means a
	// memory store of its own, with memory.DefaultMaxKeys keys at most.
	Local core.Store
	// Failures is how many consecutive failures open the breaker; 0 means 3.
	Failures int
	// ProbeEvery is how often an open breaker probes the shared store; 0
	// means 250ms.
	ProbeEvery time.Duration
	// ProbeTimeout bounds one probe; 0 means ProbeEvery.
	ProbeTimeout time.Duration
	// OnStateChange, if set, is called once per change: open with the error
	// that opened it, closed with nil.
	OnStateChange func(open bool, err error)
}

// Store decides on a shared store and, when it fails, on the
// fallback its options choose. A breaker opens after consecutive failures,
// so a dead store stops adding its timeout to every request; while open, a
// background probe pings the shared store and closes the breaker when it
// answers.
type Store struct {
	shared core.Store
	opts   Options

	open     atomic.Bool
	failing  atomic.Bool // a failure since the last success
	mu       sync.Mutex
	failures int
	stop     chan struct{}
	probing  bool
	closed   bool
	fallback atomic.Int64 // decisions taken by the fallback
	errs     atomic.Int64 // failed calls to the shared store
}

// New wraps shared. shared should implement Pinger for the
// breaker to close again; without it the breaker retries the store itself
// once per ProbeEvery.
func New(shared core.Store, opts Options) (*Store, error) {
	if opts.OnError > core.OnErrorFail {
		return nil, fmt.Errorf("on_error: unknown value %d", opts.OnError)
	}
	if opts.OnError == core.OnErrorLocal && opts.Local == nil {
		opts.Local = memory.MustNew(memory.Options{})
	}
	if opts.Failures < 0 || opts.ProbeEvery < 0 || opts.ProbeTimeout < 0 {
		return nil, fmt.Errorf("breaker: failures %d, probe interval %s and probe timeout %s must not be negative", opts.Failures, opts.ProbeEvery, opts.ProbeTimeout)
	}
	if opts.Failures == 0 {
		opts.Failures = 3
	}
	if opts.ProbeEvery == 0 {
		opts.ProbeEvery = 250 * time.Millisecond
	}
	if opts.ProbeTimeout == 0 {
		opts.ProbeTimeout = opts.ProbeEvery
	}
	return &Store{shared: shared, opts: opts, stop: make(chan struct{})}, nil
}

// Open reports whether the breaker is open (the shared store is skipped).
func (f *Store) Open() bool { return f.open.Load() }

// FallbackDecisions returns how many decisions the fallback took so far.
func (f *Store) FallbackDecisions() int64 { return f.fallback.Load() }

// SharedErrors returns how many calls to the shared store failed so far
// (timeouts included; calls the caller cancelled are not counted).
func (f *Store) SharedErrors() int64 { return f.errs.Load() }

// Decide decides on the shared store, or on the fallback when the breaker
// is open or the shared store fails.
func (f *Store) Decide(ctx context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	if !f.open.Load() {
		err := f.shared.Decide(ctx, p, key, cost, d)
		if err == nil {
			f.succeeded()
			return nil
		}
		if ctx.Err() != nil {
			return err // the caller gave up: not the store's fault
		}
		f.failed(err)
		if f.opts.OnError == core.OnErrorFail {
			return err
		}
	} else if f.opts.OnError == core.OnErrorFail {
		return fmt.Errorf("shared store unavailable (breaker open)")
	}
	f.fallback.Add(1)
	switch f.opts.OnError {
	case core.OnErrorLocal:
		if err := f.opts.Local.Decide(ctx, p, key, cost, d); err != nil {
			return err
		}
	default:
		// Allow or deny: no store knows the counts, so no limit decides
		// and nothing claims a quota, a reset or a retry-after.
		d.Undecided(p, cost, f.opts.OnError == core.OnErrorAllow)
	}
	d.Fallback = true
	return nil
}

// Inspect reads the key where the failure policy would decide it now: on
// the shared store, or on the local one (on_error local) while the shared
// store fails (core.Operator).
func (f *Store) Inspect(ctx context.Context, p *core.Policy, key string, d *core.Decision) error {
	if op, ok := f.shared.(core.Operator); ok && !f.open.Load() {
		err := op.Inspect(ctx, p, key, d)
		if err == nil || f.opts.OnError != core.OnErrorLocal {
			return err
		}
	}
	if f.opts.OnError != core.OnErrorLocal {
		return fmt.Errorf("shared store unavailable (breaker open)")
	}
	return f.opts.Local.(core.Operator).Inspect(ctx, p, key, d)
}

// Reset forgets the key on the local store (what the fallback counted) and
// on the shared one (core.Operator). While the breaker is open with
// on_error local, the local counts are what decides, and only they are
// reset; otherwise it fails if the shared store does.
func (f *Store) Reset(ctx context.Context, p *core.Policy, key string, limit int) error {
	if local, ok := f.opts.Local.(core.Operator); ok {
		if err := local.Reset(ctx, p, key, limit); err != nil {
			return err
		}
	}
	if f.open.Load() && f.opts.OnError == core.OnErrorLocal {
		return nil
	}
	op, ok := f.shared.(core.Operator)
	if !ok {
		return fmt.Errorf("shared store cannot reset keys")
	}
	return op.Reset(ctx, p, key, limit)
}

// decidedOn is the store a decision was made on: the shared one, or for a
// fallback decision the local one, or nil when the failure policy allowed
// or denied without a store (nothing was taken).
func (f *Store) decidedOn(fallback bool) core.Store {
	switch {
	case !fallback:
		return f.shared
	case f.opts.OnError == core.OnErrorLocal:
		return f.opts.Local
	}
	return nil
}

// CancelShaped gives a shaped request's places back where it was decided:
// on the local store for a decision the fallback made, else on the shared
// store (core.ShapeStore).
func (f *Store) CancelShaped(ctx context.Context, s *core.Shaped) error {
	target := f.decidedOn(s.Fallback)
	if target == nil {
		return nil
	}
	ss, ok := target.(core.ShapeStore)
	if !ok {
		return fmt.Errorf("store cannot give a shaped request's place back")
	}
	return ss.CancelShaped(ctx, s)
}

// EndLease ends or renews a lease where it was taken: on the local store
// for a lease the fallback took, else on the shared store (core.LeaseStore).
// An undecided fallback (allow, deny) took no lease. A shared store's
// failure is returned: the lease then ends by itself after its window.
func (f *Store) EndLease(ctx context.Context, l *core.Lease, renew bool) (found, now int64, err error) {
	target := f.decidedOn(l.Fallback)
	if target == nil {
		return 0, 0, nil
	}
	ls, ok := target.(core.LeaseStore)
	if !ok {
		return 0, 0, fmt.Errorf("store holds no leases")
	}
	return ls.EndLease(ctx, l, renew)
}

func (f *Store) succeeded() {
	// The common case, no failure since the last success, takes no lock.
	if f.failing.Load() {
		f.mu.Lock()
		f.failures = 0
		f.failing.Store(false)
		f.mu.Unlock()
	}
}

func (f *Store) failed(err error) {
	f.errs.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing.Store(true)
	f.failures++
	if f.failures < f.opts.Failures || f.open.Load() || f.closed {
		return
	}
	f.open.Store(true)
	if f.opts.OnStateChange != nil {
		f.opts.OnStateChange(true, err)
	}
	if !f.probing {
		f.probing = true
		go f.probe()
	}
}

// probe pings the shared store every ProbeEvery until it answers, then
// closes the breaker.
func (f *Store) probe() {
	t := time.NewTicker(f.opts.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.opts.ProbeTimeout)
		var err error
		if pinger, ok := f.shared.(Pinger); ok {
			err = pinger.Ping(ctx)
		} else {
			var d core.Decision
			err = f.shared.Decide(ctx, probePolicy, "tollgate-probe", 0, &d)
		}
		cancel()
		if err == nil {
			f.mu.Lock()
			f.failures, f.probing = 0, false
			f.open.Store(false)
			f.mu.Unlock()
			if f.opts.OnStateChange != nil {
				f.opts.OnStateChange(false, nil)
			}
			return
		}
	}
}

var probePolicy = core.MustPolicy("tollgate-probe", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second, Algorithm: algo.FixedWindow})

// Close stops the background probe. The wrapped stores stay open.
func (f *Store) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		close(f.stop)
	}
	return nil
}

var _ core.Store = (*Store)(nil)
