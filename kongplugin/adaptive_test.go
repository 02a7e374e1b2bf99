package kongplugin_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/kongproc"
)

// TestKongAdaptiveFollowsUpstream drives the real plugin server as Kong
// does: an access event per request and, for those let through, a log
// event carrying the status and upstream_response_time of a model upstream
// that handles 50 requests/s and fails the excess slowly. Offered 150/s, the
// effective limit (seen in the headers) falls to about the capacity; when
// the load stops, it climbs back to the configured 200/s.
func TestKongAdaptiveFollowsUpstream(t *testing.T) {
	const capacity = 50
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	id := start(t, c, map[string]any{"second": 200, "limit_by": "ip", "algorithm": "sliding_counter",
		"adaptive": map[string]any{"interval": 0.5, "latency": 50}})
	req := kongproc.Request{ForwardedIP: "192.0.2.1"}
	var served []time.Time // upstream's successes in the last second
	limitSeen := func(res *kongproc.Result) int {
		n, _ := strconv.Atoi(res.Headers.Get("X-RateLimit-Limit-Second"))
		return n
	}
	tick := time.NewTicker(time.Second / 150)
	defer tick.Stop()
	end := time.Now().Add(6 * time.Second)
	lastLimit, failedLate, late := 0, 0, 0
	for now := time.Now(); now.Before(end); now = time.Now() {
		<-tick.C
		res := access(t, c, id, req)
		if l := limitSeen(res); l > 0 {
			lastLimit = l
		}
		if res.Exited {
			continue
		}
		for len(served) > 0 && now.Sub(served[0]) > time.Second {
			served = served[1:]
		}
		log := req
		log.Source = "service"
		if len(served) >= capacity {
			log.Status, log.UpstreamTime = 503, "0.080"
		} else {
			served = append(served, now)
			log.Status, log.UpstreamTime = 200, "0.002"
		}
		if end.Sub(now) < 2*time.Second {
			late++
			if log.Status != 200 {
				failedLate++
			}
		}
		if _, err := c.Log(id, log); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("offered 150/s to an upstream of 50/s for 6 s: effective limit %d/s at the end, %d of %d failed in the last 2 s", lastLimit, failedLate, late)
	if lastLimit > 100 {
		t.Errorf("effective limit %d/s under 3x overload, want it near the capacity %d", lastLimit, capacity)
	}
	if late == 0 || float64(failedLate) > 0.4*float64(late) {
		t.Errorf("%d of %d requests still failed at the end", failedLate, late)
	}
	// Kong's own denials reach the log phase too: they must not count.
	for i := 0; i < 50; i++ {
		_, _ = c.Log(id, kongproc.Request{ForwardedIP: "192.0.2.1", Source: "exit", Status: 429})
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && lastLimit != 200 {
		time.Sleep(200 * time.Millisecond)
		lastLimit = limitSeen(access(t, c, id, req))
	}
	if lastLimit != 200 {
		t.Fatalf("effective limit %d/s after the load stopped, want the configured 200", lastLimit)
	}
}
