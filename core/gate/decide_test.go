package gate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/memory"
)

// TestDecideEmptyKeys: a request without its key is keyed by the client's
// address (EmptyKeyClient, the default), counted in the shared
// bucket (EmptyKeyShared, or EmptyKeyClient without an address), or let
// through the rule (EmptyKeySkip); a long key is bounded once, as the
// store holds it, and the outcome names it so.
func TestDecideEmptyKeys(t *testing.T) {
	store := memory.MustNew(memory.Options{Clock: &core.ManualClock{Micros: 1_700_000_040_000_000}})
	rule := func(name string, empty EmptyKey) Rule {
		p := core.MustPolicy(name, core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Minute, Algorithm: algo.FixedWindow})
		return Rule{Limiter: core.NewLimiter(p, store), EmptyKey: empty}
	}
	for _, tc := range []struct {
		empty   EmptyKey
		in      SameInput
		wantKey string
		covered bool
	}{
		{EmptyKeyClient, SameInput{Covered: true, Empty: true, Key: "shared", Client: "203.0.113.7", Cost: 1}, "203.0.113.7", true},
		{EmptyKeyClient, SameInput{Covered: true, Empty: true, Key: "shared", Cost: 1}, "shared", true},
		{EmptyKeyShared, SameInput{Covered: true, Empty: true, Key: "shared", Client: "203.0.113.7", Cost: 1}, "shared", true},
		{EmptyKeySkip, SameInput{Covered: true, Empty: true, Key: "shared", Client: "203.0.113.7", Cost: 1}, "", false},
		{EmptyKeySkip, SameInput{Covered: true, Key: strings.Repeat("k", 200), Cost: 1}, core.BoundKey(strings.Repeat("k", 200)), true},
	} {
		g, err := New(Config{Rules: []Rule{rule(tc.empty.String()+tc.wantKey, tc.empty)}})
		if err != nil {
			t.Fatal(err)
		}
		var passed []bool
		for range 3 {
			var o Outcome
			in := tc.in
			if err := g.Decide(context.Background(), &in, &o); err != nil {
				t.Fatal(err)
			}
			if o.Covered() != tc.covered || tc.covered && o.Key != tc.wantKey {
				t.Fatalf("%v %+v: covered %v key %q, want covered %v key %q", tc.empty, tc.in, o.Covered(), o.Key, tc.covered, tc.wantKey)
			}
			passed = append(passed, o.Passes())
		}
		if want := []bool{true, true, !tc.covered}; passed[2] != want[2] || !passed[0] || !passed[1] {
			t.Errorf("%v %+v: passes %v, want %v (2 a minute)", tc.empty, tc.in, passed, want)
		}
	}
}

// TestDecideFirstDenialEndsThePipeline: rules are decided in order; the
// first denial is the outcome and the rules after it are not decided.
func TestDecideFirstDenialEndsThePipeline(t *testing.T) {
	store := memory.MustNew(memory.Options{Clock: &core.ManualClock{Micros: 1_700_000_040_000_000}})
	tight := core.MustPolicy("tight", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Minute, Algorithm: algo.FixedWindow})
	wide := core.MustPolicy("wide", core.PolicyOptions{}, algo.Limit{Count: 100, Window: time.Minute, Algorithm: algo.FixedWindow})
	g, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(tight, store)}, {Limiter: core.NewLimiter(wide, store)}}})
	if err != nil {
		t.Fatal(err)
	}
	in := SameInput{Covered: true, Key: "k", Cost: 1}
	for i, want := range []bool{true, false, false} {
		var o Outcome
		if err := g.Decide(context.Background(), &in, &o); err != nil {
			t.Fatal(err)
		}
		if o.Passes() != want || !want && o.Decision.Policy != tight {
			t.Fatalf("request %d: passes %v by %v, want %v (the tight rule denies)", i+1, o.Passes(), o.Decision.Policy.Name(), want)
		}
	}
	var d core.Decision
	if err := core.NewLimiter(wide, store).Inspect(context.Background(), wide, "k", &d); err != nil || d.Remaining != 99 {
		t.Errorf("the wide rule after 1 allowed and 2 denied requests: %d remaining, %v; want 99 (denied requests never reach it)", d.Remaining, err)
	}
}
