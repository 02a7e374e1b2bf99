package caddymodule_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/testclock"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// adminCall sends method to Caddy's admin endpoint at path and decodes the
// JSON answer.
func adminCall(t *testing.T, c *caddyproc.Caddy, method, path string) (int, map[string]any) {
	t.Helper()
	return adminSend(t, c, method, path, "")
}

// adminSend is adminCall with a JSON body (none if empty); a list answered
// is returned under "list".
func adminSend(t *testing.T, c *caddyproc.Caddy, method, path, body string) (int, map[string]any) {
	t.Helper()
	var resp *http.Response
	var err error
	if method == http.MethodGet && body == "" {
		resp, err = c.AdminGet(path) // sent again while a load replaces the admin server
	} else {
		req, _ := http.NewRequest(method, c.AdminURL+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err = http.DefaultClient.Do(req)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		var list []any
		if json.Unmarshal(b, &list) == nil {
			return resp.StatusCode, map[string]any{"list": list}
		}
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, out
}

// TestCaddyAdminAPI: on a real Caddy with tollgate on a real redis-server,
// the admin endpoint lists the policies with their store's health, shows a
// key's usage in each limit (and reading it twice changes nothing), shows
// the keys denied most (hashed), and resets a key atomically while 8
// clients hammer it: exactly one quota is allowed before the reset and
// exactly one after, no more, no less.
func TestCaddyAdminAPI(t *testing.T) {
	rs := redistest.StartT(t)
	c := caddyproc.StartInProcess(t, fmt.Sprintf(`
	tollgate {
		store redis redis://%s
		policy api {
			key {http.request.header.X-Key}
			limit 5/1m sliding_log
			limit 50/1h fixed_window
		}
	}
	respond "ok"`, rs.Addr))

	// The API's own path lists what is there (it answered "policy \"\": not in force").
	if code, in := adminCall(t, c, "GET", "/tollgate/"); code != 200 || fmt.Sprint(in["policies"]) != "[api]" ||
		!strings.Contains(fmt.Sprint(in["endpoints"]), "GET keys?policy=<name>&key=<key>") || in["version"] != core.Version {
		t.Errorf("GET /tollgate/: %d %v", code, in)
	}
	if code, e := adminCall(t, c, "GET", "/tollgate/nope"); code != 404 || !strings.Contains(fmt.Sprint(e["error"]), `no endpoint "nope" (GET the API's own path for the list: GET version;`) {
		t.Errorf("GET /tollgate/nope: %d %v", code, e)
	}

	code, pols := adminCall(t, c, "GET", "/tollgate/policies")
	list, _ := pols["list"].([]any)
	if code != 200 || len(list) != 1 {
		t.Fatalf("policies: %d %v", code, pols)
	}
	p := list[0].(map[string]any)
	if p["name"] != "api" || p["store"] != "redis" || p["breaker_open"] != false || len(p["limits"].([]any)) != 2 {
		t.Errorf("policy: %v", p)
	}

	for i := 0; i < 3; i++ {
		c.Get("/", "X-Key", "acme")
	}
	for i := 0; i < 2; i++ { // reading twice: the same, nothing consumed
		code, u := adminCall(t, c, "GET", "/tollgate/keys?policy=api&key=acme")
		limits, _ := u["limits"].([]any)
		if code != 200 || len(limits) != 2 || u["key"] != core.KeyHash("acme") {
			t.Fatalf("usage: %d %v", code, u)
		}
		l0, l1 := limits[0].(map[string]any), limits[1].(map[string]any)
		if l0["used"] != 3.0 || l0["remaining"] != 2.0 || l1["used"] != 3.0 || l1["remaining"] != 47.0 {
			t.Errorf("read %d: %v %v, want 3 used of 5 and of 50", i, l0, l1)
		}
	}
	for i := 0; i < 4; i++ {
		c.Get("/", "X-Key", "acme") // 2 more allowed, then denied
	}
	if _, top := adminCall(t, c, "GET", "/tollgate/top?policy=api"); !strings.Contains(fmt.Sprint(top["top_denied"]), core.KeyHash("acme")) {
		t.Errorf("top: %v", top)
	}
	if code, e := adminCall(t, c, "GET", "/tollgate/keys?policy=nope&key=acme"); code != 404 || !strings.Contains(fmt.Sprint(e["error"]), `policy "nope"`) {
		t.Errorf("unknown policy: %d %v", code, e)
	}
	// The API is on Caddy's admin listener only: on the site's listener the
	// same paths are the site's (here its respond), and a DELETE resets
	// nothing.
	for _, method := range []string{"GET", "DELETE"} {
		req, _ := http.NewRequest(method, c.URL+"/tollgate/keys?policy=api&key=acme", nil)
		req.Header.Set("X-Key", "public-caller")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), `"limits"`) || strings.Contains(string(body), `"reset"`) {
			t.Errorf("%s on the public listener reached the operators' API: %s", method, body)
		}
	}
	if got := usedOf(t, c, "/tollgate/keys?policy=api&key=acme"); got != "5/1m:5 50/1h:5" {
		t.Errorf("after the public listener's DELETE: %s, want acme's usage untouched (5/1m:5 50/1h:5)", got)
	}

	// Reset under load: the 5/1m quota is allowed exactly once before the
	// reset and exactly once after it.
	var allowed atomic.Int64
	var resetDone atomic.Bool
	var deniedAfter atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for deniedAfter.Load() < 20 {
				resp, _ := c.Get("/", "X-Key", "busy")
				if resp.StatusCode == 200 {
					allowed.Add(1)
				} else if resetDone.Load() {
					deniedAfter.Add(1)
				}
			}
		}()
	}
	waitfor.True(t, 10*time.Second, "the first quota spent", func() bool { return allowed.Load() >= 5 })
	if code, r := adminCall(t, c, "DELETE", "/tollgate/keys?policy=api&key=busy"); code != 200 || r["reset"] != true {
		t.Fatalf("reset: %d %v", code, r)
	}
	resetDone.Store(true)
	wg.Wait()
	if n := allowed.Load(); n != 10 {
		t.Errorf("%d requests allowed across the reset, want exactly 10 (5 before, 5 after)", n)
	}

	// One limit reset: the other keeps its count.
	if code, r := adminCall(t, c, "DELETE", "/tollgate/keys?policy=api&key=acme&limit=50/1h"); code != 200 || r["limit"] != "50/1h" {
		t.Fatalf("reset of one limit: %d %v", code, r)
	}
	if got := usedOf(t, c, "/tollgate/keys?policy=api&key=acme"); got != "5/1m:5 50/1h:0" {
		t.Errorf("after resetting 50/1h: %s, want 5/1m:5 50/1h:0", got)
	}
	if code, e := adminCall(t, c, "DELETE", "/tollgate/keys?policy=api&key=acme&limit=1/1s"); code != 400 || !strings.Contains(fmt.Sprint(e["error"]), "has 5/1m, 50/1h") {
		t.Errorf("reset of an unknown limit: %d %v", code, e)
	}
}

// usedOf reads a key's usage: "<limit>:<used>" for each limit.
func usedOf(t *testing.T, c *caddyproc.Caddy, path string) string {
	t.Helper()
	code, u := adminCall(t, c, "GET", path)
	limits, _ := u["limits"].([]any)
	if code != 200 {
		t.Fatalf("GET %s: %d %v", path, code, u)
	}
	var parts []string
	for _, l := range limits {
		m := l.(map[string]any)
		parts = append(parts, fmt.Sprintf("%v:%v", m["limit"], m["used"]))
	}
	return strings.Join(parts, " ")
}

// TestCaddyAdminAPIEventual: in eventual mode, where each node counts
// locally and syncs, the admin endpoint reads the fleet's counts and a
// reset gives the key its quota back on every node. Two Caddies share one
// redis-server; the key is used on both and read and reset on one.
func TestCaddyAdminAPIEventual(t *testing.T) {
	rs := redistest.StartT(t)
	config := fmt.Sprintf(`
	tollgate {
		store redis redis://%s {
			mode eventual sync 50ms
		}
		policy api {
			key {http.request.header.X-Key}
			limit 6/1m fixed_window
		}
	}
	respond "ok"`, rs.Addr)
	a, b := caddyproc.Start(t, config), caddyproc.Start(t, config)
	for _, c := range []*caddyproc.Caddy{a, b, a} {
		if resp, _ := c.Get("/", "X-Key", "acme"); resp.StatusCode != 200 {
			t.Fatalf("request refused: %d", resp.StatusCode)
		}
	}
	// Both nodes sync within 50 ms; a's reading is the fleet's.
	waitfor.True(t, 10*time.Second, "node a reading 3 used", func() bool { return usedOf(t, a, "/tollgate/keys?policy=api&key=acme") == "6/1m:3" })
	if code, r := adminCall(t, a, "DELETE", "/tollgate/keys?policy=api&key=acme"); code != 200 || r["reset"] != true {
		t.Fatalf("reset: %d %v", code, r)
	}
	if got := usedOf(t, a, "/tollgate/keys?policy=api&key=acme"); got != "6/1m:0" {
		t.Fatalf("after the reset, node a reads %s", got)
	}
	// Node b reads a key again at the sync after its next use (an idle key
	// costs Redis nothing): its first request after the reset is decided on
	// its old view, and once it has synced twice (the first may have read
	// before that request) it has the fleet's count, reset; then it allows
	// the rest of the quota of 6, on its own.
	syncs := func() float64 {
		_, pols := adminCall(t, b, "GET", "/tollgate/policies")
		return pols["list"].([]any)[0].(map[string]any)["eventual_syncs"].(float64)
	}
	allowed := 0
	if resp, _ := b.Get("/", "X-Key", "acme"); resp.StatusCode == 200 {
		allowed++
	}
	after := syncs()
	waitfor.True(t, 10*time.Second, "node b syncing twice", func() bool { return syncs() >= after+2 })
	for i := 0; i < 8; i++ {
		if resp, _ := b.Get("/", "X-Key", "acme"); resp.StatusCode == 200 {
			allowed++
		}
	}
	if allowed != 6 {
		t.Fatalf("node b allowed %d of 8 after the reset, want the quota of 6", allowed)
	}
}

// adminPost sends a JSON body to Caddy's admin endpoint and decodes the
// JSON answer.
func adminPost(t *testing.T, c *caddyproc.Caddy, path, body string) (int, map[string]any) {
	t.Helper()
	return adminSend(t, c, http.MethodPost, path, body)
}

// TestCaddyAdminAPIKeysInBody: a key looked up or reset with the POST
// forms never appears in Caddy's log, which records every admin request's
// URL (the GET form's key is in it); a body that is not the expected
// object is refused with the reason.
func TestCaddyAdminAPIKeysInBody(t *testing.T) {
	const secret = "sk_live_tollgate_secret_41"
	testclock.New(t, midMinute).InProcess() // no window turns between its requests
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy api {
			key {http.request.header.X-Key}
			limit 3/1m
		}
	}
	respond "ok"`)
	for i := 0; i < 3; i++ {
		c.Get("/", "X-Key", secret)
	}
	if resp, _ := c.Get("/", "X-Key", secret); resp.StatusCode != 429 {
		t.Fatalf("4th request: %d, want 429", resp.StatusCode)
	}
	code, u := adminPost(t, c, "/tollgate/keys/show", `{"policy": "api", "key": "`+secret+`"}`)
	if limits, _ := u["limits"].([]any); code != 200 || len(limits) != 1 || limits[0].(map[string]any)["used"] != 3.0 || u["key"] != core.KeyHash(secret) {
		t.Fatalf("keys/show: %d %v", code, u)
	}
	if code, r := adminPost(t, c, "/tollgate/keys/reset", `{"policy": "api", "key": "`+secret+`"}`); code != 200 || r["reset"] != true {
		t.Fatalf("keys/reset: %d %v", code, r)
	}
	if resp, _ := c.Get("/", "X-Key", secret); resp.StatusCode != 200 {
		t.Fatalf("after keys/reset: %d, want the quota back", resp.StatusCode)
	}
	for _, tc := range []struct{ path, body, want string }{
		{"/tollgate/keys/show", `{"policy": "api", "key": "k", "colour": "blue"}`, `unknown field "colour"`},
		{"/tollgate/keys/show", `[1, 2]`, `want a JSON object`},
		{"/tollgate/keys/show", `{"policy": "api", "key": "` + strings.Repeat("k", 20<<10) + `"}`, `at most 16384 bytes`},
		{"/tollgate/keys/show", `{"policy": "api"}`, `key: missing`},
		{"/tollgate/keys/forget", `{"policy": "api", "key": "k"}`, `no endpoint "keys/forget"`},
		{"/tollgate/keys/reset", `{"policy": "nope", "key": "k"}`, `policy "nope": not in force`},
	} {
		if code, e := adminPost(t, c, tc.path, tc.body); code < 400 || !strings.Contains(fmt.Sprint(e["error"]), tc.want) {
			t.Errorf("POST %s %.60s: %d %v, want an error saying %q", tc.path, tc.body, code, e, tc.want)
		}
	}
	waitfor.True(t, 10*time.Second, "Caddy logging the admin requests", func() bool {
		return strings.Count(c.LogTail(1<<20), "/tollgate/keys/") >= 8
	})
	if log := c.LogTail(1 << 20); strings.Contains(log, secret) {
		t.Errorf("the key is in Caddy's log:\n%s", log)
	}
	// The GET form puts it there: why the POST forms exist.
	adminCall(t, c, "GET", "/tollgate/keys?policy=api&key="+secret)
	waitfor.True(t, 10*time.Second, "the GET form's URL logged", func() bool { return strings.Contains(c.LogTail(1<<20), secret) })
}

// TestCaddyPolicyNameTwice: two tollgate handlers of one config that give
// one policy name to different policies are refused when the config is
// loaded, naming the policy; the same policy (same limits, same store) in
// two routes is one policy, and the API reaches it.
func TestCaddyPolicyNameTwice(t *testing.T) {
	c := caddyproc.StartInProcess(t, `respond "ok"`)
	code, body := c.Load(`
	route /a* {
		tollgate {
			policy api {
				limit 3/1m
			}
		}
		respond "a"
	}
	route /b* {
		tollgate {
			policy api {
				limit 100/1h
			}
		}
		respond "b"
	}`)
	if code == 200 || !strings.Contains(body, `policy \"api\": the name is given to two different policies in this config`) {
		t.Fatalf("two policies named api: %d %s", code, body)
	}
	code, body = c.Load(`
	route /a* {
		tollgate {
			policy api {
				key {http.request.header.X-Key}
				limit 3/1m
			}
		}
		respond "a"
	}
	route /b* {
		tollgate {
			policy api {
				key {http.request.header.X-Key}
				limit 3/1m
			}
		}
		respond "b"
	}`)
	if code != 200 {
		t.Fatalf("one policy in two routes refused: %d %s", code, body)
	}
	// The first request after the reload can still meet the replaced
	// config (see getFromNewConfig), whose plain "ok" counts nothing and
	// sends no rate-limit headers.
	limited := func(r *http.Response) bool { return r.Header.Get("X-Ratelimit-Limit") != "" }
	getPathFromNewConfig(t, c, "/a", "the route /a", limited, "X-Key", "k")
	getPathFromNewConfig(t, c, "/b", "the route /b", limited, "X-Key", "k")
	if got := usedOf(t, c, "/tollgate/keys?policy=api&key=k"); got != "3/1m:2" {
		t.Errorf("one policy in two routes: %s, want both requests counted once each (3/1m:2)", got)
	}
}

// TestCaddyAdminAPIBucketsInTheirOwnTerms: for a token bucket (120/1m,
// burst 10) the operators' API reports usage of the burst, the bucket's
// capacity: 10 left and 0 used after a reset, 3 used after three
// requests; GET policies shows the burst; GET top without a policy lists
// every policy's offenders.
func TestCaddyAdminAPIBucketsInTheirOwnTerms(t *testing.T) {
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy bucket {
			key {http.request.header.X-Key}
			limit 120/1m token_bucket burst 10
		}
		policy other {
			key {http.request.header.X-Other}
			limit 1/1h
		}
	}
	respond "ok"`)
	show := func() map[string]any {
		code, u := adminPost(t, c, "/tollgate/keys/show", `{"policy": "bucket", "key": "k"}`)
		limits, _ := u["limits"].([]any)
		if code != 200 || len(limits) != 1 {
			t.Fatalf("keys/show: %d %v", code, u)
		}
		return limits[0].(map[string]any)
	}
	for i := 0; i < 3; i++ {
		c.Get("/", "X-Key", "k", "X-Other", "o")
	}
	// Three of the burst of 10 used (a token comes back every 0.5 s: at
	// most one while the test runs this far).
	if l := show(); l["burst"] != 10.0 || l["used"].(float64) < 2 || l["used"].(float64) > 3 || l["used"].(float64)+l["remaining"].(float64) != 10 {
		t.Errorf("after three requests: %v, want burst 10, 3 used, used + remaining = 10", l)
	}
	if code, r := adminPost(t, c, "/tollgate/keys/reset", `{"policy": "bucket", "key": "k"}`); code != 200 || r["reset"] != true {
		t.Fatalf("reset: %d %v", code, r)
	}
	if l := show(); l["used"] != 0.0 || l["remaining"] != 10.0 {
		t.Errorf("after a reset: %v, want 0 used and 10 remaining (a full bucket)", l)
	}
	_, ps := adminCall(t, c, "GET", "/tollgate/policies")
	found := false
	for _, p := range ps["list"].([]any) {
		p := p.(map[string]any)
		if p["name"] == "bucket" {
			l := p["limits"].([]any)[0].(map[string]any)
			found = l["burst"] == 10.0 && l["count"] == 120.0 && l["algorithm"] == "token_bucket"
		}
	}
	if !found {
		t.Errorf("GET policies: %v, want the bucket's burst 10 beside its count 120", ps)
	}
	c.Get("/", "X-Other", "o") // other: its fourth request, the third denied
	code, top := adminCall(t, c, "GET", "/tollgate/top")
	if code != 200 || !strings.Contains(fmt.Sprint(top["list"]), "policy:other") || !strings.Contains(fmt.Sprint(top["list"]), "denials:3") {
		t.Errorf("GET top without a policy: %d %v, want every policy's offenders, other's among them", code, top)
	}
}
