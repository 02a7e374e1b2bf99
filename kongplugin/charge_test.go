package kongplugin_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/redistest"
)

// TestKongChargesFailedLogins drives the real tollgate-response plugin
// server as Kong does: its access event decides, its log event (Kong's
// log phase, with the response's status) charges. Only 401s count: 20
// successful logins leave all 5 attempts, then 5 failures use them up and
// the next request is refused with Kong's denial. The headers of a
// response were set in its access phase, so a charge shows from the next
// request on.
func TestKongChargesFailedLogins(t *testing.T) {
	srv := kongproc.StartResponse(t) // charges are made in the log phase
	c := srv.Dial()
	defer c.Close()
	id := start(t, c, map[string]any{"minute": 5, "limit_by": "ip", "algorithm": "sliding_log",
		"charge": map[string]any{"status": []any{"401", "403"}, "header": nil, "values": nil, "cost_header": nil, "cost_entry": nil, "cost": nil}})
	login := func(status int) *kongproc.Result {
		t.Helper()
		req := kongproc.Request{ForwardedIP: "192.0.2.9", Shared: map[string]any{}}
		res := access(t, c, id, req)
		if res.Exited {
			return res
		}
		req.Status, req.Source = status, "service"
		if _, err := c.Log(id, req); err != nil {
			t.Fatal(err)
		}
		return res
	}
	for i := 0; i < 20; i++ {
		res := login(200)
		if res.Exited {
			t.Fatalf("successful login %d refused: %d", i+1, res.Status)
		}
		header(t, "successful login", res, map[string]string{"X-Ratelimit-Remaining-Minute": "5"})
	}
	for i := 0; i < 5; i++ {
		if res := login(401); res.Exited {
			t.Fatalf("failed login %d refused: %d", i+1, res.Status)
		}
	}
	res := login(200)
	if !res.Exited || res.Status != 429 {
		t.Fatalf("after 5 failed logins: exited %v status %d, want 429", res.Exited, res.Status)
	}
	header(t, "refused", res, map[string]string{"X-Ratelimit-Remaining-Minute": "0"})
}

// TestKongChargesReportedCost: two tollgate-response plugin servers on one
// Redis charge the cost the upstream reports in an entry of a response
// header (kong.service.response.get_header): a budget of 1,000 a minute is
// spent by 150-unit calls, whichever node served them, and overdrawn by
// at most one call.
func TestKongChargesReportedCost(t *testing.T) {
	rs := redistest.StartT(t)
	cfg := map[string]any{"minute": 1000, "limit_by": "header", "header_name": "X-Client", "algorithm": "sliding_log",
		"policy": "redis", "redis": rs.KongRecord(),
		"charge": map[string]any{"status": []any{"2xx"}, "header": nil, "values": nil, "cost_header": "X-Usage", "cost_entry": "total", "cost": nil}}
	nodes := []*kongproc.Server{kongproc.StartResponse(t), kongproc.StartResponse(t)}
	var clients []*kongproc.Client
	var ids []int32
	for _, n := range nodes {
		c := n.Dial()
		defer c.Close()
		clients, ids = append(clients, c), append(ids, start(t, c, cfg))
	}
	served := 0
	for i := 0; i < 20; i++ {
		c, id := clients[i%2], ids[i%2]
		req := kongproc.Request{ForwardedIP: "192.0.2.9", Headers: http.Header{"X-Client": {"alice"}}, Shared: map[string]any{}}
		if res := access(t, c, id, req); res.Exited {
			break
		}
		served++
		req.Status, req.Source = 200, "service"
		req.ServiceHeaders = http.Header{"X-Usage": {"prompt=40, total=150"}}
		if _, err := c.Log(id, req); err != nil {
			t.Fatal(err)
		}
	}
	if served != 7 {
		t.Fatalf("served %d calls of 150 before the first 429, want 7 (six leave 100 of 1,000; the seventh overdraws by 50)", served)
	}
}

// TestKongPenaltyBox drives the real tollgate plugin server (access phase
// only: the box counts denials as it decides): two requests a minute, and
// the second denial within an hour refuses the client for an hour, with
// Kong's denial and a Retry-After of the box's end.
func TestKongPenaltyBox(t *testing.T) {
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	// A sliding log, and the box's count over an hour's window: no window
	// boundary between the test's requests can reset a count.
	id := start(t, c, map[string]any{"minute": 2, "limit_by": "ip", "algorithm": "sliding_log",
		"penalty": map[string]any{"denials": 2, "within": 3600, "duration": 3600}})
	req := kongproc.Request{ForwardedIP: "192.0.2.7"}
	for i := 0; i < 2; i++ {
		if res := access(t, c, id, req); res.Exited {
			t.Fatalf("request %d: %d", i+1, res.Status)
		}
	}
	if res := access(t, c, id, req); !res.Exited || res.Status != 429 || res.Headers.Get("Retry-After") == "3600" {
		t.Fatalf("first denial: exited %v %d, Retry-After %q; want 429 with the minute's Retry-After", res.Exited, res.Status, res.Headers.Get("Retry-After"))
	}
	for i := 0; i < 3; i++ {
		res := access(t, c, id, req)
		if retry, _ := strconv.Atoi(res.Headers.Get("Retry-After")); !res.Exited || res.Status != 429 || retry < 3590 || retry > 3600 {
			t.Fatalf("in the box: exited %v %d, Retry-After %q; want 429 until the hour's box ends", res.Exited, res.Status, res.Headers.Get("Retry-After"))
		}
	}
	if res := access(t, c, id, kongproc.Request{ForwardedIP: "192.0.2.8"}); res.Exited {
		t.Fatalf("another client: %d, want it through", res.Status)
	}
}

// TestKongReserveForCriticalTraffic drives the real tollgate plugin server:
// 20% of 10 a minute is held back for requests whose X-Priority is 1 or
// more (one request.get_header call more per request, only with a
// reserve): the rest are refused after 8, critical ones get the last 2.
func TestKongReserveForCriticalTraffic(t *testing.T) {
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	id := start(t, c, map[string]any{"minute": 10, "limit_by": "ip", "algorithm": "sliding_log",
		"reserve": map[string]any{"share": 0.2, "level": 1, "priority_header": "X-Priority"}})
	req := func(priority string) kongproc.Request {
		return kongproc.Request{ForwardedIP: "192.0.2.5", Headers: http.Header{"X-Priority": {priority}}}
	}
	for i := 0; i < 8; i++ {
		if res := access(t, c, id, req("")); res.Exited {
			t.Fatalf("request %d: %d, want it through (8 of 10 are unreserved)", i+1, res.Status)
		}
	}
	if res := access(t, c, id, req("0")); !res.Exited || res.Status != 429 {
		t.Fatalf("priority 0 past the unreserved 8: exited %v %d, want 429", res.Exited, res.Status)
	}
	for i := 0; i < 2; i++ {
		if res := access(t, c, id, req("1")); res.Exited {
			t.Fatalf("critical request %d: %d, want it through", i+1, res.Status)
		}
	}
	if res := access(t, c, id, req("5")); !res.Exited || res.Status != 429 {
		t.Fatalf("critical request past the whole limit: exited %v %d, want 429", res.Exited, res.Status)
	}
}
