package headers_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/internal/headercheck"
)

// TestIETFHeadersConsistent renders the headers of every decision of dense,
// deny-heavy random traffic (costs 0..3) through every algorithm, stacked
// limits, shadow mode, an adaptive policy scaled down and windows that are
// not whole seconds, with and without jitter, and checks each response with
// an independent RFC 9651 parser against the draft's rules
// (headercheck.Consistent): r never above q, t never after Retry-After,
// Retry-After never past t plus the jitter, X-RateLimit-* agreeing with t
// and r.
func TestIETFHeadersConsistent(t *testing.T) {
	ctl, err := adaptive.New(adaptive.Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	for i := 0; i < 20; i++ {
		ctl.Observe(503, time.Millisecond)
	}
	ctl.Judge() // factor 0.7
	lim := func(n int64, w time.Duration, a algo.Algorithm, burst int64) algo.Limit {
		l := algo.Limit{Count: n, Window: w, Algorithm: a, Burst: burst}
		if a == algo.LeakyBucket {
			l.MaxDelay = 300 * time.Millisecond
		}
		return l
	}
	policies := []*core.Policy{
		core.MustPolicy("fw", core.PolicyOptions{}, lim(5, 1500*time.Millisecond, algo.FixedWindow, 0)),
		core.MustPolicy("sl", core.PolicyOptions{}, lim(4, 700*time.Millisecond, algo.SlidingLog, 0)),
		core.MustPolicy("sc", core.PolicyOptions{}, lim(6, 2*time.Second, algo.SlidingCounter, 0)),
		core.MustPolicy("tb", core.PolicyOptions{}, lim(10, time.Second, algo.TokenBucket, 15)),
		core.MustPolicy("gcra", core.PolicyOptions{}, lim(10, time.Second, algo.GCRA, 3)),
		core.MustPolicy("lb", core.PolicyOptions{}, lim(8, time.Second, algo.LeakyBucket, 0)),
		core.MustPolicy("stack", core.PolicyOptions{}, lim(3, 250*time.Millisecond, algo.SlidingLog, 0),
			lim(7, time.Second, algo.TokenBucket, 0), lim(20, 3*time.Second, algo.FixedWindow, 0)),
		core.MustPolicy("shadow", core.PolicyOptions{Shadow: true}, lim(2, 500*time.Millisecond, algo.SlidingCounter, 0)),
		core.MustPolicy("adaptive", core.PolicyOptions{Adaptive: ctl}, lim(10, time.Second, algo.SlidingCounter, 0),
			lim(9, time.Second, algo.GCRA, 4)),
		core.MustPolicy("month", core.PolicyOptions{}, lim(3, algo.CalendarMonth, algo.FixedWindow, 0)),
		core.MustPolicy("inflight", core.PolicyOptions{}, lim(3, 2*time.Second, algo.InFlight, 0)),
		core.MustPolicy("inflight-stack", core.PolicyOptions{}, lim(2, time.Second, algo.InFlight, 0),
			lim(6, time.Second, algo.SlidingCounter, 0)),
	}
	clock := &core.ManualClock{Micros: 1_700_000_000_000_000}
	store, err := memory.New(memory.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	denied := 0
	for _, jitter := range []float64{0, 0.5} {
		for _, style := range []headers.Style{headers.Both, headers.IETF, headers.XRateLimit, headers.PerLimit} {
			o := headers.Options{Style: style, Jitter: jitter}
			for i := 0; i < 400; i++ {
				clock.Micros += rng.Int64N(40_000)
				p := policies[rng.IntN(len(policies))]
				var d core.Decision
				cost := rng.Int64N(4)
				if err := store.Decide(context.Background(), p, "k", cost, &d); err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					denied++
				}
				h := http.Header{}
				headers.Write(h, &d, o)
				headercheck.Consistent(t, fmt.Sprintf("%v jitter %v %s cost %d", style, jitter, p.Name(), cost), h, jitter)
			}
		}
	}
	if denied < 3200/4 {
		t.Fatalf("only %d of 3200 decisions denied: the traffic must deny often", denied)
	}
}
