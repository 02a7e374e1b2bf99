package config_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
)

// TestAdaptivePolicyTellsItsControllerWhetherItIsPaced: the controller of
// an adaptive policy whose limits all let requests through at a rate reads
// a capacity from a measurement's drain (adaptive.Options.Paced); one with
// an in_flight limit among them does not.
func TestAdaptivePolicyTellsItsControllerWhetherItIsPaced(t *testing.T) {
	for _, tc := range []struct {
		algorithms []string
		paced      bool
	}{
		{[]string{"gcra"}, true},
		{[]string{"token_bucket", "gcra"}, true},
		{[]string{"in_flight"}, false},
		{[]string{"gcra", "in_flight"}, false},
	} {
		s := config.Policy{Name: "paced", Adaptive: &config.Adaptive{}}
		for _, a := range tc.algorithms {
			s.Limits = append(s.Limits, config.Limit{Count: 100, Window: algo.Duration(time.Second), Algorithm: a})
		}
		c, err := config.Compile(config.Setup{Owner: t.Name(), Policies: []*config.Policy{&s}})
		if err != nil {
			t.Fatalf("%v: %v", tc.algorithms, err)
		}
		if got := c.Policies[0].Policy.Adaptive().Options().Paced; got != tc.paced {
			t.Errorf("%v: Options.Paced %v, want %v", tc.algorithms, got, tc.paced)
		}
		c.Release()
	}
}
