package config_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/core/openstore"
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
	c, err := config.Compile(t.Name(), openstore.Config{}, nil, plain, costly, charged)
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
// *PolicyError naming the policy's place, and gives back every adaptive
// controller the policies before it took: once the loaded config that
// shares one is released too, the next config starts a fresh controller.
func TestCompileRefusalNamesThePolicyAndHoldsNothing(t *testing.T) {
	adaptivePolicy := perMinute("adaptive", 100)
	adaptivePolicy.Adaptive = &config.Adaptive{}
	loaded, err := config.Compile(t.Name(), openstore.Config{}, nil, adaptivePolicy)
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
		policies []*config.Policy
		want     string
	}{
		{[]*config.Policy{adaptivePolicy, perMinute("refused", 5)}, "this store cannot decide it"},
		{[]*config.Policy{adaptivePolicy, perMinute("adaptive", 5)}, `policy "adaptive": name used twice`},
	} {
		c, err := config.Compile(t.Name(), openstore.Config{}, decidable, tc.policies...)
		var pe *config.PolicyError
		if c != nil || !errors.As(err, &pe) || pe.Index != 1 || err.Error() != tc.want {
			t.Fatalf("compiled %v, %v; want a *PolicyError at index 1 saying %q", c, err, tc.want)
		}
	}
	loaded.Release()
	loaded.Release() // a no-op
	again, err := config.Compile(t.Name(), openstore.Config{}, nil, adaptivePolicy)
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
	c, err := config.Compile(t.Name(), eventual, nil, counting)
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
		c, err := config.Compile(t.Name(), sc, adapter, perMinute("gcra", 5))
		var pe *config.PolicyError
		if c != nil || !errors.As(err, &pe) || pe.Index != 0 || err.Error() != tc.want {
			t.Errorf("mode setting %q: compiled %v, %v; want a *PolicyError at index 0 saying %q", tc.setting, c, err, tc.want)
		}
	}
	if adapterRan {
		t.Error("the adapter's check ran on a policy its store refused")
	}
}
