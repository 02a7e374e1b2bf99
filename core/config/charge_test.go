package config

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/usage"
)

func cost(n int64) *int64 { return &n }

// TestResponseCost: which responses a charge prices, and at what, from a
// status list, a header matcher and a reported cost.
func TestResponseCost(t *testing.T) {
	for _, tc := range []struct {
		charge Charge
		status int
		header map[string]string
		want   int64
		ok     bool
	}{
		{Charge{Status: []string{"401", "403"}}, 401, nil, 1, true},
		{Charge{Status: []string{"401", "403"}}, 200, nil, 0, false},
		{Charge{Status: []string{"4xx"}}, 429, nil, 1, true},
		{Charge{Status: []string{"5"}}, 503, nil, 1, true},
		{Charge{Status: []string{"500-504"}}, 505, nil, 0, false},
		{Charge{}, 204, nil, 1, true},
		{Charge{Header: "x-cache", Values: []string{"MISS"}}, 200, map[string]string{"X-Cache": "MISS"}, 1, true},
		{Charge{Header: "X-Cache", Values: []string{"MISS"}}, 200, map[string]string{"X-Cache": "HIT"}, 0, false},
		{Charge{Header: "X-Cache"}, 200, nil, 0, false},
		{Charge{CostHeader: "X-Tokens"}, 200, map[string]string{"X-Tokens": " 150 "}, 150, true},
		{Charge{CostHeader: "X-Tokens"}, 200, nil, 0, true}, // reports nothing: costs nothing
		{Charge{CostHeader: "X-Tokens", Cost: cost(2)}, 200, nil, 2, true},
		{Charge{CostHeader: "X-Tokens"}, 200, map[string]string{"X-Tokens": "-5"}, 0, true},
		{Charge{CostHeader: "X-Tokens"}, 200, map[string]string{"X-Tokens": "1.5"}, 0, true},
		{Charge{CostHeader: "X-Tokens"}, 200, map[string]string{"X-Tokens": "99999999999999999999999"}, algo.MaxCount, true},
		// A number too large to hold takes the whole count, however long:
		// 64 digits, 65, and a thousand.
		{Charge{CostHeader: "X-Tokens"}, 200, map[string]string{"X-Tokens": strings.Repeat("9", 64)}, algo.MaxCount, true},
		{Charge{CostHeader: "X-Tokens"}, 200, map[string]string{"X-Tokens": strings.Repeat("9", 65)}, algo.MaxCount, true},
		{Charge{CostHeader: "X-Tokens"}, 200, map[string]string{"X-Tokens": "1" + strings.Repeat("0", 999)}, algo.MaxCount, true},
		{Charge{CostHeader: "X-Usage", CostEntry: "total"}, 200, map[string]string{"X-Usage": "total=" + strings.Repeat("7", 80)}, algo.MaxCount, true},
		{Charge{CostHeader: "X-Limit", CostEntry: "videos"}, 200, map[string]string{"X-Limit": "videos=2, images=4"}, 2, true},
		{Charge{CostHeader: "X-Limit", CostEntry: "images"}, 200, map[string]string{"X-Limit": "videos=2, images=4"}, 4, true},
		{Charge{CostHeader: "X-Limit", CostEntry: "audio"}, 200, map[string]string{"X-Limit": "videos=2, images=4"}, 0, true},
		// Two lines of the header (read as one field, "100, 200"): the
		// largest report is charged, never nothing; a garbled item is
		// passed over.
		{Charge{CostHeader: "X-Usage"}, 200, map[string]string{"X-Usage": "100, 200"}, 200, true},
		{Charge{CostHeader: "X-Usage"}, 200, map[string]string{"X-Usage": "300,200"}, 300, true},
		{Charge{CostHeader: "X-Usage"}, 200, map[string]string{"X-Usage": "x, 40, -9"}, 40, true},
		{Charge{CostHeader: "X-Usage"}, 200, map[string]string{"X-Usage": "5, " + strings.Repeat("9", 30)}, algo.MaxCount, true},
		// The last entry of a name counts.
		{Charge{CostHeader: "X-Limit", CostEntry: "videos"}, 200, map[string]string{"X-Limit": "videos=2, images=4, videos=3"}, 3, true},
	} {
		rc, err := tc.charge.Compile()
		if err != nil {
			t.Fatalf("%+v: %v", tc.charge, err)
		}
		got, ok := rc.Cost(tc.status, func(name string) string { return tc.header[name] })
		if got != tc.want || ok != tc.ok {
			t.Errorf("%+v, status %d, headers %v: cost %d %v, want %d %v", tc.charge, tc.status, tc.header, got, ok, tc.want, tc.ok)
		}
	}
}

// TestChargeErrorsNameTheField: a bad charge is refused with the field and
// the value.
func TestChargeErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		charge Charge
		want   string
	}{
		{Charge{Status: []string{"99"}}, `charge status: "99"`},
		{Charge{Status: []string{"600"}}, `charge status: "600"`},
		{Charge{Status: []string{"599-500"}}, `charge status: "599-500"`},
		{Charge{Values: []string{"x"}}, "charge values"},
		{Charge{CostEntry: "total"}, `charge cost_entry: "total"`},
		{Charge{Cost: cost(-1)}, "charge cost: -1"},
	} {
		if _, err := tc.charge.Compile(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.charge, err, tc.want)
		}
	}
}

// FuzzReportedCost: whatever an upstream writes in a cost header, the cost
// read is between 0 and algo.MaxCount, and reading never panics.
func FuzzReportedCost(f *testing.F) {
	for _, s := range []string{"150", "videos=2, images=4", "=,=,", "-1", "1e9", "99999999999999999999", "\x00", "a=b=c"} {
		f.Add(s, "videos")
	}
	f.Fuzz(func(t *testing.T, v, name string) {
		for _, entry := range []string{"", name} {
			rc, err := (&Charge{CostHeader: "X-Cost", CostEntry: entry}).Compile()
			if err != nil {
				return
			}
			n, ok := rc.Cost(200, func(string) string { return v })
			if !ok || n < 0 || n > algo.MaxCount {
				t.Fatalf("cost header %q entry %q: %d %v", v, entry, n, ok)
			}
		}
	})
}

// TestChargeUsageCost: usage cost charges an answer's tokens at the
// charge's prices of a million tokens, in millionths; an answer that
// reports none costs the charge's cost.
func TestChargeUsageCost(t *testing.T) {
	in, out, fixed := 2.5, 10.0, int64(3000)
	rc, err := (&Charge{Usage: "cost", InputCost: &in, OutputCost: &out, Cost: &fixed}).Compile()
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.BodyCost(usage.Usage{Prompt: 1000, Completion: 200, Total: 1200}, true); got != 4500 {
		t.Errorf("1000 prompt and 200 completion tokens at 2.5 and 10 a million: %d, want 4500", got)
	}
	if got := rc.BodyCost(usage.Usage{}, false); got != 3000 {
		t.Errorf("an answer without usage: %d, want the cost, 3000", got)
	}
}
