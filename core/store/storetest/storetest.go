// Package storetest is the conformance suite every tollgate store and every
// composition of stores must pass: the same traces, replayed with an
// injected clock, must give decision for decision what the plain reference
// model (Model) says. Golden traces pin each algorithm's boundaries; random
// traces are deny-heavy (few keys, dense arrivals, costs above 1, stacked
// limits, shadow mode, clock steps) so retry-after and all-or-nothing are
// exercised on every run.
package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/store/storetest/refmodel"
)

// Factory returns a fresh, empty store that reads time from clock.
type Factory func(t *testing.T, clock core.Clock) core.Store

// T0 is the traces' start: a Unix time in µs aligned to a whole day, so
// windows of a second, minute, hour or day all start there.
const T0 = int64(1_700_006_400) * 1_000_000

// TraceStep is one request of a trace and what the store must answer.
type TraceStep struct {
	At   time.Duration // since T0
	Key  string        // "" means "k"
	Cost int64         // 0 means 1; use Free for a request of cost 0
	Plan string        // the plan whose limits the request takes, if the policy has plans
	// Priority is the request's priority, for a policy with a reserve.
	Priority int
	// End, instead of a request, ends (Renew: renews) the lease the
	// request of step End (counted from 1) took; Found is how many of its
	// slots the store must still hold.
	End   int
	Renew bool
	Found int64
	// Inspect reads the key (an operator's view: a request of cost 0 that
	// changes nothing) instead of deciding; Reset forgets it (in every
	// limit, or Only in limit Only-1). Want applies to Inspect.
	Inspect, Reset bool
	Only           int
	// Cancel, instead of a request, gives back the places the request of
	// step Cancel (counted from 1) holds in shapers' queues: its client
	// left before its release.
	Cancel int
	// Charge, instead of a request, charges Cost (Free: 0) after a
	// response: the step decides under the policy's Charging twin.
	Charge bool
	// Policy, if set, decides this step instead of the trace's: the same
	// name with other limits, as a reload that adds, removes or changes
	// one makes it.
	Policy *core.Policy
	Want   Want
}

// Free is the Cost of a request that costs nothing (it only reads the state).
const Free = -1

// Want is the expected decision. Results, when set, are checked per limit
// (Allowed and Remaining).
type Want struct {
	Allowed    bool
	Shadowed   bool
	Index      int
	Remaining  int64
	Reset      time.Duration
	RetryAfter time.Duration
	Delay      time.Duration
	Results    []WantResult
}

// WantResult is the expected verdict of one limit of a stacked policy.
type WantResult struct {
	Allowed   bool
	Remaining int64
}

// Trace is a named policy and the requests replayed against it.
type Trace struct {
	Name   string
	Policy *core.Policy
	Steps  []TraceStep
}

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

const day = 24 * time.Hour

func lim(count int64, window time.Duration, a algo.Algorithm) algo.Limit {
	return algo.Limit{Count: count, Window: window, Algorithm: a}
}

// Traces returns the conformance traces: every algorithm at its boundaries,
// bursts, refills, cost above 1, stacked limits and shadow mode.
func Traces() []Trace {
	opts := core.PolicyOptions{}
	tb := lim(10, time.Second, algo.TokenBucket)
	tb.Burst = 5
	gcra := lim(10, time.Second, algo.GCRA)
	gcra.Burst = 2
	shaper := lim(10, time.Second, algo.LeakyBucket)
	shaper.MaxDelay = ms(250)
	return []Trace{
		{"fixed_window", core.MustPolicy("fw", opts, lim(3, time.Second, algo.FixedWindow)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 2, Reset: ms(1000)}},
			{At: ms(100), Want: Want{Allowed: true, Remaining: 1, Reset: ms(900)}},
			{At: ms(200), Want: Want{Allowed: true, Remaining: 0, Reset: ms(800)}},
			{At: ms(300), Want: Want{Remaining: 0, Reset: ms(700), RetryAfter: ms(700)}},
			{At: 999999 * time.Microsecond, Want: Want{Reset: time.Microsecond, RetryAfter: time.Microsecond}},
			{At: ms(1000), Want: Want{Allowed: true, Remaining: 2, Reset: ms(1000)}},
			{At: ms(1500), Cost: 2, Want: Want{Allowed: true, Remaining: 0, Reset: ms(500)}},
			{At: ms(1600), Want: Want{Remaining: 0, Reset: ms(400), RetryAfter: ms(400)}},
			{At: ms(2000), Cost: 4, Want: Want{Remaining: 3, Reset: ms(1000), RetryAfter: ms(1000)}},
			{At: ms(2000), Cost: 3, Want: Want{Allowed: true, Remaining: 0, Reset: ms(1000)}},
			{At: ms(2000), Key: "other", Want: Want{Allowed: true, Remaining: 2, Reset: ms(1000)}},
		}},
		{"sliding_log", core.MustPolicy("sl", opts, lim(3, time.Second, algo.SlidingLog)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 2, Reset: ms(1000)}},
			{At: ms(100), Want: Want{Allowed: true, Remaining: 1, Reset: ms(1000)}},
			{At: ms(200), Want: Want{Allowed: true, Remaining: 0, Reset: ms(1000)}},
			{At: ms(500), Want: Want{Remaining: 0, Reset: ms(700), RetryAfter: ms(500)}},
			{At: ms(1000), Want: Want{Allowed: true, Remaining: 0, Reset: ms(1000)}},
			{At: ms(1050), Want: Want{Remaining: 0, Reset: ms(950), RetryAfter: ms(50)}},
			{At: ms(1150), Cost: 2, Want: Want{Remaining: 1, Reset: ms(850), RetryAfter: ms(50)}},
			{At: ms(1200), Cost: 2, Want: Want{Allowed: true, Remaining: 0, Reset: ms(1000)}},
			{At: ms(1300), Cost: 4, Want: Want{Remaining: 0, Reset: ms(900), RetryAfter: ms(1000)}},
			{At: ms(1300), Cost: Free, Want: Want{Allowed: true, Remaining: 0, Reset: ms(900)}},
			{At: ms(5000), Want: Want{Allowed: true, Remaining: 2, Reset: ms(1000)}},
		}},
		{"sliding_counter", core.MustPolicy("sc", opts, lim(10, time.Second, algo.SlidingCounter)), []TraceStep{
			{At: ms(100), Cost: 10, Want: Want{Allowed: true, Remaining: 0, Reset: ms(1900)}},
			{At: ms(200), Want: Want{Remaining: 0, Reset: ms(1800), RetryAfter: ms(900)}},
			{At: 1099999 * time.Microsecond, Want: Want{Remaining: 0, Reset: 900001 * time.Microsecond, RetryAfter: time.Microsecond}},
			{At: ms(1100), Want: Want{Allowed: true, Remaining: 0, Reset: ms(1900)}},
			{At: ms(1500), Want: Want{Allowed: true, Remaining: 3, Reset: ms(1500)}},
			{At: ms(2500), Want: Want{Allowed: true, Remaining: 8, Reset: ms(1500)}},
			{At: ms(5000), Want: Want{Allowed: true, Remaining: 9, Reset: ms(2000)}},
			{At: ms(5000), Cost: 9, Want: Want{Allowed: true, Remaining: 0, Reset: ms(2000)}},
			{At: ms(6100), Want: Want{Allowed: true, Remaining: 0, Reset: ms(1900)}},
			{At: ms(6200), Want: Want{Allowed: true, Remaining: 0, Reset: ms(1800)}},
			{At: ms(6250), Want: Want{Remaining: 0, Reset: ms(1750), RetryAfter: ms(50)}},
			{At: ms(6300), Want: Want{Allowed: true, Remaining: 0, Reset: ms(1700)}},
			{At: ms(6300), Cost: 11, Want: Want{Remaining: 0, Reset: ms(1700), RetryAfter: ms(1000)}},
		}},
		{"token_bucket", core.MustPolicy("tb", opts, tb), []TraceStep{
			{At: 0, Cost: 5, Want: Want{Allowed: true, Remaining: 0, Reset: ms(500)}},
			{At: 0, Want: Want{Remaining: 0, Reset: ms(500), RetryAfter: ms(100)}},
			{At: ms(100), Want: Want{Allowed: true, Remaining: 0, Reset: ms(500)}},
			{At: ms(350), Want: Want{Allowed: true, Remaining: 1, Reset: ms(350)}},
			{At: ms(10000), Cost: 6, Want: Want{Remaining: 5, RetryAfter: ms(1000)}},
			{At: ms(10000), Cost: Free, Want: Want{Allowed: true, Remaining: 5}},
			{At: ms(10000), Cost: 2, Want: Want{Allowed: true, Remaining: 3, Reset: ms(200)}},
		}},
		{"gcra", core.MustPolicy("gcra", opts, gcra), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 1, Reset: ms(100)}},
			{At: 0, Want: Want{Allowed: true, Remaining: 0, Reset: ms(200)}},
			{At: 0, Want: Want{Remaining: 0, Reset: ms(200), RetryAfter: ms(100)}},
			{At: ms(50), Want: Want{Remaining: 0, Reset: ms(150), RetryAfter: ms(50)}},
			{At: ms(100), Want: Want{Allowed: true, Remaining: 0, Reset: ms(200)}},
			{At: ms(1000), Cost: 3, Want: Want{Remaining: 2, RetryAfter: ms(1000)}},
			{At: ms(1000), Cost: 2, Want: Want{Allowed: true, Remaining: 0, Reset: ms(200)}},
		}},
		{"gcra_fractional_interval", core.MustPolicy("gcra3", opts, lim(3, time.Second, algo.GCRA)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 0, Reset: 333334 * time.Microsecond}},
			{At: 333333 * time.Microsecond, Want: Want{Remaining: 0, Reset: time.Microsecond, RetryAfter: time.Microsecond}},
			{At: 333334 * time.Microsecond, Want: Want{Allowed: true, Remaining: 0, Reset: 333334 * time.Microsecond}},
		}},
		{"leaky_bucket_shaper", core.MustPolicy("lb", opts, shaper), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 2, Reset: ms(100)}},
			{At: 0, Want: Want{Allowed: true, Remaining: 1, Reset: ms(200), Delay: ms(100)}},
			{At: 0, Want: Want{Allowed: true, Remaining: 0, Reset: ms(300), Delay: ms(200)}},
			{At: 0, Want: Want{Remaining: 0, Reset: ms(300), RetryAfter: ms(50)}},
			{At: ms(60), Want: Want{Allowed: true, Remaining: 0, Reset: ms(340), Delay: ms(240)}},
			{At: ms(200), Want: Want{Allowed: true, Remaining: 0, Reset: ms(300), Delay: ms(200)}},
			{At: ms(1000), Want: Want{Allowed: true, Remaining: 2, Reset: ms(100)}},
		}},
		// A client that leaves before its release gives its place back; one
		// already released gives nothing.
		{"shaper_cancel", core.MustPolicy("lb-cancel", opts, shaper), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 2, Reset: ms(100)}},
			{At: 0, Want: Want{Allowed: true, Remaining: 1, Reset: ms(200), Delay: ms(100)}},
			{At: 0, Want: Want{Allowed: true, Remaining: 0, Reset: ms(300), Delay: ms(200)}},
			{At: 0, Want: Want{Remaining: 0, Reset: ms(300), RetryAfter: ms(50)}},
			{At: ms(10), Cancel: 2},
			// Its place is the queue's end: released with step 3, at 200 ms.
			{At: ms(10), Want: Want{Allowed: true, Remaining: 0, Reset: ms(290), Delay: ms(190)}},
			{At: ms(250), Cancel: 3}, // released at 200 ms: nothing to give back
			{At: ms(250), Want: Want{Allowed: true, Remaining: 2, Reset: ms(150), Delay: ms(50)}},
			{At: ms(260), Cancel: 8},
			{At: ms(260), Want: Want{Allowed: true, Remaining: 2, Reset: ms(140), Delay: ms(40)}},
		}},
		{"stacked_second_denies_consumes_nothing", core.MustPolicy("stack", opts,
			lim(3, time.Second, algo.FixedWindow), lim(2, time.Minute, algo.FixedWindow)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Index: 1, Remaining: 1, Reset: ms(60000),
				Results: []WantResult{{true, 2}, {true, 1}}}},
			{At: ms(1), Want: Want{Allowed: true, Index: 1, Remaining: 0, Reset: ms(59999),
				Results: []WantResult{{true, 1}, {true, 0}}}},
			{At: ms(2), Want: Want{Index: 1, Remaining: 0, Reset: ms(59998), RetryAfter: ms(59998),
				Results: []WantResult{{true, 1}, {false, 0}}}},
			{At: ms(3), Want: Want{Index: 1, Remaining: 0, Reset: ms(59997), RetryAfter: ms(59997),
				Results: []WantResult{{true, 1}, {false, 0}}}},
			{At: ms(60000), Want: Want{Allowed: true, Index: 1, Remaining: 1, Reset: ms(60000),
				Results: []WantResult{{true, 2}, {true, 1}}}},
		}},
		{"stacked_first_denies_and_ties", core.MustPolicy("stack2", opts,
			lim(1, time.Second, algo.SlidingLog), lim(3, time.Hour, algo.GCRA), lim(1, time.Minute, algo.FixedWindow)), []TraceStep{
			// Ties on remaining go to the longer window.
			{At: 0, Want: Want{Allowed: true, Index: 1, Remaining: 0, Reset: ms(1200000),
				Results: []WantResult{{true, 0}, {true, 0}, {true, 0}}}},
			// All three deny: the longest RetryAfter decides.
			{At: ms(500), Want: Want{Index: 1, Remaining: 0, Reset: ms(1199500), RetryAfter: ms(1199500),
				Results: []WantResult{{false, 0}, {false, 0}, {false, 0}}}},
		}},
		// Calendar windows (UTC): T0 is 15 Nov 2023, so Dec 1 is T0+16d,
		// 1 Jan 2024 T0+47d, 29 Feb 2024 (a leap day) T0+106d, 1 Mar T0+107d.
		{"calendar_month_and_year", core.MustPolicy("cal", opts, lim(3, algo.CalendarMonth, algo.FixedWindow), lim(5, algo.CalendarYear, algo.FixedWindow)), []TraceStep{
			{At: 15*day + 23*time.Hour + 59*time.Minute, Want: Want{Allowed: true, Remaining: 2, Reset: time.Minute}},
			{At: 15*day + 23*time.Hour + 59*time.Minute, Want: Want{Allowed: true, Remaining: 1, Reset: time.Minute}},
			{At: 15*day + 23*time.Hour + 59*time.Minute, Want: Want{Allowed: true, Remaining: 0, Reset: time.Minute}},
			{At: 15*day + 23*time.Hour + 59*time.Minute, Want: Want{Remaining: 0, Reset: time.Minute, RetryAfter: time.Minute,
				Results: []WantResult{{false, 0}, {true, 2}}}},
			{At: 16*day + time.Minute, Want: Want{Allowed: true, Index: 1, Remaining: 1, Reset: 31*day - time.Minute}},
			{At: 16*day + 2*time.Minute, Want: Want{Allowed: true, Index: 1, Remaining: 0, Reset: 31*day - 2*time.Minute}},
			{At: 16*day + 3*time.Minute, Want: Want{Index: 1, Remaining: 0, Reset: 31*day - 3*time.Minute, RetryAfter: 31*day - 3*time.Minute,
				Results: []WantResult{{true, 1}, {false, 0}}}},
			{At: 47 * day, Want: Want{Allowed: true, Remaining: 2, Reset: 31 * day}},
			{At: 106*day + 12*time.Hour, Want: Want{Allowed: true, Remaining: 2, Reset: 12 * time.Hour}},
			{At: 107 * day, Want: Want{Allowed: true, Index: 1, Remaining: 2, Reset: 306 * day}},
			{At: 107 * day, Cost: 3, Want: Want{Index: 1, Remaining: 2, Reset: 306 * day, RetryAfter: 306 * day,
				Results: []WantResult{{false, 2}, {false, 2}}}},
			{At: 107 * day, Cost: 4, Want: Want{Index: 1, Remaining: 2, Reset: 306 * day, RetryAfter: 306 * day}},
		}},
		// A key keeps its usage when its plan changes: free allows 2/1s and
		// pro 4/1s on the same counters.
		{"plans_keep_usage", plans("plans", "free", []string{"free", "pro"}, lim(2, time.Second, algo.FixedWindow), lim(4, time.Second, algo.FixedWindow)), []TraceStep{
			{At: 0, Plan: "free", Want: Want{Allowed: true, Remaining: 1, Reset: ms(1000)}},
			{At: ms(10), Plan: "free", Want: Want{Allowed: true, Remaining: 0, Reset: ms(990)}},
			{At: ms(20), Plan: "free", Want: Want{Remaining: 0, Reset: ms(980), RetryAfter: ms(980)}},
			{At: ms(30), Plan: "pro", Want: Want{Allowed: true, Remaining: 1, Reset: ms(970)}},
			{At: ms(40), Plan: "unknown", Want: Want{Remaining: 0, Reset: ms(960), RetryAfter: ms(960)}}, // the default plan
			{At: ms(50), Plan: "pro", Want: Want{Allowed: true, Remaining: 0, Reset: ms(950)}},
			{At: ms(60), Plan: "pro", Want: Want{Remaining: 0, Reset: ms(940), RetryAfter: ms(940)}},
			{At: ms(1000), Plan: "free", Want: Want{Allowed: true, Remaining: 1, Reset: ms(1000)}},
		}},
		// Leases of 10 s, two at once: ending one frees its slot at once,
		// ending it twice finds nothing, a renewed lease outlives its
		// first 10 s, and one never ended frees itself.
		{"in_flight", core.MustPolicy("if", opts, lim(2, 10*time.Second, algo.InFlight)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 1, Reset: 10 * time.Second}},
			{At: time.Second, Want: Want{Allowed: true, Remaining: 0, Reset: 10 * time.Second}},
			{At: 2 * time.Second, Want: Want{Remaining: 0, Reset: 9 * time.Second, RetryAfter: algo.MaxInFlightRetry}},
			{At: 2 * time.Second, End: 1, Found: 1},
			{At: 2 * time.Second, Want: Want{Allowed: true, Remaining: 0, Reset: 10 * time.Second}},
			{At: 2 * time.Second, End: 1, Found: 0},
			{At: 9 * time.Second, End: 2, Renew: true, Found: 1},
			{At: 12 * time.Second, Want: Want{Allowed: true, Remaining: 0, Reset: 10 * time.Second}}, // step 5's expired
			{At: 12 * time.Second, End: 5, Found: 0},
			{At: 12 * time.Second, End: 2, Found: 1},
			{At: 12 * time.Second, Cost: 2, Want: Want{Remaining: 1, Reset: 10 * time.Second, RetryAfter: algo.MaxInFlightRetry}},
			{At: 12 * time.Second, End: 8, Found: 1},
			{At: 12 * time.Second, Cost: 2, Want: Want{Allowed: true, Remaining: 0, Reset: 10 * time.Second}},
			{At: 13 * time.Second, End: 13, Renew: true, Found: 2},
			{At: 22 * time.Second, Want: Want{Remaining: 0, Reset: time.Second, RetryAfter: time.Second}},
		}},
		// An operator reads a key (nothing changes: reading twice, or then
		// deciding, sees the same) and resets it (its quota is back).
		{"inspect_and_reset", core.MustPolicy("ops", opts, lim(3, time.Second, algo.SlidingLog), lim(5, time.Minute, algo.FixedWindow)), []TraceStep{
			{At: 0, Inspect: true, Want: Want{Allowed: true, Remaining: 3, Index: 0}},
			{At: 0, Want: Want{Allowed: true, Remaining: 2, Reset: time.Second}},
			{At: ms(100), Want: Want{Allowed: true, Remaining: 1, Reset: time.Second}},
			{At: ms(200), Inspect: true, Want: Want{Allowed: true, Remaining: 1, Reset: ms(900)}},
			{At: ms(200), Inspect: true, Want: Want{Allowed: true, Remaining: 1, Reset: ms(900)}},
			{At: ms(300), Want: Want{Allowed: true, Remaining: 0, Reset: time.Second}},
			{At: ms(400), Want: Want{Remaining: 0, Reset: ms(900), RetryAfter: ms(600)}},
			{At: ms(500), Reset: true},
			{At: ms(500), Inspect: true, Want: Want{Allowed: true, Remaining: 3}},
			{At: ms(500), Want: Want{Allowed: true, Remaining: 2, Reset: time.Second}},
			// One limit reset: the other keeps its count.
			{At: ms(600), Reset: true, Only: 1},
			{At: ms(600), Inspect: true, Want: Want{Allowed: true, Remaining: 3, Results: []WantResult{{true, 3}, {true, 4}}}},
			{At: ms(600), Cost: 3, Want: Want{Allowed: true, Remaining: 0, Reset: time.Second, Results: []WantResult{{true, 0}, {true, 1}}}},
			{At: ms(700), Reset: true, Only: 2},
			{At: ms(700), Inspect: true, Want: Want{Allowed: true, Remaining: 0, Reset: ms(900), Results: []WantResult{{true, 0}, {true, 5}}}},
		}},
		// The same on the counting algorithms, which eventual mode shares.
		{"inspect_and_reset_counted", core.MustPolicy("ops-counted", opts, lim(3, time.Second, algo.FixedWindow), lim(5, time.Minute, algo.SlidingCounter)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 2, Reset: time.Second}},
			{At: ms(100), Want: Want{Allowed: true, Remaining: 1, Reset: ms(900)}},
			{At: ms(200), Reset: true, Only: 2},
			{At: ms(200), Inspect: true, Want: Want{Allowed: true, Remaining: 1, Reset: ms(800), Results: []WantResult{{true, 1}, {true, 5}}}},
			{At: ms(300), Reset: true, Only: 1},
			{At: ms(300), Cost: 3, Want: Want{Allowed: true, Remaining: 0, Reset: ms(700), Results: []WantResult{{true, 0}, {true, 2}}}},
			{At: ms(400), Want: Want{Remaining: 0, Reset: ms(600), RetryAfter: ms(600), Results: []WantResult{{false, 0}, {true, 2}}}},
			{At: ms(500), Reset: true},
			{At: ms(500), Inspect: true, Want: Want{Allowed: true, Remaining: 3, Reset: ms(500), Results: []WantResult{{true, 3}, {true, 5}}}},
		}},
		// Usage is kept per limit: a reload that adds a limit keeps the
		// others' counts, one that removes a limit keeps the rest, one that
		// changes a count keeps what was used, and the first policy, back,
		// finds each limit where the others left it (as gateways that key
		// each period on its own do).
		{"limits_change_keeps_usage", reloadMinute, []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 2, Reset: time.Minute}},
			{At: ms(10), Want: Want{Allowed: true, Remaining: 1, Reset: time.Minute - ms(10)}},
			{At: ms(20), Policy: reloadMinuteHour, Want: Want{Allowed: true, Remaining: 0, Reset: time.Minute - ms(20),
				Results: []WantResult{{true, 0}, {true, 99}}}},
			{At: ms(30), Policy: reloadMinuteHour, Want: Want{Remaining: 0, Reset: time.Minute - ms(30), RetryAfter: time.Minute - ms(30),
				Results: []WantResult{{false, 0}, {true, 99}}}},
			{At: ms(40), Policy: reloadHour, Want: Want{Allowed: true, Remaining: 98, Reset: time.Hour - ms(40)}},
			{At: ms(50), Policy: reloadMinuteRaised, Want: Want{Allowed: true, Remaining: 1, Reset: time.Minute - ms(50)}},
			{At: ms(60), Want: Want{Remaining: 0, Reset: time.Minute - ms(60), RetryAfter: time.Minute - ms(60)}},
			{At: ms(70), Policy: reloadMinuteHour, Want: Want{Remaining: 0, Reset: time.Minute - ms(70), RetryAfter: time.Minute - ms(70),
				Results: []WantResult{{false, 0}, {true, 98}}}},
			{At: time.Minute, Policy: reloadMinuteHour, Want: Want{Allowed: true, Remaining: 2, Reset: time.Minute,
				Results: []WantResult{{true, 2}, {true, 97}}}},
		}},
		// Charged after the response: a request passes while a unit is
		// left and takes nothing; the response's cost is taken after,
		// overdrawing the limit (at most MaxCharge at once), which then
		// refuses until it has recovered.
		{"charge_after_fixed_window", core.MustPolicy("charged-fw", opts, afterResponse(lim(10, time.Second, algo.FixedWindow))), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 10, Reset: ms(1000)}},
			{At: 0, Charge: true, Cost: 4, Want: Want{Allowed: true, Remaining: 6, Reset: ms(1000)}},
			{At: ms(10), Want: Want{Allowed: true, Remaining: 6, Reset: ms(990)}},
			{At: ms(10), Charge: true, Cost: 9, Want: Want{Remaining: 0, Reset: ms(990), RetryAfter: ms(990)}},
			{At: ms(20), Want: Want{Remaining: 0, Reset: ms(980), RetryAfter: ms(980)}},
			{At: ms(20), Charge: true, Cost: 50, Want: Want{Remaining: 0, Reset: ms(980), RetryAfter: ms(980)}},
			{At: ms(1000), Want: Want{Allowed: true, Remaining: 10, Reset: ms(1000)}},
			{At: ms(1000), Charge: true, Cost: Free, Want: Want{Allowed: true, Remaining: 10, Reset: ms(1000)}},
		}},
		{"charge_after_token_bucket", core.MustPolicy("charged-tb", opts, afterResponse(tb)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 5}},
			{At: 0, Charge: true, Cost: 3, Want: Want{Allowed: true, Remaining: 2, Reset: ms(300)}},
			{At: 0, Charge: true, Cost: 8, Want: Want{Remaining: 0, Reset: ms(1100), RetryAfter: ms(600)}},
			{At: ms(100), Want: Want{Remaining: 0, Reset: ms(1000), RetryAfter: ms(600)}},
			{At: ms(700), Want: Want{Allowed: true, Remaining: 1, Reset: ms(400)}},
		}},
		// A limit charged with the request stacked with one charged after
		// the response: the check refuses for both, and takes nothing from
		// the other; the charge changes only its own limit.
		{"charge_after_stacked", core.MustPolicy("charged-stack", opts, lim(3, time.Second, algo.FixedWindow),
			afterResponse(lim(2, time.Second, algo.SlidingLog))), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 2, Reset: ms(1000), Results: []WantResult{{true, 2}, {true, 2}}}},
			{At: ms(100), Charge: true, Cost: 5, Want: Want{Allowed: true, Index: 1, Remaining: 0, Reset: ms(1000),
				Results: []WantResult{{true, 2}, {true, 0}}}},
			{At: ms(200), Want: Want{Index: 1, Remaining: 0, Reset: ms(900), RetryAfter: ms(900), Results: []WantResult{{true, 2}, {false, 0}}}},
			{At: ms(1100), Want: Want{Allowed: true, Remaining: 2, Reset: ms(900), Results: []WantResult{{true, 2}, {true, 2}}}},
			{At: ms(1100), Inspect: true, Want: Want{Allowed: true, Remaining: 2, Reset: ms(900), Results: []WantResult{{true, 2}, {true, 2}}}},
		}},
		// A penalty box: the third denial within its 10 s window refuses the
		// key for 5 s, whatever the other limits say; its own refusals do
		// not count, an operator's read does not either, and a reset of
		// the box lets the key in again.
		{"penalty_box", core.MustPolicy("boxed", opts, lim(2, time.Second, algo.FixedWindow), algo.PenaltyLimit(3, 10*time.Second, 5*time.Second)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 1, Reset: ms(1000), Results: []WantResult{{true, 1}, {true, 3}}}},
			{At: ms(10), Want: Want{Allowed: true, Remaining: 0, Reset: ms(990)}},
			{At: ms(20), Want: Want{Remaining: 0, Reset: ms(980), RetryAfter: ms(980), Results: []WantResult{{false, 0}, {true, 2}}}},
			{At: ms(30), Want: Want{Remaining: 0, Reset: ms(970), RetryAfter: ms(970), Results: []WantResult{{false, 0}, {true, 1}}}},
			{At: ms(40), Want: Want{Index: 1, Remaining: 0, Reset: 5 * time.Second, RetryAfter: 5 * time.Second, Results: []WantResult{{false, 0}, {false, 0}}}},
			{At: ms(1000), Want: Want{Index: 1, Remaining: 0, Reset: ms(4040), RetryAfter: ms(4040), Results: []WantResult{{true, 2}, {false, 0}}}},
			{At: ms(1000), Inspect: true, Want: Want{Index: 1, Remaining: 0, Reset: ms(4040), RetryAfter: ms(4040), Results: []WantResult{{true, 2}, {false, 0}}}},
			{At: ms(5040), Want: Want{Allowed: true, Remaining: 1, Reset: ms(960), Results: []WantResult{{true, 1}, {true, 3}}}},
			{At: ms(5050), Want: Want{Allowed: true, Remaining: 0, Reset: ms(950)}},
			{At: ms(5060), Want: Want{Remaining: 0, Reset: ms(940), RetryAfter: ms(940), Results: []WantResult{{false, 0}, {true, 2}}}},
			{At: ms(5070), Reset: true, Only: 2},
			{At: ms(5070), Want: Want{Remaining: 0, Reset: ms(930), RetryAfter: ms(930), Results: []WantResult{{false, 0}, {true, 2}}}},
		}},
		// A reserve: 20% of 10 a second (2) is held back for priority 1 and
		// above. Priority 0 sees a limit of 8 over the same count; priority
		// 1 the whole 10.
		{"reserve_fixed_window", reserved("reserved-fw", &core.Reserve{Share: 0.2, Level: 1}, lim(10, time.Second, algo.FixedWindow)), []TraceStep{
			{At: 0, Cost: 4, Want: Want{Allowed: true, Remaining: 4, Reset: ms(1000)}},
			{At: ms(1), Cost: 4, Want: Want{Allowed: true, Remaining: 0, Reset: ms(999)}},
			{At: ms(2), Want: Want{Remaining: 0, Reset: ms(998), RetryAfter: ms(998)}},
			{At: ms(3), Priority: 1, Want: Want{Allowed: true, Remaining: 1, Reset: ms(997)}},
			{At: ms(4), Priority: 2, Want: Want{Allowed: true, Remaining: 0, Reset: ms(996)}},
			{At: ms(5), Priority: 1, Want: Want{Remaining: 0, Reset: ms(995), RetryAfter: ms(995)}},
			{At: ms(1000), Cost: 8, Want: Want{Allowed: true, Remaining: 0, Reset: ms(1000)}},
		}},
		// A sliding log's reserve: priority 0 sees 2 of 4 over the same log,
		// so it waits for the full limit's requests to leave it.
		{"reserve_sliding_log", reserved("reserved-sl", &core.Reserve{Share: 0.5, Level: 1}, lim(4, time.Second, algo.SlidingLog)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 1, Reset: ms(1000)}},
			{At: ms(10), Want: Want{Allowed: true, Remaining: 0, Reset: ms(1000)}},
			{At: ms(20), Want: Want{Remaining: 0, Reset: ms(990), RetryAfter: ms(980)}},
			{At: ms(30), Priority: 1, Want: Want{Allowed: true, Remaining: 1, Reset: ms(1000)}},
			{At: ms(40), Priority: 1, Want: Want{Allowed: true, Remaining: 0, Reset: ms(1000)}},
			{At: ms(500), Want: Want{Remaining: 0, Reset: ms(540), RetryAfter: ms(530)}},
			{At: ms(1000), Want: Want{Remaining: 0, Reset: ms(40), RetryAfter: ms(30)}},
			{At: ms(1000), Priority: 1, Want: Want{Allowed: true, Remaining: 0, Reset: ms(1000)}},
		}},
		// A token bucket's reserve is a share of its burst: 2 of 5 tokens
		// (10 a second) for priority 1, so priority 0 sees a bucket of 3
		// that refills at the same rate.
		{"reserve_token_bucket", reserved("reserved-tb", &core.Reserve{Share: 0.4, Level: 1}, tb), []TraceStep{
			{At: 0, Cost: 3, Want: Want{Allowed: true, Remaining: 0, Reset: ms(300)}},
			{At: 0, Want: Want{Remaining: 0, Reset: ms(300), RetryAfter: ms(100)}},
			{At: 0, Priority: 1, Want: Want{Allowed: true, Remaining: 1, Reset: ms(400)}},
			{At: 0, Priority: 1, Want: Want{Allowed: true, Remaining: 0, Reset: ms(500)}},
			{At: 0, Priority: 1, Want: Want{Remaining: 0, Reset: ms(500), RetryAfter: ms(100)}},
			{At: ms(100), Want: Want{Remaining: 0, Reset: ms(400), RetryAfter: ms(200)}},
			{At: ms(300), Want: Want{Allowed: true, Remaining: 0, Reset: ms(300)}},
		}},
		{"shadow", core.MustPolicy("shadow", core.PolicyOptions{Shadow: true}, lim(1, time.Second, algo.FixedWindow)), []TraceStep{
			{At: 0, Want: Want{Allowed: true, Remaining: 0, Reset: ms(1000)}},
			{At: ms(10), Want: Want{Allowed: true, Shadowed: true, Remaining: 0, Reset: ms(990), RetryAfter: ms(990)}},
		}},
	}
}

// afterResponse returns l charged after the response.
func afterResponse(l algo.Limit) algo.Limit {
	l.AfterResponse = true
	return l
}

// The policies of the limits_change_keeps_usage trace: one name, with a
// minute's limit, then an hour's added, then the minute's removed, then
// the minute's count raised.
var (
	reloadMinute       = core.MustPolicy("reload", core.PolicyOptions{}, lim(3, time.Minute, algo.FixedWindow))
	reloadMinuteHour   = core.MustPolicy("reload", core.PolicyOptions{}, lim(3, time.Minute, algo.FixedWindow), lim(100, time.Hour, algo.FixedWindow))
	reloadHour         = core.MustPolicy("reload", core.PolicyOptions{}, lim(100, time.Hour, algo.FixedWindow))
	reloadMinuteRaised = core.MustPolicy("reload", core.PolicyOptions{}, lim(5, time.Minute, algo.FixedWindow))
)

// plans returns the default plan's policy of a policy with one plan per
// name, each with the limit of the same index (its Family chooses among
// them).
func plans(name, defaultPlan string, names []string, limits ...algo.Limit) *core.Policy {
	ps := make([]core.Plan, len(names))
	for i, plan := range names {
		ps[i] = core.Plan{Name: plan, Policy: core.MustPolicy(name, core.PolicyOptions{Plan: plan}, limits[i])}
	}
	f, err := core.NewPlans(ps, defaultPlan, nil)
	if err != nil {
		panic(err)
	}
	return register(f)
}

// reserved returns a policy of limits composed with reserve (its Family
// holds the policy below the reserve).
func reserved(name string, reserve *core.Reserve, limits ...algo.Limit) *core.Policy {
	f, err := core.NewFamily(core.MustPolicy(name, core.PolicyOptions{}, limits...), reserve)
	if err != nil {
		panic(err)
	}
	return register(f)
}

// families are the Family of every policy the traces decide under (a
// plan's, one below a reserve, a charging twin), as Family finds them.
var families = struct {
	sync.Mutex
	of map[*core.Policy]*core.Family
}{of: map[*core.Policy]*core.Family{}}

// register makes f the family of each of its policies and returns its
// Policy.
func register(f *core.Family) *core.Policy {
	families.Lock()
	defer families.Unlock()
	for _, p := range f.All() {
		families.of[p] = f
	}
	return f.Policy()
}

// Family returns the family p was composed in here (by plans, reserved or
// ReservePolicies), or else p alone with its charging twin, made once.
func Family(p *core.Policy) *core.Family {
	families.Lock()
	f := families.of[p]
	families.Unlock()
	if f != nil {
		return f
	}
	f, _ = core.NewFamily(p, nil)
	families.Lock()
	defer families.Unlock()
	if known := families.of[p]; known != nil {
		return known
	}
	for _, q := range f.All() {
		families.of[q] = f
	}
	return f
}

// Options narrows the suite to what a store supports.
type Options struct {
	// Algorithms, if set, are the only algorithms the store decides (eventual
	// mode counts: fixed_window and sliding_counter); traces with others are
	// skipped.
	Algorithms []algo.Algorithm
	// Seeds is how many random traces to replay; 0 means 11 (ReloadSeed
	// switches between the limits of one policy name, ChargeSeed charges
	// responses after their requests, PenaltySeed has penalty boxes,
	// ReserveSeed reserves, TokenSeed charges token budgets).
	Seeds int
	// Batch, above 1 and for a store that is a Batcher, makes the random
	// traces send their requests in runs of up to Batch through DecideBatch
	// (a run ends early where a lease ends, a shaped request is cancelled or
	// an operator acts).
	Batch int
}

// Request is one request of a batch: Cost units for Key under Policy, at
// At (Unix µs).
type Request struct {
	Policy *core.Policy
	Key    string
	Cost   int64
	At     int64
}

// Batcher is a store that decides several requests in one call, in order,
// each at its own time: as if each came alone at its At.
type Batcher interface {
	// DecideBatch fills decisions[i] for reqs[i] and returns each one's
	// error (nil for none).
	DecideBatch(ctx context.Context, reqs []Request, decisions []core.Decision) []error
}

func (o Options) supports(p *core.Policy) bool {
	if len(o.Algorithms) == 0 {
		return true
	}
	for _, l := range p.Limits() {
		ok := false
		for _, a := range o.Algorithms {
			ok = ok || l.Algorithm == a
		}
		if !ok {
			return false
		}
	}
	return true
}

// Run replays every golden trace of Traces, then deny-heavy random traces
// checked decision for decision against the reference model, on stores from
// newStore.
func Run(t *testing.T, newStore Factory, opts ...Options) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	// TOLLGATE_CONFORMANCE=random replays only the random traces (the
	// mutant runner uses it to show they catch a planted bug on their own).
	golden := os.Getenv("TOLLGATE_CONFORMANCE") != "random"
	for _, tr := range Traces() {
		if !golden || !o.supports(tr.Policy) {
			continue
		}
		t.Run(tr.Name, func(t *testing.T) {
			clock := &core.ManualClock{}
			store := newStore(t, clock)
			leases := make([]core.Lease, len(tr.Steps))
			shaped := make([]core.Shaped, len(tr.Steps))
			for i, st := range tr.Steps {
				clock.Micros = T0 + int64(st.At/time.Microsecond)
				key := st.Key
				if key == "" {
					key = "k"
				}
				policy := tr.Policy
				if st.Policy != nil {
					policy = st.Policy
				}
				if st.Reset {
					if err := store.(core.Operator).Reset(context.Background(), policy, key, st.Only-1); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					continue
				}
				if st.Inspect {
					var d core.Decision
					if err := store.(core.Operator).Inspect(context.Background(), policy, key, &d); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if msg := mismatch(&d, st.Want); msg != "" {
						t.Errorf("step %d (at %v, inspect %q): %s", i, st.At, key, msg)
					}
					continue
				}
				if st.Cancel > 0 {
					if err := store.(core.ShapeStore).CancelShaped(context.Background(), &shaped[st.Cancel-1]); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					continue
				}
				if st.End > 0 {
					found, _, err := store.(core.LeaseStore).EndLease(context.Background(), &leases[st.End-1], st.Renew)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if found != st.Found {
						t.Errorf("step %d (at %v, end step %d's lease, renew %v): found %d slots, want %d", i, st.At, st.End, st.Renew, found, st.Found)
					}
					if st.Renew {
						leases[st.End-1].Token = clock.Micros
					}
					continue
				}
				cost := st.Cost
				switch cost {
				case 0:
					cost = 1
				case Free:
					cost = 0
				}
				family := Family(policy)
				p, _ := family.For(st.Plan, st.Priority)
				if st.Charge {
					p = family.Charging(p)
				}
				var d core.Decision
				if err := store.Decide(context.Background(), p, key, cost, &d); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if msg := mismatch(&d, st.Want); msg != "" {
					t.Errorf("step %d (at %v, key %q, cost %d): %s", i, st.At, key, cost, msg)
				}
				leases[i] = core.Lease{Policy: p, Key: key, Token: d.At, Cost: cost, Fallback: d.Fallback}
				shaped[i], _ = core.NewLimiter(p, store).Shaped(key, &d)
			}
		})
	}
	t.Run("random_against_reference_model", func(t *testing.T) {
		seeds := o.Seeds
		if seeds == 0 {
			seeds = TokenSeed
		}
		var total, denied int
		for seed := uint64(1); seed <= uint64(seeds); seed++ {
			n, d := RandomTrace(t, newStore, seed, 400, o)
			total, denied = total+n, denied+d
		}
		// The suite must exercise denials, retry-after and all-or-nothing.
		if 3*denied < total {
			t.Fatalf("only %d of %d random requests denied: the traces must deny at least a third", denied, total)
		}
		t.Logf("%d random requests, %d denied by the limits", total, denied)
	})
}

func mismatch(d *core.Decision, w Want) string {
	got := fmt.Sprintf("allowed=%v shadowed=%v index=%d remaining=%d reset=%v retry=%v delay=%v",
		d.Allowed, d.Shadowed, d.Index, d.Remaining, d.Reset, d.RetryAfter, d.Delay)
	want := fmt.Sprintf("allowed=%v shadowed=%v index=%d remaining=%d reset=%v retry=%v delay=%v",
		w.Allowed, w.Shadowed, w.Index, w.Remaining, w.Reset, w.RetryAfter, w.Delay)
	if got != want {
		return "got  " + got + "\nwant " + want
	}
	for i, wr := range w.Results {
		r := d.Results[i]
		if r.Allowed != wr.Allowed || r.Remaining != wr.Remaining {
			return fmt.Sprintf("limit %d: got allowed=%v remaining=%d, want allowed=%v remaining=%d",
				i, r.Allowed, r.Remaining, wr.Allowed, wr.Remaining)
		}
	}
	return ""
}

// randomBuckets are the random traces' token bucket (20/s, burst 7), GCRA
// (7 per 700 ms, burst gcraBurst) and leaky bucket (9/s, held up to 400 ms).
func randomBuckets(gcraBurst int64) (tb, g, lb algo.Limit) {
	tb = lim(20, time.Second, algo.TokenBucket)
	tb.Burst = 7
	g = lim(7, 700*time.Millisecond, algo.GCRA)
	g.Burst = gcraBurst
	lb = lim(9, time.Second, algo.LeakyBucket)
	lb.MaxDelay = ms(400)
	return tb, g, lb
}

// RandomPolicies returns tight policies covering every algorithm alone,
// stacked and in shadow mode.
func RandomPolicies() []*core.Policy {
	o := core.PolicyOptions{}
	tb, g, lb := randomBuckets(3)
	return []*core.Policy{
		core.MustPolicy("r-fw", o, lim(5, ms(300), algo.FixedWindow)),
		core.MustPolicy("r-sl", o, lim(6, ms(500), algo.SlidingLog)),
		core.MustPolicy("r-sc", o, lim(13, ms(700), algo.SlidingCounter)),
		core.MustPolicy("r-tb", o, tb),
		core.MustPolicy("r-gcra", o, g),
		core.MustPolicy("r-lb", o, lb),
		core.MustPolicy("r-stack", o, lim(4, ms(200), algo.SlidingLog), lim(9, time.Second, algo.SlidingCounter), tb, lim(30, 3*time.Second, algo.FixedWindow)),
		core.MustPolicy("r-counters", o, lim(3, ms(100), algo.FixedWindow), lim(8, ms(900), algo.SlidingCounter)),
		// A sliding log after a limit without a sorted set (the Redis store
		// sends only the sets a script reads).
		core.MustPolicy("r-log-second", o, lim(7, ms(400), algo.FixedWindow), lim(4, ms(300), algo.SlidingLog)),
		core.MustPolicy("r-shadow", core.PolicyOptions{Shadow: true}, lim(3, ms(250), algo.SlidingCounter), lim(5, time.Second, algo.FixedWindow)),
		core.MustPolicy("r-shadow-log", core.PolicyOptions{Shadow: true}, lim(2, ms(300), algo.SlidingLog)),
		// Seeds divisible by 3 start 2 s before a month ends (see RandomTrace).
		core.MustPolicy("r-calendar", o, lim(25, algo.CalendarMonth, algo.FixedWindow), lim(3, ms(250), algo.FixedWindow)),
		// Leases ended or renewed now and then (see RandomTrace).
		core.MustPolicy("r-inflight", o, lim(8, ms(300), algo.InFlight)),
		core.MustPolicy("r-inflight-stack", o, lim(2, ms(500), algo.InFlight), lim(6, time.Second, algo.SlidingCounter)),
	}
}

// ReserveSeed is the random trace whose policies hold a reserve back for
// priority 1: its requests come at priority 0, 1 or 2 (ReservePolicies).
const ReserveSeed = 10

// TokenSeed is the random trace of token budgets (TokenPolicies): limits
// of thousands charged after the response what a language model's answer
// spent, 0 to 800 units, and now and then 5,000, more than any of them
// holds (charged at most MaxCharge).
const TokenSeed = 11

// TokenPolicies are token budgets: limits of hundreds to thousands of
// units charged after the response, of each algorithm that may be, alone
// and under a limit of requests.
func TokenPolicies() []*core.Policy {
	o := core.PolicyOptions{}
	tb := lim(4000, time.Second, algo.TokenBucket)
	tb.Burst = 1500
	g := lim(2500, ms(600), algo.GCRA)
	g.Burst = 800
	return []*core.Policy{
		core.MustPolicy("t-fw", o, afterResponse(lim(2000, ms(500), algo.FixedWindow))),
		core.MustPolicy("t-sc", o, afterResponse(lim(3000, ms(800), algo.SlidingCounter))),
		core.MustPolicy("t-tb", o, afterResponse(tb)),
		core.MustPolicy("t-gcra", o, afterResponse(g)),
		core.MustPolicy("t-sl", o, afterResponse(lim(400, ms(300), algo.SlidingLog))),
		core.MustPolicy("t-requests", o, lim(12, ms(200), algo.FixedWindow), afterResponse(lim(2500, time.Second, algo.SlidingCounter))),
	}
}

// ReservePolicies hold a share of each limit back for priority 1 and
// above, over limits of every algorithm and stacked.
// Their Family holds the policy below the reserve.
func ReservePolicies() []*core.Policy {
	r := core.Reserve{Share: 0.3, Level: 1}
	tb, g, lb := randomBuckets(4)
	return []*core.Policy{
		reserved("v-fw", &r, lim(6, ms(300), algo.FixedWindow)),
		reserved("v-sl", &r, lim(6, ms(500), algo.SlidingLog)),
		reserved("v-stack", &r, tb, lim(13, ms(700), algo.SlidingCounter), g),
		reserved("v-lb", &r, lb),
		reserved("v-inflight", &r, lim(8, ms(300), algo.InFlight)),
		reserved("v-charged", &r, afterResponse(lim(5, ms(300), algo.FixedWindow)), algo.PenaltyLimit(3, time.Second, ms(200))),
	}
}

// PenaltySeed is the random trace whose policies have a penalty box
// (PenaltyPolicies).
const PenaltySeed = 9

// PenaltyPolicies have a penalty box under limits of each kind, charged
// with the request or after the response, and in shadow mode.
func PenaltyPolicies() []*core.Policy {
	o := core.PolicyOptions{}
	tb, _, _ := randomBuckets(3)
	return []*core.Policy{
		core.MustPolicy("p-fw", o, lim(3, ms(100), algo.FixedWindow), algo.PenaltyLimit(4, time.Second, ms(300))),
		core.MustPolicy("p-sl", o, lim(2, ms(200), algo.SlidingLog), algo.PenaltyLimit(2, ms(500), ms(150))),
		core.MustPolicy("p-stack", o, tb, lim(9, time.Second, algo.SlidingCounter), algo.PenaltyLimit(3, ms(700), ms(400))),
		core.MustPolicy("p-charged", o, afterResponse(lim(5, ms(300), algo.FixedWindow)), algo.PenaltyLimit(3, time.Second, ms(200))),
		core.MustPolicy("p-shadow", core.PolicyOptions{Shadow: true}, lim(3, ms(250), algo.SlidingCounter), algo.PenaltyLimit(2, time.Second, ms(300))),
	}
}

// ChargeSeed is the random trace whose policies have limits charged after
// the response (ChargePolicies): after an allowed request, its response's
// cost, often more than the limit has left, is charged a few steps later.
const ChargeSeed = 8

// ChargePolicies have limits charged after the response, alone and
// stacked with limits charged with the request.
func ChargePolicies() []*core.Policy {
	o := core.PolicyOptions{}
	tb, g, _ := randomBuckets(3)
	return []*core.Policy{
		core.MustPolicy("c-fw", o, afterResponse(lim(5, ms(300), algo.FixedWindow))),
		core.MustPolicy("c-sl", o, afterResponse(lim(4, ms(400), algo.SlidingLog))),
		core.MustPolicy("c-mixed", o, tb, afterResponse(g), afterResponse(lim(9, time.Second, algo.SlidingCounter))),
		core.MustPolicy("c-counters", o, lim(3, ms(100), algo.FixedWindow), afterResponse(lim(8, ms(900), algo.SlidingCounter))),
		core.MustPolicy("c-log-stack", o, lim(7, ms(400), algo.FixedWindow), afterResponse(lim(4, ms(300), algo.SlidingLog))),
		core.MustPolicy("c-shadow", core.PolicyOptions{Shadow: true}, afterResponse(lim(3, ms(250), algo.SlidingCounter))),
		core.MustPolicy("c-bucket", o, afterResponse(tb)),
	}
}

// ReloadSeed is the random trace whose requests switch between
// ReloadPolicies on the same keys.
const ReloadSeed = 7

// ReloadPolicies are one name with three sets of limits, as reloads make
// them: each limit's usage is kept across them. A limit they share has one
// count in all (the model keeps one history per limit; a changed count is
// the golden trace limits_change_keeps_usage's).
func ReloadPolicies() []*core.Policy {
	o := core.PolicyOptions{}
	return []*core.Policy{
		core.MustPolicy("r-reload", o, lim(3, ms(100), algo.FixedWindow), lim(8, ms(900), algo.SlidingCounter)),
		core.MustPolicy("r-reload", o, lim(8, ms(900), algo.SlidingCounter)),
		core.MustPolicy("r-reload", o, lim(3, ms(100), algo.FixedWindow), lim(11, ms(500), algo.SlidingCounter)),
	}
}

// RandomTrace replays n random requests on a store and on the reference
// model and requires identical decisions: four of the policies the store
// supports (ReloadPolicies for seed ReloadSeed), one of two keys, cost 0..3, time moving on mostly by 0..3 ms,
// one time in six by up to 60 ms, and now and then by a clock step of up to
// 3 s (on a 10 or 1 ms grid for odd seeds; seeds divisible by 3 cross the end of
// a calendar month). It returns how many requests
// it sent and how many the limits denied.
//
// A store that expires idle keys by real time (Redis) may forget a key the
// trace's virtual clock still holds live, when the machine runs the trace
// slower than its clock: a key untouched for its policy's idle time in
// real time, but not in virtual time. A mismatch on such a key reruns the
// trace with a fresh store, at most twice; the last run fails as any other.
func RandomTrace(t *testing.T, newStore Factory, seed uint64, n int, o Options) (sent, denied int) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		var outran string
		sent, denied, outran = randomTrace(t, newStore, seed, n, o, attempt < 3)
		if outran == "" {
			return sent, denied
		}
		t.Logf("seed %d, run %d: %s; running the trace again", seed, attempt, outran)
	}
}

// outranClock is what randomTrace panics with when a mismatch falls on a
// key real time may have expired (see RandomTrace).
type outranClock struct{ msg string }

// randomTrace is one run of RandomTrace. With retry, a mismatch on a key
// whose store may have expired it by real time ends the run and returns
// what happened (outran); otherwise every mismatch fails t.
func randomTrace(t *testing.T, newStore Factory, seed uint64, n int, o Options, retry bool) (sent, denied int, outran string) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			oc, ok := r.(outranClock)
			if !ok {
				panic(r)
			}
			outran = oc.msg
		}
	}()
	// Per policy and key: when it last took something, in real and virtual
	// time, and whether real time has since passed its idle time while
	// virtual time had not (the store may have expired it).
	type touch struct {
		real    time.Time
		virtual int64
	}
	touched := map[string]touch{}
	mayBeExpired := map[string]bool{}
	fatalf := func(p *core.Policy, key, format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if retry && mayBeExpired[p.Name()+"|"+key] {
			panic(outranClock{fmt.Sprintf("policy %s key %s sat idle for its idle time %s in real time but not on the trace's clock, then: %s",
				p.Name(), key, time.Duration(p.StoreSide().IdleMicros())*time.Microsecond, msg)})
		}
		t.Fatal(msg)
	}
	// noteIdle marks p's key as possibly expired if, before an operation on
	// it at (µs, the trace's clock), its idle time has passed in real time
	// but not on the trace's clock since it last took something.
	noteIdle := func(p *core.Policy, key string, at int64) {
		id, idle := p.Name()+"|"+key, p.StoreSide().IdleMicros()
		if last, ok := touched[id]; ok && time.Since(last.real) >= time.Duration(idle)*time.Microsecond && at-last.virtual < idle {
			mayBeExpired[id] = true
		}
	}
	clock := &core.ManualClock{Micros: T0}
	if seed%3 == 0 {
		// 30 Nov 2023 23:59:58 UTC: calendar months roll over mid-trace.
		clock.Micros = T0 + int64((16*day-2*time.Second)/time.Microsecond)
	}
	store := newStore(t, clock)
	var policies []*core.Policy
	for _, p := range RandomPolicies() {
		if o.supports(p) {
			policies = append(policies, p)
		}
	}
	model := refmodel.NewModel()
	rng := rand.New(rand.NewPCG(seed, 42))
	// Four policies per trace, so each key sees dense traffic over many
	// windows: requests leave sliding windows while others arrive. Seeds
	// take the policies in turn, so every policy is in some odd (on-grid)
	// and some even seed's trace whatever the store supports.
	var chosen []*core.Policy
	for i := 0; i < min(4, len(policies)); i++ {
		chosen = append(chosen, policies[(4*int(seed-1)+i)%len(policies)])
	}
	if seed%3 == 0 && !slices.ContainsFunc(chosen, func(p *core.Policy) bool { return p.Name() == "r-calendar" }) {
		// These seeds cross a month's end: the calendar policy is among theirs.
		for _, p := range policies {
			if p.Name() == "r-calendar" {
				chosen[0] = p
			}
		}
	}
	if seed == ReloadSeed || seed == ChargeSeed || seed == PenaltySeed || seed == ReserveSeed || seed == TokenSeed {
		chosen = nil
		all := ReloadPolicies()
		switch seed {
		case ChargeSeed:
			all = ChargePolicies()
		case TokenSeed:
			all = TokenPolicies()
		case PenaltySeed:
			all = PenaltyPolicies()
		case ReserveSeed:
			all = ReservePolicies()
		}
		for _, p := range all {
			if o.supports(p) {
				chosen = append(chosen, p)
			}
		}
	}
	// Responses whose cost is still to be charged (ChargeSeed).
	var owed []Request
	policies = chosen
	if len(policies) == 0 {
		return 0, 0, "" // the store decides none of this seed's policies (eventual mode, penalty boxes)
	}
	// Odd seeds keep time on a grid every window length is a multiple of (10
	// ms for seeds 1, 5, ..., 1 ms for 3, 7, ...), so requests land exactly
	// on window boundaries and on the instant an old request leaves a
	// window; even seeds use any µs.
	grid := int64(1)
	switch seed % 4 {
	case 1:
		grid = 10_000
	case 3:
		grid = 1000
	}
	var held []core.Lease    // leases the store holds for allowed requests
	var queued []core.Shaped // shaped requests whose clients may leave
	// Requests not yet sent: one at a time, or in runs through a Batcher.
	var pending []Request
	var steps []int          // each pending request's step
	var reused core.Decision // what requests sent one at a time are decided in
	batcher, _ := store.(Batcher)
	batch := 1
	if batcher != nil && o.Batch > 1 {
		batch = o.Batch
	}
	decided := func(i int, r Request, got *core.Decision) {
		want := model.Decide(r.Policy, r.Key, r.At, r.Cost)
		if !sameDecision(got, &want) {
			fatalf(r.Policy, r.Key, "seed %d step %d (policy %s key %s cost %d at +%dµs):\n got  %s\n want %s",
				seed, i, r.Policy.Name(), r.Key, r.Cost, r.At-T0, summary(got), summary(&want))
		}
		if id := r.Policy.Name() + "|" + r.Key; got.Allowed && r.Cost > 0 || r.Policy.StoreSide().ChargesAfterResponse() {
			touched[id] = touch{time.Now(), r.At}
		}
		if c := Family(r.Policy).Charging(r.Policy); c != nil && got.Allowed && len(owed) < 8 {
			// Its response costs 0 to 5 units, or now and then 3 times a
			// limit's count or so (charged at most MaxCharge).
			cost := rng.Int64N(6)
			if rng.IntN(8) == 0 {
				cost = 25
			}
			if seed == TokenSeed { // an answer's tokens
				cost = rng.Int64N(801)
				if rng.IntN(8) == 0 {
					cost = 5000
				}
			}
			owed = append(owed, Request{Policy: c, Key: r.Key, Cost: cost})
		}
		sent++
		if !want.Allowed || want.Shadowed {
			denied++
		}
		if r.Policy.HoldsLeases() && got.Allowed && !got.Shadowed && r.Cost > 0 {
			held = append(held, core.Lease{Policy: r.Policy, Key: r.Key, Token: got.At, Cost: r.Cost, Fallback: got.Fallback})
		}
		if sh, ok := core.NewLimiter(r.Policy, store).Shaped(r.Key, got); ok && len(queued) < 8 {
			queued = append(queued, sh)
		}
	}
	flush := func() {
		defer func() { pending, steps = pending[:0], steps[:0] }()
		if len(pending) == 0 {
			return
		}
		for _, r := range pending {
			noteIdle(r.Policy, r.Key, r.At)
		}
		got := make([]core.Decision, len(pending))
		if batch == 1 {
			// Into the Decision the trace's last request was decided in, as
			// a caller reuses one: Decide must write every field it reports.
			r := pending[0]
			if err := store.Decide(context.Background(), r.Policy, r.Key, r.Cost, &reused); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, steps[0], err)
			}
			got[0] = reused
		} else {
			for j, err := range batcher.DecideBatch(context.Background(), pending, got) {
				if err != nil {
					t.Fatalf("seed %d step %d (request %d of a batch of %d): %v", seed, steps[j], j+1, len(pending), err)
				}
			}
		}
		for j := range pending {
			decided(steps[j], pending[j], &got[j])
		}
	}
	// Operators read and reset keys now and then, on their own random
	// stream so the requests' sequence is the same with or without them.
	ops := rand.New(rand.NewPCG(seed, 99))
	op, _ := store.(core.Operator)
	for i := 0; i < n; i++ {
		if op != nil {
			p, key := policies[ops.IntN(len(policies))], "key"+strconv.Itoa(ops.IntN(2))
			switch ops.IntN(40) {
			case 0:
				flush()
				limit := ops.IntN(len(p.Limits())+1) - 1 // one limit, or all
				if err := op.Reset(context.Background(), p, key, limit); err != nil {
					t.Fatalf("seed %d step %d: reset limit %d: %v", seed, i, limit, err)
				}
				model.Reset(p, key, limit)
			case 1, 2, 3:
				flush()
				var got core.Decision
				noteIdle(p, key, clock.Micros)
				if err := op.Inspect(context.Background(), p, key, &got); err != nil {
					t.Fatalf("seed %d step %d: inspect: %v", seed, i, err)
				}
				if want := model.Decide(p, key, clock.Micros, 0); !sameDecision(&got, &want) {
					fatalf(p, key, "seed %d step %d (inspect policy %s key %s at +%dµs):\n got  %s\n want %s",
						seed, i, p.Name(), key, clock.Micros-T0, summary(&got), summary(&want))
				}
			}
		}
		if len(queued) > 0 && ops.IntN(20) == 0 {
			// A shaped request's client leaves (before or after its release).
			flush()
			j := ops.IntN(len(queued))
			if err := store.(core.ShapeStore).CancelShaped(context.Background(), &queued[j]); err != nil {
				t.Fatalf("seed %d step %d: cancel: %v", seed, i, err)
			}
			model.CancelShaped(&queued[j], clock.Micros)
			queued = append(queued[:j], queued[j+1:]...)
		}
		if len(held) > 0 && rng.IntN(4) == 0 {
			// A response finishes (or a long one renews its lease).
			flush()
			j := rng.IntN(len(held))
			l, renew := held[j], rng.IntN(3) == 0
			noteIdle(l.Policy, l.Key, clock.Micros)
			found, _, err := store.(core.LeaseStore).EndLease(context.Background(), &l, renew)
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, i, err)
			}
			if want := model.EndLease(l.Policy, l.Key, clock.Micros, l.Token, l.Cost, renew); found != want {
				fatalf(l.Policy, l.Key, "seed %d step %d (policy %s key %s, lease of %d taken at +%dµs, renew %v, at +%dµs): found %d slots, want %d",
					seed, i, l.Policy.Name(), l.Key, l.Cost, l.Token-T0, renew, clock.Micros-T0, found, want)
			}
			if renew {
				held[j].Token, held[j].Cost = clock.Micros, found
			} else {
				held = append(held[:j], held[j+1:]...)
			}
		}
		switch r := rng.IntN(150); {
		case r == 0: // a clock step
			clock.Micros += rng.Int64N(3_000_000/grid) * grid
		case r < 25: // a pause
			clock.Micros += rng.Int64N(60_000/grid) * grid
		default: // dense arrivals
			clock.Micros += rng.Int64N(max(2, 3_000/grid)) * grid
		}
		if len(owed) > 0 && rng.IntN(2) == 0 {
			// A response is answered: its cost is charged.
			j := rng.IntN(len(owed))
			c := owed[j]
			owed = append(owed[:j], owed[j+1:]...)
			c.At = clock.Micros
			pending = append(pending, c)
			steps = append(steps, i)
			if len(pending) >= batch {
				flush()
			}
		}
		p := policies[rng.IntN(len(policies))]
		if seed == ReserveSeed {
			p, _ = Family(p).For("", rng.IntN(3))
		}
		key := "key" + strconv.Itoa(rng.IntN(2))
		cost := rng.Int64N(4)
		pending = append(pending, Request{Policy: p, Key: key, Cost: cost, At: clock.Micros})
		steps = append(steps, i)
		if len(pending) >= batch {
			flush()
		}
	}
	flush()
	return sent, denied, ""
}

func sameDecision(a, b *core.Decision) bool {
	return a.N == b.N && summary(a) == summary(b)
}

func summary(d *core.Decision) string {
	s := fmt.Sprintf("allowed=%v shadowed=%v index=%d limit=%d remaining=%d reset=%v retry=%v delay=%v at=%d |",
		d.Allowed, d.Shadowed, d.Index, d.Quota, d.Remaining, d.Reset, d.RetryAfter, d.Delay, d.At-T0)
	for i := 0; i < d.N; i++ {
		s += fmt.Sprintf(" %+v", d.Results[i])
	}
	return s
}
