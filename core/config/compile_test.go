package config_test

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
)

func perMinute(name string, count int64) *config.Policy {
	return &config.Policy{Name: name, Limits: []config.Limit{{Count: count, Window: algo.Duration(time.Minute), Algorithm: "gcra"}}}
}

// TestCompileBuildsWhatARequestNeeds: each compiled policy carries its
// empty-key handling, the units a request takes (1 when unset) and what a
// response charges (nil when its limits are charged as requests arrive),
// in the order given.
func TestCompileBuildsWhatARequestNeeds(t *testing.T) {
	plain := perMinute("plain", 10)
	costly := perMinute("costly", 10)
	costly.Cost, costly.EmptyKey = 3, "shared"
	charged := perMinute("charged", 10)
	one := int64(1)
	charged.Charge = &config.Charge{Status: []string{"401"}, Cost: &one}
	c, err := config.Compile(config.Setup{Owner: t.Name(), Policies: []*config.Policy{plain, costly, charged}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	var got []string
	for _, p := range c.Policies {
		got = append(got, fmt.Sprintf("%s cost %d empty %s charged %v", p.Policy.Name(), p.Cost, p.EmptyKey, p.Charge != nil))
	}
	want := "[plain cost 1 empty client charged false costly cost 3 empty shared charged false charged cost 1 empty client charged true]"
	if fmt.Sprint(got) != want {
		t.Errorf("compiled %v\nwant     %s", got, want)
	}
}

// TestCompileRefusalNamesThePolicyAndHoldsNothing: a policy the store
// cannot decide, or a name given twice, refuses the whole config with a
// *config.Error naming the policy's place, and gives back every adaptive
// controller the policies before it took: once the loaded config that
// shares one is released too, the next config starts a fresh controller.
func TestCompileRefusalNamesThePolicyAndHoldsNothing(t *testing.T) {
	adaptivePolicy := perMinute("adaptive", 100)
	adaptivePolicy.Adaptive = &config.Adaptive{}
	loaded, err := config.Compile(config.Setup{Owner: t.Name(), Policies: []*config.Policy{adaptivePolicy}})
	if err != nil {
		t.Fatal(err)
	}
	shared := loaded.Policies[0].Policy.Adaptive()

	refuse := errors.New("this store cannot decide it")
	decidable := func(p *core.Policy) error {
		if p.Name() == "refused" {
			return refuse
		}
		return nil
	}
	for _, tc := range []struct {
		policies    []*config.Policy
		field, want string
	}{
		{[]*config.Policy{adaptivePolicy, perMinute("refused", 5)}, "", "this store cannot decide it"},
		{[]*config.Policy{adaptivePolicy, perMinute("adaptive", 5)}, "name", `policy "adaptive": name used twice`},
	} {
		c, err := config.Compile(config.Setup{Owner: t.Name(), Check: decidable, Policies: tc.policies})
		var ce *config.Error
		if c != nil || !errors.As(err, &ce) || ce.Policy != 1 || ce.Field != tc.field || err.Error() != tc.want {
			t.Fatalf("compiled %v, %v; want a *config.Error at policy 1, field %q, saying %q", c, err, tc.field, tc.want)
		}
	}
	loaded.Release()
	loaded.Release() // a no-op
	again, err := config.Compile(config.Setup{Owner: t.Name(), Policies: []*config.Policy{adaptivePolicy}})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	if again.Policies[0].Policy.Adaptive() == shared {
		t.Error("a refused compile kept the adaptive controller it took: the next config shares the old one")
	}
}

// TestCompileChecksPoliciesAgainstTheirStore: the compiled config holds
// the store it was compiled for, and a policy that store cannot decide
// (eventual mode counts requests: gcra is refused, fixed_window taken) is
// refused at compile time, once, naming the setting that chose the mode
// when the adapter gives one; the adapter's own check runs after.
func TestCompileChecksPoliciesAgainstTheirStore(t *testing.T) {
	store := &config.Store{Type: "redis", Mode: "eventual"}
	store.URL = "redis://127.0.0.1:6379"
	eventual, err := store.Config()
	if err != nil {
		t.Fatal(err)
	}
	counting := &config.Policy{Name: "counting", Limits: []config.Limit{{Count: 5, Window: algo.Duration(time.Minute), Algorithm: "fixed_window"}}}
	c, err := config.Compile(config.Setup{Owner: t.Name(), StoreConfig: eventual, Policies: []*config.Policy{counting}})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Store.Eventual || c.Store.Redis == nil || c.Store.Redis.URL != "redis://127.0.0.1:6379" {
		t.Errorf("compiled for %+v, want the eventual Redis store it was given", c.Store)
	}
	c.Release()

	const refused = `policy "gcra" limit 1 (5/1m): eventual mode counts requests, so it needs fixed_window or sliding_counter, not gcra`
	adapterRan := false
	adapter := func(*core.Policy) error { adapterRan = true; return nil }
	for _, tc := range []struct {
		setting string
		want    string
	}{{"", refused}, {"sync_rate", "sync_rate: " + refused}} {
		sc := eventual
		sc.ModeSetting = tc.setting
		c, err := config.Compile(config.Setup{Owner: t.Name(), StoreConfig: sc, Check: adapter, Policies: []*config.Policy{perMinute("gcra", 5)}})
		var ce *config.Error
		if c != nil || !errors.As(err, &ce) || ce.Policy != 0 || err.Error() != tc.want {
			t.Errorf("mode setting %q: compiled %v, %v; want a *config.Error at policy 0 saying %q", tc.setting, c, err, tc.want)
		}
	}
	if adapterRan {
		t.Error("the adapter's check ran on a policy its store refused")
	}
}

// TestCompileErrorsSayTheField: an error of a policy's own says where in
// the policy it is, as a path in its JSON (an adapter maps it to where it
// was written), a plan's limits below the plan; the message is the check's.
func TestCompileErrorsSayTheField(t *testing.T) {
	minute := algo.Duration(time.Minute)
	ok := []config.Limit{{Count: 5, Window: minute}}
	negative := int64(-1)
	price, badPrice := 2.5, math.Inf(1)
	for _, tc := range []struct {
		policy config.Policy
		field  string
	}{
		{config.Policy{Name: " "}, "name"},
		{config.Policy{Name: "p"}, "limits"},
		{config.Policy{Name: "p", Limits: ok, Cost: -2}, "cost"},
		{config.Policy{Name: "p", Limits: ok, EmptyKey: "nobody"}, "empty_key"},
		{config.Policy{Name: "p", Limits: []config.Limit{{Count: 5, Window: minute}, {Count: 0, Window: minute, Algorithm: "gcra"}}}, "limits[1]"},
		{config.Policy{Name: "p", Limits: []config.Limit{{Count: 5, Window: minute}, {Count: 9, Window: minute}}}, "limits[1]"},
		{config.Policy{Name: "p", Limits: ok, Reserve: &config.Reserve{Share: 2}}, "reserve.share"},
		{config.Policy{Name: "p", Limits: ok, Priority: "{h}"}, "priority"},
		{config.Policy{Name: "p", Limits: ok, Charge: &config.Charge{Cost: &negative}}, "charge.cost"},
		{config.Policy{Name: "p", Limits: ok, Charge: &config.Charge{Status: []string{"99"}}}, "charge.status"},
		{config.Policy{Name: "p", Limits: ok, Charge: &config.Charge{Usage: "tokens"}}, "charge.usage"},
		{config.Policy{Name: "p", Limits: ok, Charge: &config.Charge{Usage: "total_tokens", CostHeader: "X-Cost"}}, "charge.usage"},
		{config.Policy{Name: "p", Limits: ok, Charge: &config.Charge{Usage: "cost"}}, "charge.usage"},
		{config.Policy{Name: "p", Limits: ok, Charge: &config.Charge{Usage: "total_tokens", InputCost: &price}}, "charge.input_cost"},
		{config.Policy{Name: "p", Limits: ok, Charge: &config.Charge{Usage: "cost", InputCost: &price, OutputCost: &badPrice}}, "charge.output_cost"},
		{config.Policy{Name: "p", Limits: ok, Penalty: &config.Penalty{}}, "penalty"},
		{config.Policy{Name: "p", Limits: ok, Adaptive: &config.Adaptive{Min: 2}}, "adaptive"},
		{config.Policy{Name: "p", Plans: []config.Plan{{Name: "a", Limits: ok}, {Name: "b", Limits: []config.Limit{{Count: -1, Window: minute}}}}, DefaultPlan: "a"}, "plans[1].limits[0]"},
		{config.Policy{Name: "p", Plans: []config.Plan{{Name: "a", Limits: ok}}, DefaultPlan: "z"}, "default_plan"},
	} {
		c, err := config.Compile(config.Setup{Owner: t.Name(), Policies: []*config.Policy{perMinute("first", 1), &tc.policy}})
		var ce *config.Error
		if c != nil || !errors.As(err, &ce) || ce.Policy != 1 || ce.Field != tc.field {
			t.Errorf("%+v: compiled %v, %#v; want a *config.Error at policy 1, field %q", tc.policy, c, ce, tc.field)
		}
	}
}
