package adaptive

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/core/internal/refcount"
)

// The adaptive rules an Options.Controller names.
const (
	// ControllerGradient is Gradient, the default: errors, latency, work
	// in flight and the share served.
	ControllerGradient = "gradient"
	// ControllerAIMD is AIMD, the rule before Gradient: errors and a fixed
	// latency target only.
	ControllerAIMD = "aimd"
)

// Options tunes a Controller. Zero fields take the
// defaults, which work without tuning for most upstreams; Interval,
// Decrease and Increase default by Controller.
type Options struct {
	// Controller is the rule: ControllerGradient (default) or
	// ControllerAIMD.
	Controller string
	// MinFactor is the lowest fraction of the configured counts the limit
	// may fall to; default 0.1.
	MinFactor float64
	// ErrorRate is the fraction of upstream errors (5xx, 429 from the
	// upstream, timeouts) in an interval above which the limit shrinks;
	// default 0.05.
	ErrorRate float64
	// LatencyTarget is a latency the Quantile must stay under; above it the
	// limit shrinks. 0 means no fixed target (Gradient still watches
	// Tolerance).
	LatencyTarget time.Duration
	// Tolerance is how far above the unloaded latency (measured: see
	// MeasureEvery) Gradient lets the Quantile rise before it counts the
	// interval congested, as a multiple; default 1.5. AIMD ignores it.
	Tolerance float64
	// Quantile is the latency quantile watched; default 0.9.
	Quantile float64
	// Interval is how often the signals are judged; default 500ms for
	// Gradient, 1s for AIMD.
	Interval time.Duration
	// Decrease multiplies the factor when the upstream struggles. Gradient
	// also multiplies by the share of work the upstream served, so Decrease
	// is the margin kept below the capacity it measured; default 0.95. AIMD:
	// default 0.7.
	Decrease float64
	// Increase is the growth after a healthy interval: for Gradient the
	// first probe, a fraction of the factor that doubles each healthy
	// interval; for AIMD added to the factor each time. Default 0.05 (AIMD:
	// the full limit returns in at most 18 healthy intervals).
	Increase float64
	// MinSamples is the fewest observations in an interval that can show
	// the upstream struggling; default 10.
	MinSamples int64
	// Paced says the limits adapted let requests through at a steady rate
	// the factor scales (gcra, token_bucket, leaky_bucket), not a count in
	// flight: when such a limit binds, the requests it starts in an
	// interval are the factor's rate, so Gradient can read a capacity from
	// the answers of an upstream draining a queue. core/config sets it from
	// the policy's limits; AIMD ignores it.
	Paced bool
}

// Validate reports whether o is usable, with an error naming the field.
func (o Options) Validate() error {
	_, err := o.withDefaults()
	return err
}

// withDefaults validates o and fills in defaults; errors name the field.
func (o Options) withDefaults() (Options, error) {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	if o.Controller == "" {
		o.Controller = ControllerGradient
	}
	def(&o.MinFactor, 0.1)
	def(&o.ErrorRate, 0.05)
	def(&o.Quantile, 0.9)
	def(&o.Tolerance, 1.5)
	def(&o.Increase, 0.05)
	if o.Controller == ControllerAIMD {
		def(&o.Decrease, 0.7)
		if o.Interval == 0 {
			o.Interval = time.Second
		}
	} else {
		def(&o.Decrease, 0.95)
		if o.Interval == 0 {
			o.Interval = 500 * time.Millisecond
		}
	}
	if o.MinSamples == 0 {
		o.MinSamples = 10
	}
	for name, v := range map[string]float64{"min": o.MinFactor, "error_rate": o.ErrorRate, "quantile": o.Quantile,
		"tolerance": o.Tolerance, "increase": o.Increase, "decrease": o.Decrease} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return o, fmt.Errorf("adaptive %s: %g is not a number", name, v)
		}
	}
	switch {
	case o.Controller != ControllerGradient && o.Controller != ControllerAIMD:
		return o, fmt.Errorf("adaptive controller: %q is not %s or %s", o.Controller, ControllerGradient, ControllerAIMD)
	case o.MinFactor <= 0 || o.MinFactor > 1:
		return o, fmt.Errorf("adaptive min: %g must be above 0 and at most 1", o.MinFactor)
	case o.ErrorRate <= 0 || o.ErrorRate >= 1:
		return o, fmt.Errorf("adaptive error_rate: %g must be between 0 and 1", o.ErrorRate)
	case o.Quantile <= 0 || o.Quantile >= 1:
		return o, fmt.Errorf("adaptive quantile: %g must be between 0 and 1", o.Quantile)
	case o.Tolerance <= 1 || o.Tolerance > 100:
		return o, fmt.Errorf("adaptive tolerance: %g must be above 1 and at most 100", o.Tolerance)
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
// node's signals for the interval (and, for AIMD, its verdict on them), it
// applies the controller's Lua twin (GradientLua or AIMDLua) to the shared
// state on the shared store's clock and returns the factor all nodes now
// use.
type FactorSync interface {
	SyncFactor(ctx context.Context, sig Signals, congested bool, o Options) (float64, error)
}

// latencyBuckets are the upper bounds of the latency histogram, in µs: 5%
// apart (fine enough for Tolerance) from 50 µs to over a minute.
var latencyBuckets = func() []int64 {
	var b []int64
	for v := 50.0; v < 120e6; v *= 1.05 {
		b = append(b, int64(v))
	}
	return b
}()

// Controller controls a policy's limits by the upstream's health: Start and
// Observe feed it the requests let through and the upstream's answers;
// every Interval its rule (Gradient or AIMD) moves the factor between
// MinFactor and 1. Policies built with it scale their counts by the factor
// (see core.PolicyOptions.Adaptive).
type Controller struct {
	opts Options

	started, denied, total, errs atomic.Int64
	latency                      []atomic.Int64 // counts per latencyBuckets entry

	factorBits atomic.Uint64
	mu         sync.Mutex
	sync       FactorSync
	// aimd and gradient are the local rule's state (one of them is used);
	// judged counts the intervals judged, which is the local rule's clock
	// (one Judge, one interval).
	aimd     AIMDState
	gradient GradientState
	judged   int64
	stop     chan struct{}
	stopped  sync.Once
	// lastQuantile is the latency quantile of the last judged interval.
	lastQuantile atomic.Int64
	// stalled sums the gateway's stalls noted in the current interval, in
	// ns (NoteStall); unjudged counts the intervals left unjudged for
	// them. aimdAfterStall and aimdStallHeld are holdForStall's state for
	// AIMD (the gradient rule keeps its own).
	stalled                       atomic.Int64
	unjudged                      atomic.Int64
	aimdAfterStall, aimdStallHeld int64
	// admittedBefore is Signals.Admitted of the current interval's
	// requests started before the factor last changed within it (a
	// fleet's shared factor, read halfway), and startedBefore counts
	// them. Guarded by mu.
	admittedBefore float64
	startedBefore  int64
}

// New validates opts and starts the controller at factor 1; Close
// stops it.
func New(opts Options) (*Controller, error) {
	a, err := NewJudged(opts)
	if err == nil {
		go a.loop()
	}
	return a, err
}

// NewJudged is New for a caller that ends each interval
// itself with Judge, as a simulation on its own clock does: no timer runs.
func NewJudged(opts Options) (*Controller, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &Controller{opts: o, latency: make([]atomic.Int64, len(latencyBuckets)+1), stop: make(chan struct{})}
	a.factorBits.Store(math.Float64bits(1))
	return a, nil
}

// Options returns the controller's options, defaults filled in.
func (a *Controller) Options() Options { return a.opts }

// SetSync shares the factor through s (the Redis store's FactorSync); nil
// keeps it on this node.
func (a *Controller) SetSync(s FactorSync) {
	a.mu.Lock()
	a.sync = s
	a.mu.Unlock()
}

// Start records one request let through to the upstream; Observe records
// its answer. Their difference is the work in flight.
func (a *Controller) Start() { a.started.Add(1) }

// Deny records one request the policy refused.
func (a *Controller) Deny() { a.denied.Add(1) }

// Observe records one upstream result: its status (0 for a timeout or no
// response) and how long the upstream took. Only successful answers'
// latency is watched: a failure counts as one, however fast or slow it
// came.
func (a *Controller) Observe(status int, latency time.Duration) {
	a.total.Add(1)
	if status == 0 || status >= 500 || status == 429 {
		a.errs.Add(1)
		return
	}
	us := latency.Microseconds()
	// The first bucket whose bound is at least us (binary search).
	lo, hi := 0, len(latencyBuckets)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if latencyBuckets[mid] < us {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	a.latency[lo].Add(1)
}

// NoteStall records that the gateway itself stalled for d in the current
// interval: its process stopped or starved, so the answers it had in
// flight took d longer to be heard, whatever the upstream did. A
// controller from New watches its process and notes stalls itself; a
// caller that judges on its own clock (NewJudged) notes them.
//
// An interval with at least MinStall of stalls, or a tenth of Interval if
// more, is not judged, nor the one after it (the requests the stall held
// back reach the upstream at once, and answers it delayed past the
// interval's end are heard there): the factor holds. A third interval in
// a row is judged whatever it noted, so a gateway that stalls all the time
// still adapts. A controller that shares its factor (SetSync) judges every
// interval as measured: a fleet's node that sent no signals for an
// interval would leave the fleet's sums empty when every node stalled at
// once (one busy machine), and an empty interval grows the factor and
// ends a measurement of the unloaded latency unmeasured.
func (a *Controller) NoteStall(d time.Duration) {
	if d > 0 {
		a.stalled.Add(int64(d))
	}
}

// Unjudged returns how many intervals were left unjudged because the
// gateway stalled (see NoteStall).
func (a *Controller) Unjudged() int64 { return a.unjudged.Load() }

// Factor returns the current fraction of the configured counts, in
// [MinFactor, 1].
func (a *Controller) Factor() float64 { return math.Float64frombits(a.factorBits.Load()) }

// LastQuantile returns the latency quantile measured in the last judged
// interval (0 without samples).
func (a *Controller) LastQuantile() time.Duration {
	return time.Duration(a.lastQuantile.Load()) * time.Microsecond
}

// loop ends an interval at every multiple of Interval on the wall clock
// and, with a shared state, reads the fleet's factor half an interval
// later. Every node of a fleet so sends its interval's signals at about
// the same moment, and the first read after them judges them all (Redis
// judges on a read once an interval has passed since the last judgement,
// at 7/8 of it, and on signals only if no read came for an interval and
// a half): every node uses the new factor within moments, and no node's
// signals wait a whole interval. Nodes' clocks may differ by Interval/8.
//
// Before judging, it notes the stalls the process's stall watch saw since
// the last judgement, or how late its own timer fired if that is more (a
// stall that ends at the interval's end may wake the timer before the
// watch).
func (a *Controller) loop() {
	release := watchStalls()
	defer release()
	_, seen := stalledSince(0)
	half := a.opts.Interval / 2
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for {
		next := time.Now().Truncate(half).Add(half)
		t.Reset(time.Until(next))
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		if next.UnixNano()/int64(half)%2 == 0 {
			var stalled time.Duration
			stalled, seen = stalledSince(seen)
			if late := time.Since(next); late > stallNoise {
				stalled = max(stalled, late)
			}
			a.NoteStall(stalled)
			a.Judge()
		} else {
			a.ReadShared()
		}
	}
}

// ReadShared reads the fleet's shared factor (judging the fleet's signals
// if an interval has passed since the last judgement); it sends no signals
// of its own. A controller from New calls it half an interval after each
// interval's end (see loop); a caller that judges on its own clock
// (NewJudged) calls it there too. Without a shared state (SetSync), and
// for AIMD, whose shared state takes verdicts only, it does nothing.
func (a *Controller) ReadShared() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sync == nil || a.opts.Controller == ControllerAIMD {
		return
	}
	if shared, ok := a.syncShared(Signals{}, false); ok {
		if old := a.Factor(); shared != old {
			// The requests started so far were let through at the old one.
			n := a.started.Load()
			a.admittedBefore += float64(n-a.startedBefore) * old
			a.startedBefore = n
		}
		a.factorBits.Store(math.Float64bits(shared))
	}
}

// syncShared sends sig (and AIMD's verdict) to the shared state and, when
// it answers within half an interval, makes its factor the local rule's
// too, so the local rule goes on from the fleet's factor if Redis fails.
// The caller holds a.mu and has a.sync set.
func (a *Controller) syncShared(sig Signals, congested bool) (float64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.Interval/2)
	defer cancel()
	shared, err := a.sync.SyncFactor(ctx, sig, congested, a.opts)
	if err != nil {
		return 0, false
	}
	a.aimd.Factor, a.gradient.Factor = shared, shared
	return shared, true
}

// Judge ends the current interval: it reads and resets the signals and
// moves the factor by the controller's rule, unless the gateway stalled
// (see NoteStall). The controller calls it every Interval; tests call it
// directly.
func (a *Controller) Judge() {
	total, errs := a.total.Swap(0), a.errs.Swap(0)
	counts := make([]int64, len(a.latency))
	for i := range a.latency {
		counts[i] = a.latency[i].Swap(0)
	}
	q := quantile(counts, total-errs, a.opts.Quantile)
	a.lastQuantile.Store(q)
	sig := Signals{Started: a.started.Swap(0), Denied: a.denied.Swap(0), Answered: total, Failed: errs, Latency: q}
	if q == math.MaxInt64 {
		sig.Latency = latencyBuckets[len(latencyBuckets)-1]
	}
	// AIMD's verdict: errors or the fixed latency target.
	congested := total >= a.opts.MinSamples &&
		(float64(errs) > a.opts.ErrorRate*float64(total) ||
			(a.opts.LatencyTarget > 0 && q > a.opts.LatencyTarget.Microseconds()))
	stalled := time.Duration(a.stalled.Swap(0))
	a.mu.Lock()
	defer a.mu.Unlock()
	sig.Admitted = a.admittedBefore + float64(sig.Started-a.startedBefore)*a.Factor()
	a.admittedBefore, a.startedBefore = 0, 0
	a.judged++
	if stalled >= max(MinStall, a.opts.Interval/10) {
		sig.Stalled = 1
	}
	now := a.judged * a.opts.Interval.Microseconds()
	var factor float64
	if a.opts.Controller == ControllerAIMD {
		var hold bool
		hold, a.aimdAfterStall, a.aimdStallHeld = holdForStall(sig.Stalled > 0, a.aimdAfterStall, a.aimdStallHeld)
		if hold {
			a.unjudged.Add(1)
			return
		}
		a.aimd = AIMD(a.aimd, now, congested, a.opts)
		factor = a.aimd.Factor
	} else {
		// The interval's signals, then the read that judges them (and may
		// hold it for a stall: in a fleet, this node's view of the shared
		// rule's).
		a.gradient = Gradient(Gradient(a.gradient, now, sig, a.opts), now, Signals{}, a.opts)
		factor = a.gradient.Factor
		if a.gradient.StallHeld > 0 {
			a.unjudged.Add(1)
		}
	}
	if a.sync != nil {
		if shared, ok := a.syncShared(sig, congested); ok {
			factor = shared
		}
	}
	a.factorBits.Store(math.Float64bits(factor))
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
func (a *Controller) Close() error {
	a.stopped.Do(func() { close(a.stop) })
	return nil
}

// adaptives are the controllers acquired by key, shared across reloads.
var adaptives refcount.Pool[*Controller]

// Acquire returns the process's controller for key and opts,
// starting it on first use, so a policy keeps its factor across config
// reloads (key it by PolicyScope). Call release when the config that
// acquired it is unloaded; the last release stops the controller.
func Acquire(key string, opts Options) (a *Controller, release func(), err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, nil, err
	}
	key += fmt.Sprintf("|%+v", o)
	if a, err = adaptives.Acquire(key, func() (*Controller, error) { return New(o) }); err != nil {
		return nil, nil, err
	}
	var once sync.Once
	return a, func() { once.Do(func() { _ = adaptives.Release(key, (*Controller).Close) }) }, nil
}
