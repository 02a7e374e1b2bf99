package caddymodule

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// Users of basic_auth below, with bcrypt hashes of cost 4 (fast to check).
const (
	aliceHash = `$2a$04$3YH8ccimX6s8ou3BN2G3De5cXxQK/87wX0PVuKq196aTCfLqf4Xn.`
	bobHash   = `$2a$04$JCq47yTbtqlJdCjbASDv/uqoIDwuI30XmJMEZSp6.67tzMW8jWAVG`
)

func basic(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

// TestCaddyAuthPlaceholderBeforeAuthRefused, in Caddy: a policy keyed on
// {http.auth.user.id} in a site block with basic_auth is refused at load,
// with the fix (Caddy orders tollgate before basic_auth there, so the
// placeholder would be empty and every user would share the client
// address's bucket); the route form the error gives is taken and keys per
// user; a handle block of its own keeps tollgate and an authentication
// handler of another path apart (no request meets both).
func TestCaddyAuthPlaceholderBeforeAuthRefused(t *testing.T) {
	c := caddyproc.StartInProcess(t, `respond "ok"`)
	users := "basic_auth {\n\t\talice " + aliceHash + "\n\t\tbob " + bobHash + "\n\t}"
	limit := "tollgate {\n\t\tpolicy per-user {\n\t\t\tkey {http.auth.user.id}\n\t\t\tlimit 2/1h sliding_log\n\t\t}\n\t}"

	code, body := c.Load(users + "\n\t" + limit + "\n\trespond \"ok\"")
	if code != 400 || !strings.Contains(body, `policy \"per-user\" reads {http.auth.user.id}, which an authentication handler (basic_auth) sets, and that handler runs after tollgate`) ||
		!strings.Contains(body, "route { basic_auth { ... } tollgate { ... } }") {
		t.Fatalf("a site block with basic_auth and a policy on {http.auth.user.id}: %d %s, want it refused with the fix", code, body)
	}

	if code, body := c.Load("route {\n\t" + users + "\n\t" + limit + "\n\trespond \"ok\"\n}"); code != 200 {
		t.Fatalf("the route form: %d %s", code, body)
	}
	// The route form's tollgate answers with its limit's headers. Caddy
	// returns from a reload once its old servers' shutdowns have started,
	// not done, and an old server paused before closing its listener can
	// still take a new connection (caddyhttp.App.Stop says so), and keep
	// it alive: an answer without the headers, the replaced config's plain
	// "ok", is sent again on a new connection.
	get := func(user string) *http.Response {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			resp, _ := c.Get("/", "Authorization", basic(user, user+"-secret"))
			if resp.Header.Get("X-Ratelimit-Limit") != "" {
				return resp
			}
			t.Logf("%s's request answered by the config the reload replaced (%d, no rate-limit headers); sending it again", user, resp.StatusCode)
			http.DefaultClient.CloseIdleConnections()
		}
		t.Fatalf("%s's requests: no answer from the route form's tollgate in 10 s", user)
		return nil
	}
	for i, want := range []int{200, 200, 429} {
		if resp := get("alice"); resp.StatusCode != want || resp.Header.Get("X-Ratelimit-Remaining") != strconv.Itoa(max(0, 1-i)) {
			t.Fatalf("alice's request %d: %d, X-Ratelimit-Remaining %q; want %d and %d", i+1, resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining"), want, max(0, 1-i))
		}
	}
	if resp := get("bob"); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Remaining") != "1" {
		t.Fatalf("bob after alice's denial: %d, X-Ratelimit-Remaining %q; want 200 and 1 (a bucket of his own)", resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining"))
	}

	apart := "handle /api/* {\n\t" + limit + "\n\trespond \"api\"\n}\nhandle /admin/* {\n\t" + users + "\n\trespond \"admin\"\n}"
	if code, body := c.Load(apart); code != 200 {
		t.Fatalf("tollgate and basic_auth in handle blocks of their own: %d %s, want it taken", code, body)
	}
	// There nothing authenticates /api/*, so the key is empty on every
	// request: said once, with the policy and its key, when the first
	// 100 requests are done.
	for range emptyKeyWindow + 20 {
		c.Get("/api/x")
	}
	warned := func() int { return strings.Count(c.LogTail(1<<20), "most requests have no key") }
	waitfor.True(t, 10*time.Second, "the empty-key warning in Caddy's log", func() bool { return warned() > 0 })
	log := c.LogTail(1 << 20)
	if n := warned(); n != 1 || !strings.Contains(log, `"policy":"per-user","key":"{http.auth.user.id}","empty_key":"client","empty":100,"of_first_requests":100`) {
		t.Errorf("%d warnings, want one naming the policy, its key and what happened:\n%s", n, log)
	}
}

// TestCaddyAuthPlaceholderRefusedByCaddyBinary: the xcaddy-built Caddy,
// as users run it, refuses the site block at load and takes the route
// form (TestCaddyAuthPlaceholderBeforeAuthRefused has the rest, in
// process).
func TestCaddyAuthPlaceholderRefusedByCaddyBinary(t *testing.T) {
	c := caddyproc.Start(t, `respond "ok"`)
	users := "basic_auth {\n\t\talice " + aliceHash + "\n\t}"
	limit := "tollgate {\n\t\tpolicy per-user {\n\t\t\tkey {http.auth.user.id}\n\t\t\tlimit 2/1h sliding_log\n\t\t}\n\t}"
	if code, body := c.Load(users + "\n\t" + limit + "\n\trespond \"ok\""); code != 400 || !strings.Contains(body, `runs after tollgate`) {
		t.Fatalf("the site block: %d %s, want it refused", code, body)
	}
	if code, body := c.Load("route {\n\t" + users + "\n\t" + limit + "\n\trespond \"ok\"\n}"); code != 200 {
		t.Fatalf("the route form: %d %s", code, body)
	}
	if resp, _ := c.Get("/", "Authorization", basic("alice", "alice-secret")); resp.StatusCode != 200 {
		t.Fatalf("alice: %d", resp.StatusCode)
	}
}
