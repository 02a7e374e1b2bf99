package kongplugin_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// TestKongAdaptiveFindsCapacity drives the real plugin server as Kong
// does: an access event per request and, for those let through, a log
// event carrying the status and upstream_response_time of a model
// upstream that serves 50 requests/s, spaced (a burst of 5 at most), and
// refuses the excess with a slow 503, as bench/adaptive's rate-capacity
// model. Offered 150/s through 200/s GCRA (a window algorithm admits in
// bursts: see README) and the default (gradient) controller, the upstream serves at least 80% of its capacity in the last
// 3 s with at most 10% failing; when the load stops, the configured 200/s
// is back.
func TestKongAdaptiveFindsCapacity(t *testing.T) {
	const capacity = 50
	srv := kongproc.StartResponse(t) // adaptive limits need the log phase
	c := srv.Dial()
	defer c.Close()
	id := start(t, c, map[string]any{"second": 200, "limit_by": "ip", "algorithm": "gcra",
		"adaptive": map[string]any{"enabled": true}})
	req := kongproc.Request{ForwardedIP: "192.0.2.1"}
	limitSeen := func(res *kongproc.Result) int {
		n, _ := strconv.Atoi(res.Headers.Get("X-RateLimit-Limit-Second"))
		return n
	}
	every := time.Second / capacity
	var tat time.Time // the upstream's theoretical arrival time (GCRA)
	tick := time.NewTicker(time.Second / 150)
	defer tick.Stop()
	const load, judged = 8 * time.Second, 3 * time.Second
	end := time.Now().Add(load)
	served, failed := 0, 0
	for now := time.Now(); now.Before(end); now = time.Now() {
		<-tick.C
		res := access(t, c, id, req)
		if res.Exited {
			continue
		}
		log := req
		log.Source = "service"
		if tat.Before(now) {
			tat = now
		}
		if tat.Sub(now) > 5*every {
			log.Status, log.UpstreamTime = 503, "0.080"
		} else {
			tat = tat.Add(every)
			log.Status, log.UpstreamTime = 200, "0.020"
		}
		if end.Sub(now) < judged {
			if log.Status == 200 {
				served++
			} else {
				failed++
			}
		}
		if _, err := c.Log(id, log); err != nil {
			t.Fatal(err)
		}
	}
	goodput := float64(served) / judged.Seconds() / capacity
	failing := float64(failed) / float64(max(1, served+failed))
	t.Logf("150/s offered through 200/s to an upstream of 50/s for %s: last %s goodput %.2fC, %.1f%% failing", load, judged, goodput, 100*failing)
	if goodput < 0.8 || failing > 0.10 {
		t.Errorf("goodput %.2fC with %.1f%% failing once settled, want ≥ 0.8C and ≤ 10%%", goodput, 100*failing)
	}
	// Kong's own denials reach the log phase too: they must not count.
	for i := 0; i < 50; i++ {
		_, _ = c.Log(id, kongproc.Request{ForwardedIP: "192.0.2.1", Source: "exit", Status: 429})
	}
	back := waitfor.True(t, 10*time.Second, "the configured 200/s back after the load stopped", func() bool {
		return limitSeen(access(t, c, id, req)) == 200
	})
	t.Logf("limit back to 200/s %s after the load stopped", back.Round(100*time.Millisecond))
}
