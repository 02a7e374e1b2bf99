package core

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/core/internal/refcount"
)

// AdaptiveOptions tunes an Adaptive controller. Zero fields take the
// defaults, which work without tuning for most upstreams.
type AdaptiveOptions struct {
	// MinFactor is the lowest fraction of the configured counts the limit
	// may fall to; default 0.1.
	MinFactor float64
	// ErrorRate is the fraction of upstream errors (5xx, 429 from the
	// upstream, timeouts) in an interval above which the limit shrinks;
	// default 0.05.
	ErrorRate float64
	// LatencyTarget is the upstream latency the Quantile must stay under;
	// above it the limit shrinks. 0 means latency is not watched.
	LatencyTarget time.Duration
	// Quantile is the latency quantile compared with LatencyTarget; default
	// 0.9.
	Quantile float64
	// Interval is how often the signals are judged; default 1s.
	Interval time.Duration
	// Decrease multiplies the factor when the upstream struggles; default 0.7.
	Decrease float64
	// Increase is added to the factor after each healthy interval; default
	// 0.05 (the full limit returns in at most 18 healthy intervals).
	Increase float64
	// MinSamples is the fewest observations in an interval that can show
	// the upstream struggling; default 10.
	MinSamples int64
}

// Validate reports whether o is usable, with an error naming the field.
func (o AdaptiveOptions) Validate() error {
	_, err := o.withDefaults()
	return err
}

// withDefaults validates o and fills in defaults; errors name the field.
func (o AdaptiveOptions) withDefaults() (AdaptiveOptions, error) {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.MinFactor, 0.1)
	def(&o.ErrorRate, 0.05)
	def(&o.Quantile, 0.9)
	def(&o.Decrease, 0.7)
	def(&o.Increase, 0.05)
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	if o.MinSamples == 0 {
		o.MinSamples = 10
	}
	switch {
	case o.MinFactor <= 0 || o.MinFactor > 1:
		return o, fmt.Errorf("adaptive min: %g must be above 0 and at most 1", o.MinFactor)
	case o.ErrorRate <= 0 || o.ErrorRate >= 1:
		return o, fmt.Errorf("adaptive error_rate: %g must be between 0 and 1", o.ErrorRate)
	case o.Quantile <= 0 || o.Quantile >= 1:
		return o, fmt.Errorf("adaptive quantile: %g must be between 0 and 1", o.Quantile)
	case o.Decrease <= 0 || o.Decrease >= 1:
		return o, fmt.Errorf("adaptive decrease: %g must be between 0 and 1", o.Decrease)
	case o.Increase <= 0 || o.Increase > 1:
		return o, fmt.Errorf("adaptive increase: %g must be above 0 and at most 1", o.Increase)
	case o.Interval < 10*time.Millisecond:
		return o, fmt.Errorf("adaptive interval: %s must be at least 10ms", o.Interval)
	case o.LatencyTarget < 0:
		return o, fmt.Errorf("adaptive latency: %s must not be negative", o.LatencyTarget)
	case o.MinSamples < 1:
		return o, fmt.Errorf("adaptive min_samples: %d must be at least 1", o.MinSamples)
	}
	return o, nil
}

// FactorSync shares an adaptive factor across gateway nodes: given this
// node's verdict for the interval, it applies AIMD's Lua twin (AIMDLua) to
// the shared factor on the shared store's clock and returns the factor all
// nodes now use.
type FactorSync interface {
	SyncFactor(ctx context.Context, congested bool, o AdaptiveOptions) (float64, error)
}

// latencyBuckets are the upper bounds of the latency histogram, in µs: 25%
// apart from 50 µs to over a minute.
var latencyBuckets = func() []int64 {
	var b []int64
	for v := 50.0; v < 120e6; v *= 1.25 {
		b = append(b, int64(v))
	}
	return b
}()

// Adaptive is an AIMD controller of a policy's limits: Observe feeds it
// upstream results; every Interval it shrinks the factor multiplicatively
// when the error rate or the latency quantile is over target, and grows it
// additively otherwise, between MinFactor and 1. Policies built with it
// scale their counts by the factor (see PolicyOptions.Adaptive).
type Adaptive struct {
	opts AdaptiveOptions

	total, errs atomic.Int64
	latency     []atomic.Int64 // counts per latencyBuckets entry

	factorBits atomic.Uint64
	mu         sync.Mutex
	sync       FactorSync
	// state is the local AIMD state; judged counts the intervals judged,
	// which is the local rule's clock (one Judge, one interval).
	state   AIMDState
	judged  int64
	stop    chan struct{}
	stopped sync.Once
	// lastQuantile is the latency quantile of the last judged interval.
	lastQuantile atomic.Int64
}

// NewAdaptive validates opts and starts the controller at factor 1; Close
// stops it.
func NewAdaptive(opts AdaptiveOptions) (*Adaptive, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &Adaptive{opts: o, latency: make([]atomic.Int64, len(latencyBuckets)+1), stop: make(chan struct{})}
	a.factorBits.Store(math.Float64bits(1))
	go a.loop()
	return a, nil
}

// SetSync shares the factor through s (the Redis store's FactorSync); nil
// keeps it on this node.
func (a *Adaptive) SetSync(s FactorSync) {
	a.mu.Lock()
	a.sync = s
	a.mu.Unlock()
}

// Observe records one upstream result: its status (0 for a timeout or no
// response) and how long the upstream took.
func (a *Adaptive) Observe(status int, latency time.Duration) {
	a.total.Add(1)
	if status == 0 || status >= 500 || status == 429 {
		a.errs.Add(1)
	}
	us := latency.Microseconds()
	i := 0
	for i < len(latencyBuckets) && us > latencyBuckets[i] {
		i++
	}
	a.latency[i].Add(1)
}

// Factor returns the current fraction of the configured counts, in
// [MinFactor, 1].
func (a *Adaptive) Factor() float64 { return math.Float64frombits(a.factorBits.Load()) }

// LastQuantile returns the latency quantile measured in the last judged
// interval (0 without samples).
func (a *Adaptive) LastQuantile() time.Duration {
	return time.Duration(a.lastQuantile.Load()) * time.Microsecond
}

func (a *Adaptive) loop() {
	t := time.NewTicker(a.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
			a.Judge()
		}
	}
}

// Judge ends the current interval: it reads and resets the signals and
// moves the factor. The controller calls it every Interval; tests call it
// directly.
func (a *Adaptive) Judge() {
	total, errs := a.total.Swap(0), a.errs.Swap(0)
	counts := make([]int64, len(a.latency))
	for i := range a.latency {
		counts[i] = a.latency[i].Swap(0)
	}
	q := quantile(counts, total, a.opts.Quantile)
	a.lastQuantile.Store(q)
	congested := total >= a.opts.MinSamples &&
		(float64(errs) > a.opts.ErrorRate*float64(total) ||
			(a.opts.LatencyTarget > 0 && q > a.opts.LatencyTarget.Microseconds()))
	a.mu.Lock()
	defer a.mu.Unlock()
	a.judged++
	a.state = AIMD(a.state, a.judged*a.opts.Interval.Microseconds(), congested, a.opts)
	if a.sync != nil {
		ctx, cancel := context.WithTimeout(context.Background(), a.opts.Interval/2)
		if shared, err := a.sync.SyncFactor(ctx, congested, a.opts); err == nil {
			a.state.Factor = shared
		}
		cancel()
	}
	a.factorBits.Store(math.Float64bits(a.state.Factor))
}

// quantile returns the upper bound (µs) of the bucket holding quantile q.
func quantile(counts []int64, total int64, q float64) int64 {
	if total == 0 {
		return 0
	}
	want := int64(math.Ceil(q * float64(total)))
	var seen int64
	for i, c := range counts {
		seen += c
		if seen >= want {
			if i < len(latencyBuckets) {
				return latencyBuckets[i]
			}
			return math.MaxInt64
		}
	}
	return math.MaxInt64
}

// Close stops the controller.
func (a *Adaptive) Close() error {
	a.stopped.Do(func() { close(a.stop) })
	return nil
}

// scaleLimits returns base with every count (and explicit burst) scaled by
// f, at least 1 each.
func scaleLimits(base []Limit, f float64) []Limit {
	out := make([]Limit, len(base))
	for i, l := range base {
		l.Count = max(1, int64(math.Round(float64(l.Count)*f)))
		if l.Burst > 0 {
			l.Burst = max(1, int64(math.Round(float64(l.Burst)*f)))
		}
		if err := l.validate(); err != nil {
			// A smaller count cannot break a limit that validated; keep the
			// configured one if it somehow does.
			l = base[i]
		}
		out[i] = l
	}
	return out
}

// adaptives are the controllers acquired by key, shared across reloads.
var adaptives refcount.Pool[*Adaptive]

// AcquireAdaptive returns the process's controller for key and opts,
// starting it on first use, so a policy keeps its factor across config
// reloads (key it by PolicyScope). Call release when the config that
// acquired it is unloaded; the last release stops the controller.
func AcquireAdaptive(key string, opts AdaptiveOptions) (a *Adaptive, release func(), err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, nil, err
	}
	key += fmt.Sprintf("|%+v", o)
	if a, err = adaptives.Acquire(key, func() (*Adaptive, error) { return NewAdaptive(o) }); err != nil {
		return nil, nil, err
	}
	var once sync.Once
	return a, func() { once.Do(func() { _ = adaptives.Release(key, (*Adaptive).Close) }) }, nil
}
