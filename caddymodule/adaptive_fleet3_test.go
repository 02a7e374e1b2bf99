package caddymodule_test

import "testing"

// TestCaddyAdaptiveFleetOfThreeFindsCapacity: the fleet test with three
// Caddies, each offered 100/s. It ran under make adaptive-fleet only until
// the fleet judged every node's interval at once (a read judges; see
// adaptive.Gradient): three race-built Caddies on two cores then missed
// even the test's margins in some runs (up to 21% failing).
func TestCaddyAdaptiveFleetOfThreeFindsCapacity(t *testing.T) {
	oneAdaptiveTestAtATime(t)
	fleetFindsCapacity(t, 3)
}
