package main

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/core/adaptive"
)

// TestTargets is the benchmark's short form (make test runs it): every
// scenario through both controllers over three seeds, on the virtual
// clock, so the figures are the same on any machine. The default
// controller must meet the targets on average — goodput ≥ 0.9 C, failing ≤
// 5%, p99 ≤ 2× the unloaded latency, settled within 3 s, the configured
// limit back within 10 s of the load stopping — the rate-window upstream,
// whose refusals remember the second before, included; and it must fail
// less than AIMD wherever AIMD fails. Where the gateway
// itself pauses (gateway-pause), neither controller may read its pauses
// as the upstream's latency: the factor stays ≥ 0.8 (p99 is not judged
// there: a paused gateway delays its clients' answers itself). With a
// reserve of a fifth of the limit for the critical fifth of the load
// (priority-reserve), at least 95% of the critical requests are served.
func TestTargets(t *testing.T) {
	out := measure(3)
	for i := 0; i+1 < len(out); i += 2 {
		grad, aimd := out[i], out[i+1]
		if grad.options.Controller != adaptive.ControllerGradient || aimd.options.Controller != adaptive.ControllerAIMD {
			t.Fatalf("outcome %d: controllers %s and %s, want gradient then aimd", i, grad.options.Controller, aimd.options.Controller)
		}
		name := grad.scenario.name + "/" + string(grad.limit)
		mean := func(oc outcome, v func(figures) float64) float64 { m, _, _ := spread(oc.figures, v); return m }
		goodput := mean(grad, func(f figures) float64 { return f.goodput })
		failing := mean(grad, func(f figures) float64 { return f.failing })
		p99 := mean(grad, func(f figures) float64 { return f.p99 })
		settle := time.Duration(mean(grad, func(f figures) float64 { return float64(f.settle) }))
		t.Logf("%s: goodput %.2fC, %.1f%% failing, p99 %.2f× unloaded, settled in %s", name, goodput, 100*failing, p99, settle)
		if goodput < 0.9 {
			t.Errorf("%s: goodput %.2fC, want ≥ 0.9C", name, goodput)
		}
		if aimdFailing := mean(aimd, func(f figures) float64 { return f.failing }); aimdFailing > 0 && failing >= aimdFailing {
			t.Errorf("%s: %.1f%% failing, no fewer than AIMD's %.1f%%", name, 100*failing, 100*aimdFailing)
		}
		if failing > 0.05 {
			t.Errorf("%s: %.1f%% failing, want ≤ 5%%", name, 100*failing)
		}
		if len(grad.scenario.pauses) > 0 {
			for _, oc := range []outcome{grad, aimd} {
				if _, lowest, _ := spread(oc.figures, func(f figures) float64 { return f.lowest }); lowest < 0.8 {
					t.Errorf("%s, %s: the gateway's own pauses cut the factor to %.2f, want ≥ 0.8", name, oc.options.Controller, lowest)
				}
			}
		} else if grad.scenario.upstream == queueing && p99 > 2 {
			t.Errorf("%s: p99 %.2f× the unloaded latency, want ≤ 2×", name, p99)
		}
		if settle > 3*time.Second {
			t.Errorf("%s: settled in %s, want ≤ 3s", name, settle)
		}
		if grad.scenario.reserve > 0 {
			// The critical fifth of 3C keeps at least 95% of what it asks
			// while the rest is shed (the upstream still refuses some).
			if critical := mean(grad, func(f figures) float64 { return f.critical }); critical < 0.95 {
				t.Errorf("%s: %.2f of the critical requests served, want ≥ 0.95", name, critical)
			}
		}
		if grad.scenario.recovery {
			for _, f := range grad.figures {
				if f.recovery < 0 || f.recovery > 10*time.Second {
					t.Errorf("%s: the configured limit back %s after the load stopped, want ≤ 10s", name, f.recovery)
				}
			}
		}
	}
}

// TestFleetTargets holds the fleet scenarios (two and three nodes sharing
// the limit and the adaptive state, as through Redis) to the targets in
// every one of ten seeds, not on average, at C = 100/s: the counts of
// caddymodule's fleet tests, whose 500 ms intervals hold about 50 answers.
// Each seed's worst 4 s span (the last 4 s of 10 s, as those tests judge,
// and every 4 s after) must fail at most 5%, its goodput be at least
// 0.9 C and its settle at most 3 s. Where both nodes pause (fleet-pause),
// nothing is congested, and the factor must stay ≥ 0.8 in every seed.
func TestFleetTargets(t *testing.T) {
	defer func(c float64) { capacity = c }(capacity)
	capacity = 100
	for _, scn := range scenarios() {
		if scn.nodes < 2 {
			continue
		}
		for seed := uint64(1); seed <= 10; seed++ {
			f := simulate(scn, adaptive.Options{Controller: adaptive.ControllerGradient}, seed).figures()
			if len(scn.pauses) > 0 {
				// Nothing congested: only the gateway's own pauses could cut.
				t.Logf("%s seed %d: lowest factor %.2f", scn.name, seed, f.lowest)
				if f.lowest < 0.8 {
					t.Errorf("%s seed %d: the gateways' own pauses cut the fleet's factor to %.2f, want ≥ 0.8", scn.name, seed, f.lowest)
				}
				continue
			}
			t.Logf("%s seed %d: goodput %.2fC, %.1f%% failing, worst 4 s %.1f%%, settled in %s", scn.name, seed, f.goodput, 100*f.failing, 100*f.worst4s, f.settle)
			if f.goodput < 0.9 || f.failing > 0.05 || f.worst4s > 0.05 || f.settle > 3*time.Second {
				t.Errorf("%s seed %d: goodput %.2fC, %.1f%% failing, worst 4 s %.1f%%, settled in %s; want ≥ 0.9C, ≤ 5%%, ≤ 5%%, ≤ 3s",
					scn.name, seed, f.goodput, 100*f.failing, 100*f.worst4s, f.settle)
			}
		}
	}
}
