package caddymodule_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/redistest"
)

// loginUpstream is a login endpoint: 401 to a wrong password (X-Password
// other than "right"), else 200 "welcome".
func loginUpstream(t *testing.T) *httptest.Server {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Password") != "right" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, "welcome")
	}))
	t.Cleanup(upstream.Close)
	return upstream
}

// TestCaddyChargesFailedLogins: a real Caddy in front of a login upstream
// that answers 401 to a wrong password counts only the 401s: successful
// logins never count, the fifth wrong password leaves the client's
// headers at 0 remaining, and the sixth attempt, right or wrong, is
// refused with a Retry-After until the first failure leaves the window.
func TestCaddyChargesFailedLogins(t *testing.T) {
	upstream := loginUpstream(t)
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy login {
			key {client_ip}
			limit 5/10m sliding_log
			charge {
				status 401 403
			}
		}
		headers ietf
	}
	reverse_proxy `+strings.TrimPrefix(upstream.URL, "http://"))
	remaining := func(resp *http.Response) string {
		v := resp.Header.Get("RateLimit")
		_, r, _ := strings.Cut(v, ";r=")
		r, _, _ = strings.Cut(r, ";")
		return r
	}
	for i := 0; i < 20; i++ {
		resp, body := c.Get("/login", "X-Password", "right")
		if resp.StatusCode != 200 || body != "welcome" || remaining(resp) != "5" {
			t.Fatalf("successful login %d: %d %q, RateLimit %q; want 200, remaining 5 (successes are not counted)", i+1, resp.StatusCode, body, resp.Header.Get("RateLimit"))
		}
	}
	for i := 1; i <= 5; i++ {
		resp, _ := c.Get("/login", "X-Password", "wrong")
		if resp.StatusCode != 401 || remaining(resp) != strconv.Itoa(5-i) {
			t.Fatalf("wrong password %d: %d, RateLimit %q; want 401 with remaining %d", i, resp.StatusCode, resp.Header.Get("RateLimit"), 5-i)
		}
	}
	for _, pw := range []string{"wrong", "right"} {
		resp, _ := c.Get("/login", "X-Password", pw)
		retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != 429 || retry < 500 || retry > 600 {
			t.Fatalf("after 5 failures, password %s: %d, Retry-After %q; want 429 until the first failure leaves the 10 min window", pw, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
}

// TestCaddyChargesReportedTokens: two Caddies on one Redis in front of an
// upstream that reports each call's cost in a header (as an LLM upstream
// reports tokens): a client's budget of 1,000 tokens a minute is spent by
// the reported costs, whichever node served the call, and overdrawn by at
// most one call's cost: the call that found 100 tokens left and used 150.
func TestCaddyChargesReportedTokens(t *testing.T) {
	srv := redistest.StartT(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lines := r.URL.Query()["line"]; len(lines) > 0 { // the report split over header lines
			for _, l := range lines {
				w.Header().Add("X-Usage", l)
			}
		} else {
			w.Header().Set("X-Usage", "prompt=40, total="+r.URL.Query().Get("tokens"))
		}
		fmt.Fprint(w, "completion")
	}))
	defer upstream.Close()
	body := fmt.Sprintf(`
	tollgate {
		store redis redis://%s
		policy tokens {
			key {http.request.header.X-Client}
			limit 1000/1m sliding_log
			charge {
				status 2xx
				cost_header X-Usage total
			}
		}
		headers ietf
	}
	reverse_proxy %s`, srv.Addr, strings.TrimPrefix(upstream.URL, "http://"))
	nodes := []*caddyproc.Caddy{caddyproc.Start(t, body), caddyproc.Start(t, body)}
	served, spent := 0, 0
	for i := 0; i < 20; i++ {
		resp, _ := nodes[i%2].Get("/v1/chat?tokens=150", "X-Client", "alice")
		if resp.StatusCode == 429 {
			break
		}
		if resp.StatusCode != 200 {
			t.Fatalf("call %d: status %d", i+1, resp.StatusCode)
		}
		served++
		spent += 150
		// The charge is taken before the status goes out: the response
		// shows what it left.
		if left, want := available(resp.Header.Get("RateLimit")), max(0, 1000-spent); left != want {
			t.Errorf("call %d: RateLimit %q, want r=%d after its charge", i+1, resp.Header.Get("RateLimit"), want)
		}
	}
	if served != 7 || spent-1000 > 150 {
		t.Fatalf("served %d calls of 150 tokens (%d tokens) before the first 429; want 7: six leave 100 of 1,000, the seventh overdraws by 50", served, spent)
	}
	// The budget is the client's, on every node, and reported truthfully.
	for _, node := range nodes {
		resp, _ := node.Get("/v1/chat?tokens=1", "X-Client", "alice")
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("after the budget: %d, Retry-After %q; want 429 with Retry-After on both nodes", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if resp, _ := node.Get("/v1/chat?tokens=1", "X-Client", "bob"); resp.StatusCode != 200 {
			t.Fatalf("another client: %d, want 200", resp.StatusCode)
		}
	}
	// A report split over two header lines reads as one field; a number
	// too large to hold takes the whole budget, however many digits.
	for _, tc := range []struct {
		query string
		left  int
	}{
		{"line=total%3D10&line=total%3D20", 980}, // the last entry of total: 20
		{"line=total%3D10,%20total%3D20", 960},   // one line, the same
		{"line=prompt%3D1&line=total%3D" + strings.Repeat("9", 65), 0},
	} {
		resp, _ := nodes[0].Get("/v1/chat?"+tc.query, "X-Client", "carol")
		if resp.StatusCode != 200 || available(resp.Header.Get("RateLimit")) != tc.left {
			t.Errorf("%s: %d RateLimit %q, want 200 and r=%d", tc.query, resp.StatusCode, resp.Header.Get("RateLimit"), tc.left)
		}
	}
	if resp, _ := nodes[1].Get("/v1/chat?tokens=1", "X-Client", "carol"); resp.StatusCode != 429 {
		t.Errorf("after an absurd report: %d, want 429", resp.StatusCode)
	}
}

// available is the r parameter of a RateLimit field (-1 when absent).
func available(field string) int {
	m := regexp.MustCompile(`;r=(\d+)`).FindStringSubmatch(field)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestCaddyPenaltyBoxAfterFailedLogins: 5 wrong passwords per 10 min per
// client, counted after the response (successful logins never count),
// then the client's next attempt is its first denial, which puts it in
// the penalty box for an hour: every attempt, right or wrong, is refused
// with Retry-After the box's end, not the 10 min window's. Operators see
// the box as the key's "penalty" limit and reset the key to let it in.
func TestCaddyPenaltyBoxAfterFailedLogins(t *testing.T) {
	upstream := loginUpstream(t)
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy login {
			key {client_ip}
			limit 5/10m sliding_log
			charge {
				status 401
			}
			penalty 1/10m 1h
			clear_keys
		}
	}
	reverse_proxy `+strings.TrimPrefix(upstream.URL, "http://"))
	for i := 0; i < 10; i++ {
		if resp, _ := c.Get("/login", "X-Password", "right"); resp.StatusCode != 200 {
			t.Fatalf("successful login %d: %d", i+1, resp.StatusCode)
		}
	}
	for i := 0; i < 5; i++ {
		if resp, _ := c.Get("/login", "X-Password", "wrong"); resp.StatusCode != 401 {
			t.Fatalf("wrong password %d: %d, want 401", i+1, resp.StatusCode)
		}
	}
	for _, pw := range []string{"right", "wrong", "right"} {
		resp, _ := c.Get("/login", "X-Password", pw)
		retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != 429 || retry < 3500 || retry > 3600 {
			t.Fatalf("in the box, password %s: %d, Retry-After %q; want 429 until the hour's box ends", pw, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	code, body := adminCall(t, c, "GET", "/tollgate/keys?policy=login&key=127.0.0.1")
	if code != 200 || !strings.Contains(fmt.Sprint(body), "penalty") {
		t.Fatalf("operators' view of the key: %d %v, want its penalty limit", code, body)
	}
	if code, r := adminCall(t, c, "DELETE", "/tollgate/keys?policy=login&key=127.0.0.1"); code != 200 || r["reset"] != true {
		t.Fatalf("reset: %d %v", code, r)
	}
	if resp, _ := c.Get("/login", "X-Password", "right"); resp.StatusCode != 200 {
		t.Fatalf("after an operator's reset: %d, want 200", resp.StatusCode)
	}
}

// TestCaddyReserveForCriticalTraffic: a real Caddy holds 20% of a limit of
// 10 back for priority 1 (a request header here; any placeholder works):
// requests without it are refused after 8, critical ones still get the 2
// held back, and a priority the client garbles counts as 0. The metrics
// count decisions by priority (two values).
func TestCaddyReserveForCriticalTraffic(t *testing.T) {
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy api {
			key all
			limit 10/10m sliding_log
			priority {http.request.header.X-Priority}
			reserve 20% for 1
		}
	}
	respond "ok"`)
	for i := 0; i < 8; i++ {
		if resp, _ := c.Get("/"); resp.StatusCode != 200 {
			t.Fatalf("batch request %d: %d, want 200 (8 of 10 are unreserved)", i+1, resp.StatusCode)
		}
	}
	for _, p := range []string{"", "0", "high", "-3"} {
		if resp, _ := c.Get("/", "X-Priority", p); resp.StatusCode != 429 {
			t.Fatalf("priority %q past the unreserved 8: %d, want 429", p, resp.StatusCode)
		}
	}
	for i := 0; i < 2; i++ {
		if resp, _ := c.Get("/", "X-Priority", "1"); resp.StatusCode != 200 {
			t.Fatalf("critical request %d: %d, want 200 from the reserve", i+1, resp.StatusCode)
		}
	}
	if resp, _ := c.Get("/", "X-Priority", "2"); resp.StatusCode != 429 {
		t.Fatalf("critical request past the whole limit: %d, want 429", resp.StatusCode)
	}
	m := c.Metrics()
	for _, want := range []string{
		`tollgate_priority_decisions_total{plan="",policy="api",priority="unreserved",result="allowed"} 8`,
		`tollgate_priority_decisions_total{plan="",policy="api",priority="unreserved",result="denied"} 4`,
		`tollgate_priority_decisions_total{plan="",policy="api",priority="reserved",result="allowed"} 2`,
		`tollgate_priority_decisions_total{plan="",policy="api",priority="reserved",result="denied"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestCaddyPenaltyBoxIsFleetWide: two Caddies on one Redis share one box
// per key. Failed logins through one node put the client in the box, and
// the other node refuses it too, with the box's Retry-After: the count,
// the box and the decision are one script in one round trip.
func TestCaddyPenaltyBoxIsFleetWide(t *testing.T) {
	srv := redistest.StartT(t)
	upstream := loginUpstream(t)
	body := fmt.Sprintf(`
	tollgate {
		store redis redis://%s
		policy login {
			key {client_ip}
			limit 3/10m sliding_log
			charge {
				status 401
			}
			penalty 2/1d 1h # a day's window: no boundary between the test's denials
		}
	}
	reverse_proxy %s`, srv.Addr, strings.TrimPrefix(upstream.URL, "http://"))
	a, b := caddyproc.Start(t, body), caddyproc.Start(t, body)
	for i := 0; i < 3; i++ {
		if resp, _ := a.Get("/login", "X-Password", "wrong"); resp.StatusCode != 401 {
			t.Fatalf("wrong password %d on node a: %d, want 401", i+1, resp.StatusCode)
		}
	}
	// Two denials, one on each node, close the box.
	for _, node := range []*caddyproc.Caddy{b, a} {
		if resp, _ := node.Get("/login", "X-Password", "right"); resp.StatusCode != 429 {
			t.Fatalf("after 3 failures: %d, want 429", resp.StatusCode)
		}
	}
	for _, node := range []*caddyproc.Caddy{a, b} {
		resp, _ := node.Get("/login", "X-Password", "right")
		if retry, _ := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != 429 || retry < 3500 || retry > 3600 {
			t.Fatalf("in the box: %d, Retry-After %q; want 429 until the hour's box ends, on both nodes", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
}
