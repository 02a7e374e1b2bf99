package gate

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
)

// Gate is the one request pipeline of every adapter (the gateway plugins,
// the net/http middleware): an adapter tells it, rule by rule,
// whether a request is covered and with which key and cost; the gate
// decides each rule on its store, combines the decisions and returns an Outcome
// (pass, deny, or hold then pass) with the headers to send. The adapter only
// translates its request into Inputs and the Outcome into its response.
type Gate struct {
	rules      []Rule
	status     int
	body       string
	render     *headers.Renderer // every rule's policies' header fields, derived once
	skipFailed bool
	top        []*topK // per rule: the keys it denied most; nil when off
}

// Rule is one policy as a gate applies it.
type Rule struct {
	// Limiter is the policy over its store.
	Limiter *core.Limiter
	// Family is what a request may take instead of the limiter's policy
	// (Family.Policy): other plans' policies, chosen by Input.Plan, the
	// policy below a reserve, by Input.Priority, and the charging twin of
	// its after-response limits; nil is the policy alone (New composes
	// its charging twin).
	Family *core.Family
	// EmptyKey says what a request without a key does under this rule.
	EmptyKey EmptyKey
	// Charge, for a policy with limits charged after the response, is
	// what each response costs them (see Outcome.Charge).
	Charge *ResponseCost
}

// Config configures a Gate.
type Config struct {
	// Rules are decided in order; a request must pass every rule that covers
	// it, and the first denial ends the pipeline.
	Rules []Rule
	// Status answers a denied request; 0 means DefaultDenyStatus (429).
	Status int
	// Body is the denial body; empty means DefaultDenyBody.
	Body string
	// Headers selects the rate-limit headers.
	Headers headers.Options
	// SkipFailed skips a rule whose store could not decide (only on_error
	// fail lets a store fail) instead of ending the pipeline with a
	// *StoreError.
	SkipFailed bool
	// TopDenied is how many keys each rule tracks as the ones it denied most
	// recently (TopDenied): 0 means DefaultTopDenied, negative none.
	TopDenied int
}

// DefaultDenyBody is the body of a denied response when none is set.
const DefaultDenyBody = "rate limit exceeded\n"

// New validates c and returns its gate. Errors name the field and value.
func New(c Config) (*Gate, error) {
	if len(c.Rules) == 0 {
		return nil, fmt.Errorf("rules: need at least one")
	}
	for i, r := range c.Rules {
		if r.Limiter == nil {
			return nil, fmt.Errorf("rules[%d]: no limiter", i)
		}
		if r.EmptyKey > EmptyKeyShared {
			return nil, fmt.Errorf("rules[%d] empty_key: unknown value %d", i, r.EmptyKey)
		}
		if r.Family != nil && r.Family.Policy() != r.Limiter.Policy() {
			return nil, fmt.Errorf("rules[%d] family: its policy %q is not the limiter's", i, r.Family.Policy().Name())
		}
	}
	c.Rules = slices.Clone(c.Rules)
	for i := range c.Rules {
		if r := &c.Rules[i]; r.Family == nil {
			r.Family, _ = core.NewFamily(r.Limiter.Policy(), nil)
		}
	}
	if err := c.CheckSettings(); err != nil {
		return nil, err
	}
	if c.Status == 0 {
		c.Status = DefaultDenyStatus
	}
	if c.Body == "" {
		c.Body = DefaultDenyBody
	}
	g := &Gate{rules: c.Rules, status: c.Status, body: c.Body, skipFailed: c.SkipFailed}
	var policies []*core.Policy
	for i := range g.rules {
		policies = append(policies, g.rules[i].Family.All()...)
	}
	g.render = headers.NewRenderer(c.Headers, policies...)
	if c.TopDenied == 0 {
		c.TopDenied = DefaultTopDenied
	}
	for range g.rules {
		if c.TopDenied > 0 {
			g.top = append(g.top, newTopK(c.TopDenied))
		}
	}
	return g, nil
}

// CheckSettings checks c's settings but its rules (the denial's status,
// the headers' style and jitter), as New does; its errors are
// *SettingError.
func (c *Config) CheckSettings() error {
	status := c.Status
	if status == 0 {
		status = DefaultDenyStatus
	}
	if err := CheckDenyStatus(status); err != nil {
		return &SettingError{"status", err}
	}
	if err := CheckJitter(c.Headers.Jitter); err != nil {
		return &SettingError{"jitter", err}
	}
	if c.Headers.Style > headers.AI {
		return &SettingError{"headers", fmt.Errorf("unknown style %d", c.Headers.Style)}
	}
	return nil
}

// SettingError is an error of one of a Config's settings: Field names it
// as configs write it (status, jitter, headers).
type SettingError struct {
	Field string
	Err   error
}

func (e *SettingError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *SettingError) Unwrap() error { return e.Err }

// Rules returns the gate's rules, in order. The caller must not modify them.
func (g *Gate) Rules() []Rule { return g.rules }

// TopDenied returns the keys rule i denied most over the last few
// TopDeniedPeriods (shadow denials included), most denied first: a
// Space-Saving sketch of Config.TopDenied counters, so memory does not
// grow with the number of keys. Keys are as the store holds them
// (BoundKey); show them with KeyHash unless the policy shows keys in clear.
func (g *Gate) TopDenied(i int) []Heavy {
	if g.top == nil {
		return nil
	}
	return g.top[i].top()
}

// Status returns the status a denied request gets.
func (g *Gate) Status() int { return g.status }

// Body returns the body a denied request gets.
func (g *Gate) Body() string { return g.body }

// Request is an adapter's view of one request.
type Request interface {
	// Input tells the gate how rule applies to the request. An error (a
	// matcher that failed) ends the pipeline.
	Input(rule int) (Input, error)
	// Decided hears each covered rule's decision, or its store's error, and
	// how long the store took (for metrics and logs). d is valid only during
	// the call.
	Decided(rule int, d *core.Decision, err error, took time.Duration)
}

// Input is what an adapter tells the gate about a request for one rule.
type Input struct {
	// Covered reports whether the rule applies to the request (its matchers
	// accept it); the other fields matter only when it does.
	Covered bool
	// Key is the request's key under the rule.
	Key string
	// Empty reports a request without a key (every placeholder of the key
	// empty): the rule's EmptyKey decides, and a shared bucket uses Key.
	Empty bool
	// Client is the client's address as the adapter trusts it: the key of
	// a request without one under EmptyKeyClient ("": such requests
	// take the shared bucket, Key).
	Client string
	// Cost is the units of cost the request takes (at least 0).
	Cost int64
	// Plan names the plan whose limits the request takes, for a rule whose
	// Family has plans (see Family.For); empty or unknown takes the
	// default.
	Plan string
	// Priority is the request's priority, for a policy with a reserve
	// (see Family.For); 0 by default.
	Priority int
}

// SameInput is a Request that gives every rule the same Input and hears
// nothing back: for an adapter whose gate has one rule and no metrics of
// its own.
type SameInput Input

// Input returns the input, whatever the rule.
func (s *SameInput) Input(int) (Input, error) { return Input(*s), nil }

// Decided does nothing.
func (*SameInput) Decided(int, *core.Decision, error, time.Duration) {}

// StoreError is a store's failure to decide a rule, which ends the pipeline
// unless the gate skips failed rules. Only on_error fail lets it through.
type StoreError struct {
	// Policy is the rule's policy name.
	Policy string
	Err    error
}

func (e *StoreError) Error() string { return "policy " + e.Policy + ": store failed: " + e.Err.Error() }

func (e *StoreError) Unwrap() error { return e.Err }

// Outcome is what the gateway does with one request. Its zero value is ready
// for Decide.
type Outcome struct {
	// Decision is the decision the response shows: the denial, or else the
	// most restrictive decision of the rules that covered the request.
	// Decision.Policy is nil when no rule covered it.
	Decision core.Decision
	// Delay is how long to hold the request before passing it on (shaping):
	// the longest delay any rule asks for.
	Delay time.Duration
	// Key is the key of the rule whose decision Decision is (bounded, as
	// the store holds it).
	Key string
	// watching are the adaptive controllers of the rules that allowed the
	// request, which hear how the upstream answered (Observe): the first
	// MaxLimits in place (no allocation), any more in extra.
	watching [core.MaxLimits]*adaptive.Controller
	watched  int
	extra    []*adaptive.Controller
	// leases are the in-flight slots the request holds (see HoldLeases).
	leases []heldLease
	// shaped are the places in shapers' queues it holds until its
	// release (see CancelShaped).
	shaped []heldShape
	// charges are the rules whose limits its response is charged to (see
	// Charge).
	charges []heldCharge
	// unreported: ChargeBody charged a rule its fixed cost, the body having
	// reported no usage (see UsageUnreported).
	unreported bool
}

// heldCharge is a rule that charges the response: the policy (of its
// family) that let the request through, its charging twin and the key.
type heldCharge struct {
	limiter *core.Limiter
	policy  *core.Policy
	twin    *core.Policy
	key     string
	cost    *ResponseCost
}

// heldShape is a shaped request's places and the limiter whose store
// holds them.
type heldShape struct {
	limiter *core.Limiter
	shaped  core.Shaped
}

// heldLease is a lease and the limiter whose store holds it.
type heldLease struct {
	limiter *core.Limiter
	lease   core.Lease
}

// Decide runs the pipeline for one request: for each rule in order it asks
// req for the request's Input, decides the covered ones and fills outcome.
// An error from req.Input ends it and is returned as it is; a store failure
// is returned as a *StoreError (unless the gate skips failed rules); a
// cancelled ctx returns ctx's error.
func (g *Gate) Decide(ctx context.Context, req Request, outcome *Outcome) error {
	outcome.Decision, outcome.Key = core.Decision{}, ""
	outcome.Delay = 0
	outcome.watched, outcome.extra, outcome.leases, outcome.shaped, outcome.charges = 0, nil, nil, nil, nil
	outcome.unreported = false
	// A store's Decide takes d through an interface, so a local would
	// escape: one 0.5 KB allocation per request. Pooled instead.
	d := decisions.Get().(*core.Decision)
	defer decisions.Put(d)
	for i := range g.rules {
		in, err := req.Input(i)
		if err != nil {
			return err
		}
		r := &g.rules[i]
		if !in.Covered || in.Empty && r.EmptyKey == EmptyKeySkip {
			continue
		}
		if in.Empty && r.EmptyKey == EmptyKeyClient && in.Client != "" {
			in.Key = in.Client
		}
		// As the store holds it: a long key is hashed here, once, and the
		// bounded key goes everywhere after (bounding it again is a length
		// check).
		key := core.BoundKey(in.Key)
		in.Key = key
		pol, limited := r.Family.For(in.Plan, in.Priority)
		if !limited {
			continue // an unlimited plan: nothing to count
		}
		dctx := ctx
		if pol.HoldsLeases() {
			// A slot taken must be seen to be given back: a client leaving
			// mid-decision must not lose the store's reply (the store's
			// timeout still bounds it).
			dctx = context.WithoutCancel(ctx)
		}
		start := core.MonotonicNow()
		err = r.Limiter.DecideFor(dctx, pol, key, in.Cost, d)
		if wait := slotWait(d); err == nil && wait > 0 {
			// Refused for want of an in-flight slot: wait for one, briefly.
			err = waitForSlot(ctx, dctx, r.Limiter, pol, in, d, time.Now().Add(wait-(core.MonotonicNow()-start)))
		}
		req.Decided(i, d, err, core.MonotonicNow()-start)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if g.skipFailed {
				continue
			}
			return &StoreError{Policy: r.Limiter.Policy().Name(), Err: err}
		}
		if outcome.Decision.Policy == nil || core.MoreRestrictive(d, &outcome.Decision) {
			outcome.Decision, outcome.Key = *d, key
		}
		if (!d.Allowed || d.Shadowed) && g.top != nil && d.N > 0 {
			g.top[i].offer(key)
		}
		if !d.Allowed {
			if a := r.Limiter.Policy().Adaptive(); a != nil {
				a.Deny() // its limit binds: see Signals.Denied
			}
			break
		}
		outcome.keep(r.Limiter, key, d)
		if twin := r.Family.Charging(pol); r.Charge != nil && twin != nil {
			outcome.charges = append(outcome.charges, heldCharge{r.Limiter, pol, twin, key, r.Charge})
		}
		if a := r.Limiter.Policy().Adaptive(); a != nil {
			if outcome.watched < len(outcome.watching) {
				outcome.watching[outcome.watched] = a
				outcome.watched++
			} else {
				outcome.extra = append(outcome.extra, a)
			}
		}
		outcome.Delay = max(outcome.Delay, d.Delay)
	}
	if !outcome.Passes() {
		outcome.Delay = 0
		// A later rule denied: the slots and queue places earlier rules
		// took go back now.
		if len(outcome.leases) > 0 {
			outcome.endLeases(context.WithoutCancel(ctx))
		}
		outcome.CancelShaped()
		outcome.watched, outcome.extra, outcome.charges = 0, nil, nil
		return nil
	}
	// The adaptive rules count the work sent upstream (see Adaptive.Start).
	for _, a := range outcome.watching[:outcome.watched] {
		a.Start()
	}
	for _, a := range outcome.extra {
		a.Start()
	}
	return nil
}

// keep holds the in-flight slots and shaper queue places d took.
// Apart from Decide, so its large locals are not on the stack while a
// store decides: a shallower stack is copied less often when it grows.
//
//go:noinline
func (p *Outcome) keep(l *core.Limiter, key string, d *core.Decision) {
	if lease, ok := l.Lease(key, d); ok {
		p.leases = append(p.leases, heldLease{l, lease})
	}
	if shaped, ok := l.Shaped(key, d); ok {
		p.shaped = append(p.shaped, heldShape{l, shaped})
	}
}

// decisions are Decide's scratch decisions.
var decisions = sync.Pool{New: func() any { return new(core.Decision) }}

// CancelShaped gives back the places the request holds in shapers' queues
// (leaky_bucket with max_delay), for a request that will not be served:
// its client left while it was held, or a later rule denied it. The next
// request takes its place at once. A store that cannot be reached is not
// retried: the place then passes at its release, as if the request had
// been served.
func (p *Outcome) CancelShaped() {
	for i := range p.shaped {
		_ = p.shaped[i].limiter.CancelShaped(context.Background(), &p.shaped[i].shaped)
	}
	p.shaped = nil
}

// SlotPoll is how often a request waiting for an in-flight slot (an
// in_flight limit with MaxDelay) asks the store again: no store announces a
// slot coming back, so a waiting request polls, in no particular order.
const SlotPoll = 20 * time.Millisecond

// slotWait is how long a request d refused may wait for a slot: the
// deciding limit's MaxDelay when it is an in-flight limit and no rate limit
// refused it too (waiting for a slot would not help those).
func slotWait(d *core.Decision) time.Duration {
	if d.Allowed || d.Shadowed {
		return 0
	}
	l := d.DecidingLimit()
	if l == nil || l.Algorithm != algo.InFlight || l.MaxDelay <= 0 {
		return 0
	}
	limits := d.Policy.Limits()
	for i := 0; i < d.N; i++ {
		if !d.Results[i].Allowed && limits[i].Algorithm != algo.InFlight {
			return 0
		}
	}
	return l.MaxDelay
}

// waitForSlot asks the store again every SlotPoll until d allows, nothing
// but a slot is missing any more, the deadline passes or the client leaves.
func waitForSlot(ctx, dctx context.Context, lim *core.Limiter, pol *core.Policy, in Input, d *core.Decision, deadline time.Time) error {
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		t.Reset(min(SlotPoll, left))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if err := lim.DecideFor(dctx, pol, in.Key, in.Cost, d); err != nil || slotWait(d) == 0 {
			return err
		}
	}
}

// HoldsLeases reports whether the request holds in-flight slots (an
// InFlight limit allowed it), which HoldLeases keeps and gives back.
func (p *Outcome) HoldsLeases() bool { return len(p.leases) > 0 }

// HoldLeases keeps the request's in-flight slots while it runs, renewing
// them every third of their window (so a long request keeps its slot and a
// dead gateway's slots free themselves), for at most maxHold (0: no
// bound), and returns the function that gives them back: call it when the
// response is finished, even after a panic or when the client left.
// Without leases it starts nothing. A store that cannot be reached is not
// retried: its leases end by themselves after their window.
func (p *Outcome) HoldLeases(maxHold time.Duration) (end func()) {
	if len(p.leases) == 0 {
		return func() {}
	}
	leases := p.leases
	p.leases = nil // the outcome may be reused; the leases are the returned func's
	window := time.Duration(1<<63 - 1)
	for _, h := range leases {
		for _, l := range h.lease.Policy.Limits() {
			if l.Algorithm == algo.InFlight {
				window = min(window, l.Window)
			}
		}
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(max(window/3, time.Millisecond))
		defer tick.Stop()
		var timeout <-chan time.Time
		if maxHold > 0 {
			t := time.NewTimer(maxHold)
			defer t.Stop()
			timeout = t.C
		}
		for {
			select {
			case <-tick.C:
				for i := range leases {
					_, _ = leases[i].limiter.EndLease(context.Background(), &leases[i].lease, true)
				}
			case <-stop:
				return
			case <-timeout:
				return // held too long: stop renewing, the slots free themselves
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			<-done // no renewal after the end
			held := Outcome{leases: leases}
			held.endLeases(context.Background())
		})
	}
}

// endLeases gives back every lease the outcome holds.
func (p *Outcome) endLeases(ctx context.Context) {
	for i := range p.leases {
		_, _ = p.leases[i].limiter.EndLease(ctx, &p.leases[i].lease, false)
	}
	p.leases = nil
}

// Covered reports whether any rule covered the request.
func (p *Outcome) Covered() bool { return p.Decision.Policy != nil }

// Passes reports whether the request goes on (after Delay).
func (p *Outcome) Passes() bool { return !p.Covered() || p.Decision.Allowed }

// Plain reports an allowed request that holds nothing once it is decided:
// no in-flight slot, no delay or place in a shaper's queue, no adaptive
// rule waiting for its answer and no charge after its response. It is
// passed on with its headers alone, so an adapter needs nothing of the
// outcome after that and may keep it on the stack: a request that is not
// Plain moves its outcome to the heap once (0.7 KB).
func (p *Outcome) Plain() bool {
	return p.Passes() && p.Delay == 0 && len(p.leases) == 0 && len(p.shaped) == 0 &&
		p.watched == 0 && len(p.extra) == 0 && len(p.charges) == 0
}

// Watching reports whether an adaptive rule waits to hear how the upstream
// answered (see Observe).
func (p *Outcome) Watching() bool { return p.watched > 0 }

// Observe reports the upstream's answer to the adaptive rules that let the
// request through: its status (0 for no answer) and how long it took.
func (p *Outcome) Observe(status int, took time.Duration) {
	for _, a := range p.watching[:p.watched] {
		a.Observe(status, took)
	}
	for _, a := range p.extra {
		a.Observe(status, took)
	}
}

// Headers calls set for every rate-limit header the outcome's response
// carries (none when no rule covered the request).
func (g *Gate) Headers(p *Outcome, set func(name, value string)) {
	if p.Covered() {
		g.render.Render(&p.Decision, set)
	}
}

// WriteHeaders sets the outcome's rate-limit headers on h.
func (g *Gate) WriteHeaders(h http.Header, p *Outcome) {
	if p.Covered() {
		g.render.Write(h, &p.Decision)
	}
}

// Hold waits d, the outcome's Delay, or until ctx ends (the client left), and
// reports whether the whole d passed.
func Hold(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
