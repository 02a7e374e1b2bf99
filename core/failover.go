package core

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// OnError says what a FailoverStore does with a request its shared store
// could not decide (Redis down, slow or failing over).
type OnError uint8

const (
	// OnErrorLocal decides on this node's fallback store with the same limits
	// (the default): requests keep flowing and each node still limits.
	OnErrorLocal OnError = iota
	// OnErrorAllow lets every request through until the store is back.
	OnErrorAllow
	// OnErrorDeny refuses every request until the store is back.
	OnErrorDeny
	// OnErrorFail returns the store's error to the caller (Kong answers 500).
	OnErrorFail
)

var onErrorNames = []string{OnErrorLocal: "local", OnErrorAllow: "allow", OnErrorDeny: "deny", OnErrorFail: "fail"}

// String returns the configuration name of o.
func (o OnError) String() string { return enumName(onErrorNames, o, "OnError") }

// ParseOnError reads "local", "allow", "deny" or "fail".
func ParseOnError(s string) (OnError, error) {
	if o, ok := parseEnum[OnError](onErrorNames, s); ok {
		return o, nil
	}
	return 0, fmt.Errorf("on_error: unknown value %q (want local, allow, deny or fail)", s)
}

// Pinger is a store that can be probed for health.
type Pinger interface {
	Ping(ctx context.Context) error
}

// FailoverOptions configures a FailoverStore.
type FailoverOptions struct {
	// OnError picks the fallback.
	OnError OnError
	// Local is the fallback store for OnErrorLocal (a memory store).
	Local Store
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

// FailoverStore decides on a shared store and, when it fails, on the
// fallback its options choose. A breaker opens after consecutive failures,
// so a dead store stops adding its timeout to every request; while open, a
// background probe pings the shared store and closes the breaker when it
// answers.
type FailoverStore struct {
	shared Store
	opts   FailoverOptions

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

// NewFailoverStore wraps shared. shared should implement Pinger for the
// breaker to close again; without it the breaker retries the store itself
// once per ProbeEvery.
func NewFailoverStore(shared Store, opts FailoverOptions) (*FailoverStore, error) {
	if opts.OnError > OnErrorFail {
		return nil, fmt.Errorf("on_error: unknown value %d", opts.OnError)
	}
	if opts.OnError == OnErrorLocal && opts.Local == nil {
		return nil, fmt.Errorf("on_error: local needs a local store")
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
	return &FailoverStore{shared: shared, opts: opts, stop: make(chan struct{})}, nil
}

// Open reports whether the breaker is open (the shared store is skipped).
func (f *FailoverStore) Open() bool { return f.open.Load() }

// FallbackDecisions returns how many decisions the fallback took so far.
func (f *FailoverStore) FallbackDecisions() int64 { return f.fallback.Load() }

// SharedErrors returns how many calls to the shared store failed so far
// (timeouts included; calls the caller cancelled are not counted).
func (f *FailoverStore) SharedErrors() int64 { return f.errs.Load() }

// Decide decides on the shared store, or on the fallback when the breaker
// is open or the shared store fails.
func (f *FailoverStore) Decide(ctx context.Context, p *Policy, key string, cost int64, d *Decision) error {
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
		if f.opts.OnError == OnErrorFail {
			return err
		}
	} else if f.opts.OnError == OnErrorFail {
		return fmt.Errorf("shared store unavailable (breaker open)")
	}
	f.fallback.Add(1)
	switch f.opts.OnError {
	case OnErrorLocal:
		if err := f.opts.Local.Decide(ctx, p, key, cost, d); err != nil {
			return err
		}
	case OnErrorAllow:
		fixedDecision(p, cost, d, true, 0)
	default:
		fixedDecision(p, cost, d, false, f.opts.ProbeEvery)
	}
	d.Fallback = true
	return nil
}

// fixedDecision fills d with the same verdict from every limit: allowed with
// the full quota, or denied with retry.
func fixedDecision(p *Policy, cost int64, d *Decision, allowed bool, retry time.Duration) {
	d.Start(p, cost)
	for i, l := range p.Limits() {
		r := Result{Allowed: allowed, Limit: l.Count}
		if allowed {
			r.Remaining = l.Count
		} else {
			r.RetryAfter = max(retry, time.Second)
		}
		d.Results[i] = r
	}
	d.Summarize(allowed)
}

func (f *FailoverStore) succeeded() {
	// The common case, no failure since the last success, takes no lock.
	if f.failing.Load() {
		f.mu.Lock()
		f.failures = 0
		f.failing.Store(false)
		f.mu.Unlock()
	}
}

func (f *FailoverStore) failed(err error) {
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
func (f *FailoverStore) probe() {
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
			var d Decision
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

var probePolicy = MustPolicy("tollgate-probe", PolicyOptions{}, Limit{Count: 1, Window: time.Second, Algorithm: FixedWindow})

// Close stops the background probe. The wrapped stores stay open.
func (f *FailoverStore) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		close(f.stop)
	}
	return nil
}

var _ Store = (*FailoverStore)(nil)
