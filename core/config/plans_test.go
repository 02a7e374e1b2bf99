package config_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/store/memory"
)

func planSpec() config.Policy {
	return config.Policy{Name: "api", DefaultPlan: "free", Plans: []config.Plan{
		{Name: "free", Limits: []config.Limit{{Count: 2, Window: algo.Duration(time.Minute), Algorithm: "fixed_window"}}},
		{Name: "pro", Limits: []config.Limit{{Count: 5, Window: algo.Duration(time.Minute), Algorithm: "fixed_window"}}},
		{Name: "internal", Unlimited: true},
	}}
}

// TestPlansChooseLimitsPerRequest: each plan value gets its plan's limits
// exactly, an unknown or empty value the default plan's, an unlimited plan
// nothing counted; a key moved from free to pro keeps what it used; the
// headers and the decision's fields name the plan in force.
func TestPlansChooseLimitsPerRequest(t *testing.T) {
	ps := planSpec()
	c, err := config.Compile(config.Setup{Owner: "test", Policies: []*config.Policy{&ps}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	p := c.Policies[0].Policy
	clock := &core.ManualClock{Micros: 1_700_006_400_000_000}
	store, err := memory.New(memory.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{Rules: []gate.Rule{{Limiter: core.NewLimiter(p, store), Family: c.Policies[0].Family}},
		Headers: headers.Options{Style: headers.IETF}})
	if err != nil {
		t.Fatal(err)
	}
	decide := func(key, plan string) (gate.Outcome, map[string]string) {
		t.Helper()
		var out gate.Outcome
		in := gate.SameInput{Covered: true, Key: key, Cost: 1, Plan: plan}
		if err := g.Decide(context.Background(), &in, &out); err != nil {
			t.Fatal(err)
		}
		h := map[string]string{}
		g.Headers(&out, func(name, value string) { h[name] = value })
		return out, h
	}
	var got []string
	for _, step := range []struct{ key, plan string }{
		{"a", "free"}, {"a", "free"}, {"a", "free"}, // 2/1m
		{"b", "pro"}, {"b", "pro"}, {"b", "pro"}, {"b", "pro"}, {"b", "pro"}, {"b", "pro"}, // 5/1m
		{"c", ""}, {"c", "gold"}, {"c", "free"}, // the default plan
		{"d", "internal"}, {"d", "internal"}, {"d", "internal"}, // unlimited
		{"a", "pro"}, {"a", "pro"}, {"a", "pro"}, {"a", "pro"}, // a's 2 used count against pro's 5
	} {
		plan, _ := decide(step.key, step.plan)
		switch {
		case !plan.Covered():
			got = append(got, "-")
		case plan.Passes():
			got = append(got, "y")
		default:
			got = append(got, "n")
		}
	}
	want := "y y n y y y y y n y y n - - - y y y n"
	if strings.Join(got, " ") != want {
		t.Errorf("decisions\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	plan, h := decide("e", "pro")
	if h["Ratelimit-Policy"] != `"api-pro";q=5;w=60` {
		t.Errorf("headers %v", h)
	}
	if v, _ := plan.Decision.Fields().Field(core.FieldPlan); v != "pro" {
		t.Errorf("plan field %v, want pro", v)
	}
	if _, h := decide("e", "nope"); h["Ratelimit-Policy"] != `"api-free";q=2;w=60` {
		t.Errorf("an unknown plan's headers %v, want the default plan's", h)
	}
}

func TestPlanSpecErrorsNameTheFault(t *testing.T) {
	for _, tc := range []struct {
		edit func(*config.Policy)
		want string
	}{
		{func(s *config.Policy) { s.Limits = s.Plans[0].Limits }, `policy "api": limits and plans: give one or the other`},
		{func(s *config.Policy) { s.DefaultPlan = "" }, `policy "api" default_plan: missing`},
		{func(s *config.Policy) { s.DefaultPlan = "gold" }, `policy "api" default_plan: "gold" is not one of its plans`},
		{func(s *config.Policy) { s.Plans[1].Name = "free" }, `policy "api" plan "free": named twice`},
		{func(s *config.Policy) { s.Plans[1].Name = "" }, `policy "api" plans: a plan without a name`},
		{func(s *config.Policy) { s.Plans[2].Unlimited = false }, `policy "api" plan "internal": needs at least one limit, or unlimited`},
		{func(s *config.Policy) { s.Plans[0].Unlimited = true }, `policy "api" plan "free": unlimited and limits`},
		{func(s *config.Policy) { s.Plans[1].Limits[0].Window = algo.Duration(time.Hour) }, `plan "pro": limits of other windows or algorithms than plan "free"'s`},
		{func(s *config.Policy) { s.Plans[1].Limits[0].Count = 0 }, `plan "pro": policy "api" limit 1: count`},
		{func(s *config.Policy) { s.Plans[0].Unlimited, s.Plans[0].Limits, s.Plans = true, nil, s.Plans[:1] }, `every plan is unlimited`},
		{func(s *config.Policy) {
			s.Plans, s.Limits = nil, []config.Limit{{Count: 1, Window: algo.Duration(time.Second)}}
		}, `policy "api": plan and default_plan need plans`},
	} {
		ps := planSpec()
		// Each case edits its own copy of the plans.
		ps.Plans = append([]config.Plan(nil), ps.Plans...)
		for i := range ps.Plans {
			ps.Plans[i].Limits = append([]config.Limit(nil), ps.Plans[i].Limits...)
		}
		tc.edit(&ps)
		_, err := config.Compile(config.Setup{Owner: "test", Policies: []*config.Policy{&ps}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}

// TestReserveShareInOneWording: a reserve's share outside (0, 1) is
// refused in core's one wording, whether written in a spec (where a share
// of 0 is written, not absent) or given to core.NewFamily.
func TestReserveShareInOneWording(t *testing.T) {
	for _, share := range []float64{0, 1, 1.5, -0.2} {
		s := config.Policy{Name: "api", Limits: []config.Limit{{Count: 10, Window: algo.Duration(time.Minute)}}, Reserve: &config.Reserve{Share: share}}
		_, err := config.Compile(config.Setup{Owner: "test", Policies: []*config.Policy{&s}})
		want := fmt.Sprintf(`policy "api" reserve: a share of %g must be between 0 and 1, both excluded`, share)
		if err == nil || err.Error() != want {
			t.Errorf("spec share %g: %v, want %q", share, err, want)
		}
		if share == 0 {
			continue // the zero core.Reserve is no reserve
		}
		_, err = core.NewFamily(core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Minute}), &core.Reserve{Share: share, Level: 1})
		if err == nil || err.Error() != want {
			t.Errorf("core.NewFamily share %g: %v, want %q", share, err, want)
		}
	}
}
