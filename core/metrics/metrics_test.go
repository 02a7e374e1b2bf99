package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/openstore"
)

// TestSeriesCountDecisions: each decision lands in decisions_total under
// its policy, deciding limit and result; a store's error in
// store_errors_total; the top-denied keys in tollgate_top_denied, hashed;
// no series carries a request key but that one. Closing the set takes its
// gate out of the shared collector.
func TestSeriesCountDecisions(t *testing.T) {
	h, err := openstore.Acquire(openstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Name: "minute", Count: 2, Window: time.Minute, Algorithm: algo.FixedWindow})
	rule := h.Rule(p, gate.EmptyKeySkip, "")
	g, err := gate.New(gate.Config{Rules: []gate.Rule{rule}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	set, err := New(reg, g, h)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		in := gate.SameInput{Covered: true, Key: "acme", Cost: 1}
		var o gate.Outcome
		if err := g.Decide(context.Background(), &in, &o); err != nil {
			t.Fatal(err)
		}
		set.Observe(0, &o.Decision, nil, time.Millisecond)
	}
	set.Observe(0, nil, errors.New("store down"), time.Millisecond)
	want := `
# HELP tollgate_decisions_total Rate-limit decisions by policy, plan (empty without plans), deciding limit and result (allowed, denied, shadowed, delayed).
# TYPE tollgate_decisions_total counter
tollgate_decisions_total{limit="minute",plan="",policy="api",result="allowed"} 2
tollgate_decisions_total{limit="minute",plan="",policy="api",result="delayed"} 0
tollgate_decisions_total{limit="minute",plan="",policy="api",result="denied"} 1
tollgate_decisions_total{limit="minute",plan="",policy="api",result="shadowed"} 0
# HELP tollgate_store_errors_total Decisions the shared store (Redis) could not make, so its failure policy made them.
# TYPE tollgate_store_errors_total counter
tollgate_store_errors_total{policy="api"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tollgate_decisions_total", "tollgate_store_errors_total"); err != nil {
		t.Error(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == "acme" {
					t.Errorf("%s carries the request key in clear: %v", f.GetName(), m)
				}
				if f.GetName() == "tollgate_top_denied" && l.GetName() == "key" && l.GetValue() == core.KeyHash("acme") {
					found = true
				}
			}
		}
	}
	if !found {
		t.Error("tollgate_top_denied does not show the denied key's hash")
	}
	set.Close()
	if n, err := testutil.GatherAndCount(reg, "tollgate_top_denied"); err != nil || n != 0 {
		t.Errorf("after Close: %d tollgate_top_denied series, %v; want none", n, err)
	}
}
