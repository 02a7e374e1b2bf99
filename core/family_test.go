package core

import (
	"math"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core/algo"
)

// TestFamilyChoosesAroundOnePolicy: a request takes its plan's policy (the
// default plan's for a value naming none, nothing for an unlimited plan),
// below the reserve when its priority is under the reserve's level; the
// charging twin is each plan's own and charges the same counters; every
// policy a decision may name is in All, once.
func TestFamilyChoosesAroundOnePolicy(t *testing.T) {
	charged := algo.Limit{Count: 10, Window: time.Minute, Algorithm: algo.FixedWindow, AfterResponse: true}
	free := MustPolicy("api", PolicyOptions{Plan: "free"}, charged)
	charged.Count = 100
	pro := MustPolicy("api", PolicyOptions{Plan: "pro"}, charged)
	f, err := NewPlans([]Plan{{"free", free}, {"pro", pro}, {"internal", nil}}, "free", &Reserve{Share: 0.2, Level: 1})
	if err != nil {
		t.Fatal(err)
	}
	if f.Policy() != free || len(f.Plans()) != 2 || f.Plans()[1] != pro || pro.PlanIndex() != 1 {
		t.Fatalf("policy %v, plans %v, pro's index %d", f.Policy().Plan(), f.Plans(), pro.PlanIndex())
	}
	for _, tc := range []struct {
		plan     string
		priority int
		want     *Policy
		limited  bool
		count    int64
	}{
		{"pro", 1, pro, true, 100},
		{"pro", math.MaxInt, pro, true, 100},
		{"gold", 1, free, true, 10}, // unknown: the default plan
		{"", 5, free, true, 10},
		{"internal", 1, nil, false, 0},
	} {
		got, limited := f.For(tc.plan, tc.priority)
		if got != tc.want || limited != tc.limited || got != nil && got.Limits()[0].Count != tc.count {
			t.Errorf("plan %q priority %d: %v %v, want %v %v", tc.plan, tc.priority, got, limited, tc.want, tc.limited)
		}
	}
	below, level := f.Below(pro)
	if got, _ := f.For("pro", 0); got != below || level != 1 || below.Limits()[0].Count != 80 || below.StoreSide().Scope() != pro.StoreSide().Scope() {
		t.Errorf("pro below its reserve: %v (level %d), want the policy of 80 on pro's counters", got, level)
	}
	twin := f.Charging(pro)
	if twin == nil || f.Charging(below) != twin || f.Charging(free) == twin || !twin.StoreSide().ChargesAfterResponse() ||
		twin.StoreSide().Scope() != pro.StoreSide().Scope() || twin.PlanIndex() != 1 || f.Charging(twin) != nil {
		t.Errorf("pro's charging twin %v: shared with its policy below the reserve, its own, on its counters", twin)
	}
	seen := map[*Policy]bool{}
	for _, p := range f.All() {
		if seen[p] {
			t.Errorf("All names %v twice", p)
		}
		seen[p] = true
	}
	if len(seen) != 6 {
		t.Errorf("All: %d policies, want 6 (2 plans, each with a policy below the reserve and a charging twin)", len(seen))
	}
	alone, err := NewFamily(MustPolicy("plain", PolicyOptions{}, algo.Limit{Count: 5, Window: time.Second}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := alone.For("anything", 0); !ok || p != alone.Policy() || alone.Names() != nil || alone.Charging(p) != nil {
		t.Errorf("a policy alone: %v %v, names %v", p, ok, alone.Names())
	}
}
