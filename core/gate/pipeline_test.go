package gate

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/store/memory"
)

// The gate through its own API, at the depth its adapters' tests reach it:
// what a later rule's denial gives back, how a failed store ends or skips
// the pipeline, what the headers say, how a plan and a priority choose
// limits, how the adaptive rules hear the upstream, and what a charge
// leaves for the next request.

// memoryAt is a memory store on a clock set to t0 (µs since the epoch).
func memoryAt(t *testing.T) (*memory.Store, *core.ManualClock) {
	t.Helper()
	clock := &core.ManualClock{Micros: 1_700_000_040_000_000}
	return memory.MustNew(memory.Options{Clock: clock}), clock
}

// decide runs g on in and returns the outcome.
func decide(t *testing.T, g *Gate, in SameInput) *Outcome {
	t.Helper()
	var o Outcome
	if err := g.Decide(context.Background(), &in, &o); err != nil {
		t.Fatal(err)
	}
	return &o
}

// TestLaterDenialGivesBackEarlierSlots: a request an in-flight rule let in
// and a later rule denied holds no slot and no place in a shaper's queue:
// both go back at once, so the next request of the key finds them free.
func TestLaterDenialGivesBackEarlierSlots(t *testing.T) {
	store, _ := memoryAt(t)
	slots := core.MustPolicy("slots", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Minute, Algorithm: algo.InFlight})
	shaper := core.MustPolicy("shaper", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second, Algorithm: algo.LeakyBucket, MaxDelay: 10 * time.Second})
	door := core.MustPolicy("door", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Hour, Algorithm: algo.FixedWindow})
	g, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(slots, store)}, {Limiter: core.NewLimiter(shaper, store)}, {Limiter: core.NewLimiter(door, store)}}})
	if err != nil {
		t.Fatal(err)
	}
	in := SameInput{Covered: true, Key: "k", Cost: 1}
	first := decide(t, g, in)
	if !first.Passes() || !first.HoldsLeases() {
		t.Fatalf("first request: passes %v, holds a slot %v", first.Passes(), first.HoldsLeases())
	}
	first.HoldLeases(0)() // served: its slot goes back
	for i := range 3 {
		o := decide(t, g, in)
		if o.Passes() || o.Decision.Policy != door || o.HoldsLeases() || o.Delay != 0 {
			t.Fatalf("request %d after the door's hour was used: passes %v by %q, holds a slot %v, delay %v; want the door's denial holding nothing", i+2, o.Passes(), o.Decision.Policy.Name(), o.HoldsLeases(), o.Delay)
		}
	}
	var d core.Decision
	if err := core.NewLimiter(slots, store).Inspect(context.Background(), slots, "k", &d); err != nil || d.Remaining != 1 {
		t.Errorf("the in-flight rule after three denials by a later rule: %d slots free, %v; want 1 (each slot given back)", d.Remaining, err)
	}
	if err := core.NewLimiter(shaper, store).Inspect(context.Background(), shaper, "k", &d); err != nil || d.Delay > time.Second {
		t.Errorf("the shaper after three denials by a later rule: a next request waits %v, %v; want at most the first request's second (the denied ones' places given back)", d.Delay, err)
	}
}

// failing is a store that cannot decide.
type failing struct{ core.Store }

var errDown = errors.New("store down")

func (failing) Decide(context.Context, *core.Policy, string, int64, *core.Decision) error {
	return errDown
}

// TestStoreFailureEndsOrSkips: a rule whose store fails ends the pipeline
// with a *StoreError naming its policy, unless the gate skips failed rules:
// then the rules after it still decide.
func TestStoreFailureEndsOrSkips(t *testing.T) {
	store, _ := memoryAt(t)
	broken := core.MustPolicy("broken", core.PolicyOptions{}, algo.Limit{Count: 5, Window: time.Minute})
	after := core.MustPolicy("after", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Minute, Algorithm: algo.FixedWindow})
	rules := []Rule{{Limiter: core.NewLimiter(broken, failing{store})}, {Limiter: core.NewLimiter(after, store)}}
	in := SameInput{Covered: true, Key: "k", Cost: 1}

	strict, err := New(Config{Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	var o Outcome
	err = strict.Decide(context.Background(), &in, &o)
	var se *StoreError
	if !errors.As(err, &se) || se.Policy != "broken" || !errors.Is(err, errDown) {
		t.Fatalf("a failed store: %v, want a *StoreError of policy broken wrapping the store's error", err)
	}

	skipping, err := New(Config{Rules: rules, SkipFailed: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		o := decide(t, skipping, in)
		if o.Passes() != want || o.Decision.Policy != after {
			t.Errorf("request %d skipping the failed rule: passes %v by %v, want %v by the rule after it", i+1, o.Passes(), o.Decision.Policy, want)
		}
	}
}

// TestHeadersShowTheMostRestrictive: the outcome's headers are those of
// the most restrictive rule that covered the request, in the gate's
// style; a request no rule covered carries none; a denial carries
// Retry-After.
func TestHeadersShowTheMostRestrictive(t *testing.T) {
	store, _ := memoryAt(t)
	wide := core.MustPolicy("wide", core.PolicyOptions{}, algo.Limit{Count: 100, Window: time.Minute, Algorithm: algo.FixedWindow})
	tight := core.MustPolicy("tight", core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Minute, Algorithm: algo.FixedWindow})
	g, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(wide, store)}, {Limiter: core.NewLimiter(tight, store)}},
		Headers: headers.Options{Style: headers.XRateLimit}})
	if err != nil {
		t.Fatal(err)
	}
	in := SameInput{Covered: true, Key: "k", Cost: 1}
	for i, want := range []http.Header{
		{"X-Ratelimit-Limit": {"2"}, "X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"60"}},
		{"X-Ratelimit-Limit": {"2"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"60"}},
		{"X-Ratelimit-Limit": {"2"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"60"}, "Retry-After": {"60"}},
	} {
		o := decide(t, g, in)
		h := http.Header{}
		g.WriteHeaders(h, o)
		if len(h) != len(want) {
			t.Fatalf("request %d: headers %v, want %v", i+1, h, want)
		}
		for name := range want {
			if h.Get(name) != want.Get(name) {
				t.Errorf("request %d: %s %q, want %q (all: %v)", i+1, name, h.Get(name), want.Get(name), h)
			}
		}
	}
	none := decide(t, g, SameInput{Key: "k", Cost: 1})
	g.Headers(none, func(name, value string) { t.Errorf("a request no rule covered: header %s: %s", name, value) })
}

// TestFamilyChoosesPlanAndPriority: a rule with plans and a reserve takes
// the limits of the request's plan (the default for an unknown one,
// nothing counted for an unlimited one) and, below the reserve's priority,
// leaves the reserved share to the requests at or above it.
func TestFamilyChoosesPlanAndPriority(t *testing.T) {
	store, _ := memoryAt(t)
	minute := func(n int64) algo.Limit {
		return algo.Limit{Count: n, Window: time.Minute, Algorithm: algo.FixedWindow}
	}
	free := core.MustPolicy("api", core.PolicyOptions{Plan: "free"}, minute(5))
	pro := core.MustPolicy("api", core.PolicyOptions{Plan: "pro"}, minute(10))
	family, err := core.NewPlans([]core.Plan{{Name: "free", Policy: free}, {Name: "pro", Policy: pro}, {Name: "staff"}}, "free", &core.Reserve{Share: 0.4, Level: 1})
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(family.Policy(), store), Family: family}}})
	if err != nil {
		t.Fatal(err)
	}
	count := func(key, plan string, priority int) (passed int) {
		for range 20 {
			if decide(t, g, SameInput{Covered: true, Key: key, Cost: 1, Plan: plan, Priority: priority}).Passes() {
				passed++
			}
		}
		return passed
	}
	for _, tc := range []struct {
		key, plan string
		priority  int
		want      int
	}{
		{"a", "free", 0, 3},   // 5 less the reserved 40%
		{"a", "free", 1, 2},   // the reserve: what is left of the 5
		{"b", "pro", 1, 10},   // pro's 10, reserve included
		{"c", "gold", 0, 3},   // unknown: the default plan, free
		{"d", "staff", 0, 20}, // unlimited: nothing counted
	} {
		if got := count(tc.key, tc.plan, tc.priority); got != tc.want {
			t.Errorf("key %s plan %q priority %d: %d of 20 passed, want %d", tc.key, tc.plan, tc.priority, got, tc.want)
		}
	}
}

// TestAdaptiveRuleHearsTheUpstream: an adaptive rule that let a request
// through hears how the upstream answered; one that denied it hears
// nothing of it but the denial; failing answers shrink its limit.
func TestAdaptiveRuleHearsTheUpstream(t *testing.T) {
	store, _ := memoryAt(t)
	a, err := adaptive.NewJudged(adaptive.Options{Controller: adaptive.ControllerAIMD, MinFactor: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	p := core.MustPolicy("adapt", core.PolicyOptions{Adaptive: a}, algo.Limit{Count: 100, Window: time.Second, Algorithm: algo.GCRA, Burst: 100})
	g, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store)}}})
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		o := decide(t, g, SameInput{Covered: true, Key: "k", Cost: 1})
		if !o.Watching() {
			t.Fatal("an adaptive rule let a request through and does not wait to hear the upstream")
		}
		o.Observe(http.StatusServiceUnavailable, time.Millisecond)
	}
	a.Judge()
	if f := a.Factor(); f >= 1 {
		t.Errorf("after 50 answers of 503: factor %v, want the limit shrunk", f)
	}
	if n := p.Limits()[0].Count; n >= 100 {
		t.Errorf("after 50 answers of 503: count %d in force, want below 100", n)
	}
}

// TestChargeOverdrawsOnceAndRefusesNext: a request admitted with a unit
// left is charged its whole response cost, however far it overdraws; the
// next request is refused, with the Retry-After of the overdrawn limit,
// until the window gives back.
func TestChargeOverdrawsOnceAndRefusesNext(t *testing.T) {
	store, clock := memoryAt(t)
	l := algo.Limit{Count: 100, Window: time.Minute, Algorithm: algo.FixedWindow, AfterResponse: true}
	p := core.MustPolicy("tokens", core.PolicyOptions{}, l)
	g, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store), Charge: &ResponseCost{CostHeader: "X-Tokens"}}}})
	if err != nil {
		t.Fatal(err)
	}
	in := SameInput{Covered: true, Key: "k", Cost: 1}
	for i, tokens := range []string{"60", "90"} {
		o := decide(t, g, in)
		if !o.Passes() || !o.Charges() {
			t.Fatalf("request %d: passes %v, charges %v; want admitted with units left", i+1, o.Passes(), o.Charges())
		}
		if err := o.Charge(context.Background(), http.StatusOK, func(string) string { return tokens }); err != nil {
			t.Fatal(err)
		}
		if want := max(0, 100-60-int64(i)*90); o.Decision.Remaining != want || !o.Decision.Allowed {
			t.Errorf("request %d charged %s: remaining %d allowed %v, want %d and allowed (its answer is on its way)", i+1, tokens, o.Decision.Remaining, o.Decision.Allowed, want)
		}
	}
	refused := decide(t, g, in)
	if refused.Passes() || refused.Decision.RetryAfter <= 0 || refused.Charges() {
		t.Fatalf("after an overdraw of 50: passes %v, retry after %v; want refused until the window gives back", refused.Passes(), refused.Decision.RetryAfter)
	}
	clock.Micros += int64(time.Minute / time.Microsecond)
	if !decide(t, g, in).Passes() {
		t.Error("a minute later: refused, want the window given back")
	}
}

// TestPlainOnlyWhenNothingIsHeld: an outcome is Plain (its adapter may
// pass the request on and forget it) only when the request was allowed
// and holds nothing: not an in-flight slot, a shaper's delay, a charge
// after its response, nor a denial.
func TestPlainOnlyWhenNothingIsHeld(t *testing.T) {
	store, _ := memoryAt(t)
	for _, tc := range []struct {
		name   string
		limit  algo.Limit
		charge *ResponseCost
		plain  []bool
	}{
		{"fixed_window", algo.Limit{Count: 1, Window: time.Minute, Algorithm: algo.FixedWindow}, nil, []bool{true, false}},
		{"in_flight", algo.Limit{Count: 5, Window: time.Minute, Algorithm: algo.InFlight}, nil, []bool{false, false}},
		{"shaper", algo.Limit{Count: 1, Window: time.Minute, Algorithm: algo.LeakyBucket, MaxDelay: time.Hour}, nil, []bool{true, false}},
		{"charged", algo.Limit{Count: 100, Window: time.Minute, Algorithm: algo.FixedWindow, AfterResponse: true}, &ResponseCost{CostHeader: "X-Tokens"}, []bool{false, false}},
	} {
		p := core.MustPolicy(tc.name, core.PolicyOptions{}, tc.limit)
		g, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store), Charge: tc.charge}}})
		if err != nil {
			t.Fatal(err)
		}
		var got []bool
		for range tc.plain {
			o := decide(t, g, SameInput{Covered: true, Key: "k", Cost: 1})
			got = append(got, o.Plain())
		}
		if !slices.Equal(got, tc.plain) {
			t.Errorf("%s: Plain %v over two requests, want %v", tc.name, got, tc.plain)
		}
	}
}
