package kongplugin_test

// These tests run the real plugin server binary and drive it over its Unix
// socket with go-pdk's protobuf protocol, as Kong does.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/headercheck"
	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/testclock"
	"github.com/tollgate/tollgate/internal/waitfor"
	"github.com/tollgate/tollgate/kongplugin"
)

// kongConfig is a config as Kong sends it: the user's fields, every other
// schema field null, and Kong's own additions.
func kongConfig(fields map[string]any) map[string]any {
	c := map[string]any{}
	for _, f := range []string{"second", "minute", "hour", "day", "month", "year", "limit_by", "header_name", "path",
		"policy", "fault_tolerant", "hide_client_headers", "error_code", "error_message", "sync_rate", "redis",
		"algorithm", "limits", "cost", "shadow", "headers", "namespace", "on_error"} {
		c[f] = nil
	}
	c["route_id"], c["service_id"], c["consumer_id"], c["__plugin_id"] = "route-1", "service-1", nil, "plugin-1"
	for k, v := range fields {
		c[k] = v
	}
	return c
}

func start(t *testing.T, c *kongproc.Client, fields map[string]any) int32 {
	t.Helper()
	id, err := c.StartInstance(kongConfig(fields))
	if err != nil {
		t.Fatalf("StartInstance: %v", err)
	}
	return id
}

func access(t *testing.T, c *kongproc.Client, id int32, req kongproc.Request) *kongproc.Result {
	t.Helper()
	res, err := c.Access(id, req)
	if err != nil {
		t.Fatalf("access: %v", err)
	}
	return res
}

func header(t *testing.T, label string, res *kongproc.Result, want map[string]string) {
	t.Helper()
	headercheck.Expect(t, label, res.Headers, want)
}

// TestKongDropIn: a config written for Kong's rate-limiting plugin works
// unchanged, with Kong's headers and Kong's denial.
func TestKongDropIn(t *testing.T) {
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	id := start(t, c, map[string]any{"minute": 3, "hour": 10, "policy": "local", "limit_by": "consumer", "fault_tolerant": true})
	alice := kongproc.Request{ConsumerID: "alice", ForwardedIP: "198.51.100.7"}
	for i := 1; i <= 3; i++ {
		res := access(t, c, id, alice)
		if res.Exited {
			t.Fatalf("request %d exited with %d", i, res.Status)
		}
		header(t, fmt.Sprint("request ", i), res, map[string]string{
			"X-RateLimit-Limit-Minute": "3", "X-RateLimit-Remaining-Minute": strconv.Itoa(3 - i),
			"X-RateLimit-Limit-Hour": "10", "X-RateLimit-Remaining-Hour": strconv.Itoa(10 - i),
			"RateLimit-Limit": "3", "RateLimit-Remaining": strconv.Itoa(3 - i), "RateLimit-Reset": "1..60",
			"Retry-After": "",
		})
	}
	alice.RequestID = "req-4"
	res := access(t, c, id, alice)
	if !res.Exited || res.Status != 429 || res.Body != "{\n  \"message\":\"API rate limit exceeded\",\n  \"request_id\":\"req-4\"\n}" {
		t.Fatalf("4th request: exited %v status %d body %q", res.Exited, res.Status, res.Body)
	}
	header(t, "denied", res, map[string]string{
		"Content-Type": "application/json; charset=utf-8", "X-RateLimit-Remaining-Minute": "0",
		"X-RateLimit-Remaining-Hour": "7", "RateLimit-Remaining": "0", "Retry-After": res.Headers.Get("RateLimit-Reset"),
	})
	// The denial was a delayed response: the event ended and its connection
	// stays; another consumer has its own counters.
	if !res.Delayed {
		t.Fatal("the denial ended the event with kong.response.exit, want a delayed response")
	}
	if res := access(t, c, id, kongproc.Request{ConsumerID: "bob"}); res.Exited || res.Headers.Get("X-RateLimit-Remaining-Minute") != "2" {
		t.Fatalf("bob: exited %v remaining %q", res.Exited, res.Headers.Get("X-RateLimit-Remaining-Minute"))
	}
}

// TestKongIdentifierFallback: consumer → credential → ip, a missing header
// or a non-matching path → ip, as Kong computes the identifier.
func TestKongIdentifierFallback(t *testing.T) {
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	remaining := func(id int32, req kongproc.Request) string {
		return access(t, c, id, req).Headers.Get("X-RateLimit-Remaining-Minute")
	}
	byConsumer := start(t, c, map[string]any{"minute": 5, "namespace": "fallback-consumer"})
	remaining(byConsumer, kongproc.Request{CredentialID: "cred-1", ForwardedIP: "192.0.2.1"})
	if got := remaining(byConsumer, kongproc.Request{CredentialID: "cred-1", ForwardedIP: "192.0.2.2"}); got != "3" {
		t.Errorf("no consumer: keyed by credential, remaining %q, want 3", got)
	}
	remaining(byConsumer, kongproc.Request{ForwardedIP: "192.0.2.9"})
	if got := remaining(byConsumer, kongproc.Request{ForwardedIP: "192.0.2.9"}); got != "3" {
		t.Errorf("no consumer or credential: keyed by ip, remaining %q, want 3", got)
	}
	byHeader := start(t, c, map[string]any{"minute": 5, "limit_by": "header", "header_name": "X-Tenant", "namespace": "fallback-header"})
	remaining(byHeader, kongproc.Request{Headers: http.Header{"X-Tenant": {"t1"}}, ForwardedIP: "192.0.2.1"})
	if got := remaining(byHeader, kongproc.Request{Headers: http.Header{"X-Tenant": {"t1"}}, ForwardedIP: "192.0.2.2"}); got != "3" {
		t.Errorf("header: remaining %q, want 3 (same tenant, two IPs)", got)
	}
	if got := remaining(byHeader, kongproc.Request{ForwardedIP: "192.0.2.1"}); got != "4" {
		t.Errorf("missing header: keyed by ip, remaining %q, want 4", got)
	}
	byPath := start(t, c, map[string]any{"minute": 5, "limit_by": "path", "path": "/login", "namespace": "fallback-path"})
	remaining(byPath, kongproc.Request{Path: "/login", ForwardedIP: "192.0.2.1"})
	if got := remaining(byPath, kongproc.Request{Path: "/login", ForwardedIP: "192.0.2.2"}); got != "3" {
		t.Errorf("path: remaining %q, want 3", got)
	}
	if got := remaining(byPath, kongproc.Request{Path: "/other", ForwardedIP: "192.0.2.3"}); got != "4" {
		t.Errorf("other path: keyed by ip, remaining %q, want 4", got)
	}
	byService := start(t, c, map[string]any{"minute": 5, "limit_by": "service", "namespace": "fallback-service"})
	remaining(byService, kongproc.Request{ServiceID: "s1", ForwardedIP: "192.0.2.1"})
	if got := remaining(byService, kongproc.Request{ServiceID: "s1", ForwardedIP: "192.0.2.2"}); got != "3" {
		t.Errorf("service: remaining %q, want 3", got)
	}
}

// TestKongScopesAndOptions: counters per route the plugin is attached to
// unless a namespace shares them; hide_client_headers, error_code and
// error_message, other header styles, extra limits.
func TestKongScopesAndOptions(t *testing.T) {
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	req := kongproc.Request{ConsumerID: "alice"}
	cfgA := kongConfig(map[string]any{"minute": 5})
	cfgB := kongConfig(map[string]any{"minute": 5})
	cfgB["route_id"] = "route-2"
	a, _ := c.StartInstance(cfgA)
	b, _ := c.StartInstance(cfgB)
	access(t, c, a, req)
	if got := access(t, c, b, req).Headers.Get("X-RateLimit-Remaining-Minute"); got != "4" {
		t.Errorf("another route: remaining %q, want its own 4", got)
	}
	cfgA["namespace"], cfgB["namespace"] = "shared", "shared"
	a, _ = c.StartInstance(cfgA)
	b, _ = c.StartInstance(cfgB)
	access(t, c, a, req)
	if got := access(t, c, b, req).Headers.Get("X-RateLimit-Remaining-Minute"); got != "3" {
		t.Errorf("shared namespace: remaining %q, want 3", got)
	}

	// GCRA at one an hour: the second request is denied however slowly this
	// machine runs, where a one-second fixed window could roll over between
	// the two.
	hidden := start(t, c, map[string]any{"hour": 1, "algorithm": "gcra", "hide_client_headers": true, "error_code": 403, "error_message": "slow down", "namespace": "hidden"})
	if res := access(t, c, hidden, req); len(res.Headers) != 0 {
		t.Errorf("hide_client_headers: headers %v", res.Headers)
	}
	res := access(t, c, hidden, req)
	if res.Status != 403 || res.Body != "{\n  \"message\":\"slow down\",\n  \"request_id\":\"\"\n}" || res.Headers.Get("Retry-After") != "" {
		t.Errorf("custom denial: %d %q headers %v", res.Status, res.Body, res.Headers)
	}

	ietf := start(t, c, map[string]any{"headers": "ietf", "namespace": "ietf",
		"limits": []map[string]any{{"count": 4, "window": "10s", "algorithm": "sliding_log", "name": "burst"}, {"count": 100, "window": "1h"}}})
	header(t, "ietf", access(t, c, ietf, req), map[string]string{
		"Ratelimit-Policy": `"burst";q=4;w=10, "1h";q=100;w=3600`, "Ratelimit": `"burst";r=3;t=10`, "X-RateLimit-Limit-Minute": "",
	})
}

// TestKongRefusedConfigs: a config the plugin refuses starts as a refused
// instance: its first request writes the reason (field and value, the
// plugin and its route) to Kong's log through kong.log.err, which Kong
// writes at [error] whatever its log_level; every request gets Kong's
// delayed 500, and the connection stays.
func TestKongRefusedConfigs(t *testing.T) {
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	for _, tc := range []struct {
		fields map[string]any
		want   string
	}{
		{map[string]any{"minute": 0}, "config.minute: value must be greater than 0 (got 0)"},
		// Kong's shorthand rule for the flat redis_* names (kong/db/schema/init.lua,
		// validate_deprecation_exclusiveness), which no dump can carry.
		{map[string]any{"minute": 5, "policy": "redis", "redis_host": "a", "redis": map[string]any{"host": "b"}},
			"config.redis_host: both deprecated and new field are used but their values mismatch: redis_host = a vs redis.host = b"},
		// tollgate serves the access phase only: in-flight slots could never go back.
		{map[string]any{"limits": []any{map[string]any{"count": 2, "window": "1m", "algorithm": "in_flight"}}},
			`config.limits[0].algorithm: expected one of: fixed_window, sliding_log, sliding_counter, token_bucket, gcra, leaky_bucket (got "in_flight")`},
		// A plugin server Kong did not start in a prefix of its own: no
		// database settings to read.
		{map[string]any{"minute": 5, "policy": "cluster"}, `policy: cluster keeps counters in Kong's database, and ` + srv.Prefix + `/.kong_env, where Kong writes its settings, is missing`},
		{map[string]any{"minute": 5, "limit_by": "header"}, "config.header_name: required field missing"},
		{map[string]any{"minute": 5, "policy": "redis", "redis": map[string]any{"host": "h", "port": 65536}}, "config.redis.port: value should be between 0 and 65535 (got 65536)"},
		{map[string]any{"minute": 5, "limit_by": "path", "path": "login"}, `config.path: should start with: / (got "login")`},
		{map[string]any{"minute": 5, "sync_rate": 1}, "config.sync_rate: sync_rate can only be used with the redis policy (got 1)"},
	} {
		id, err := c.StartInstance(kongConfig(tc.fields))
		if err != nil {
			t.Errorf("%v: %v, want a refused instance started", tc.fields, err)
			continue
		}
		for i := 0; i < 3; i++ {
			res := access(t, c, id, kongproc.Request{ForwardedIP: "192.0.2.1"})
			if !res.Delayed || res.Status != 500 || res.Message != "An unexpected error occurred" {
				t.Errorf("%v request %d: delayed %v %d %q, want Kong's delayed 500", tc.fields, i+1, res.Delayed, res.Status, res.Message)
			}
			prefix := "err: tollgate (route=route-1,service=service-1): config refused, every request answered 500 until it is fixed: tollgate config: "
			if tc.fields["policy"] == "cluster" { // the world's refusal, not the config's: it heals (TestKongRefusalHeals)
				prefix = "err: tollgate (route=route-1,service=service-1): config refused, every request answered 500 until the cause is gone (tried again every 30s at most, no config change needed): tollgate config: "
			}
			got := strings.Join(res.Logs, "\n")
			if told := strings.HasPrefix(got, prefix) && strings.Contains(got, tc.want) && len(res.Logs) == 1; (i == 0 && !told) || (i > 0 && got != "") {
				t.Errorf("%v request %d: kong.log lines %q, want %q with %q on the first request alone", tc.fields, i+1, got, prefix, tc.want)
			}
		}
	}
	// What Kong's schema accepts starts: fractional limits, port and
	// timeout 0, a path from /; and periods in an order Kong's
	// rate-limiting refuses with a Lua validator no dump carries (each is
	// enforced; the log says Kong would refuse it).
	for _, fields := range []map[string]any{
		{"minute": 2.5},
		{"minute": 5, "policy": "redis", "redis": map[string]any{"host": "127.0.0.1", "port": 0, "timeout": 0}},
		{"minute": 5, "limit_by": "path", "path": "/login"},
	} {
		if _, err := c.StartInstance(kongConfig(fields)); err != nil {
			t.Errorf("%v refused: %v", fields, err)
		}
	}
	// Kong's words reach Kong's log at [warn], above its default level,
	// on the instance's first request alone.
	id := start(t, c, map[string]any{"second": 10, "minute": 5})
	const want = "warn: tollgate (route=route-1,service=service-1): config: The limit for minute(5.0) cannot be lower than the limit for second(10.0) in Kong's rate-limiting; tollgate enforces each period"
	for i := 0; i < 3; i++ {
		res := access(t, c, id, kongproc.Request{ForwardedIP: "192.0.2.9"})
		if got := strings.Join(res.Logs, "\n"); (i == 0 && got != want) || (i > 0 && got != "") {
			t.Errorf("periods out of order, request %d: kong.log lines %q, want %q on the first request alone", i+1, got, want)
		}
	}
	// The server still serves good configs.
	id = start(t, c, map[string]any{"minute": 1})
	if res := access(t, c, id, kongproc.Request{ForwardedIP: "192.0.2.1"}); res.Exited {
		t.Fatal("good config after refusals: denied")
	}
}

// TestKongRedisSharedAndFaults: two plugin servers (two Kong nodes) share
// one Redis limit; with Redis stopped, fault_tolerant true keeps limiting
// locally and fault_tolerant false answers 500; a restarted plugin server
// finds its counters in Redis.
func TestKongRedisSharedAndFaults(t *testing.T) {
	rs := redistest.StartT(t)
	// Hour windows: the test's phases must share one window, and a minute's
	// end fell between them once in CI.
	cfg := map[string]any{"hour": 10, "policy": "redis", "redis": withTimeout(rs.KongRecord(), 200), "limit_by": "ip"}
	waitfor.True(t, 40*time.Second, "not the last 30 s of an hour", func() bool { return time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)) > 30*time.Second })
	node1, node2 := kongproc.Start(t), kongproc.Start(t)
	c1, c2 := node1.Dial(), node2.Dial()
	defer c1.Close()
	defer c2.Close()
	id1, id2 := start(t, c1, cfg), start(t, c2, cfg)
	req := kongproc.Request{ForwardedIP: "203.0.113.5"}
	allowed := 0
	for i := 0; i < 8; i++ {
		for _, n := range []struct {
			c  *kongproc.Client
			id int32
		}{{c1, id1}, {c2, id2}} {
			if !access(t, n.c, n.id, req).Exited {
				allowed++
			}
		}
	}
	if allowed != 10 {
		t.Fatalf("two nodes allowed %d of 16, want exactly the shared 10", allowed)
	}

	// A restarted plugin server finds the counters in Redis.
	node1.Restart()
	c1 = node1.Dial()
	id1 = start(t, c1, cfg)
	if res := access(t, c1, id1, req); !res.Exited || res.Status != 429 {
		t.Fatalf("after a plugin server restart: exited %v status %d, want 429 from the counters in Redis", res.Exited, res.Status)
	}

	// Redis hangs (SIGSTOP). fault_tolerant (the default, no on_error): as
	// Kong, proxy with no rate-limit headers. on_error local: limit on this
	// node alone. fault_tolerant false: 500.
	if err := rs.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rs.Signal(syscall.SIGCONT) }()
	hung := withTimeout(rs.KongRecord(), 100)
	tolerant := start(t, c1, map[string]any{"hour": 2, "policy": "redis", "redis": hung, "namespace": "tolerant"})
	local := start(t, c1, map[string]any{"hour": 2, "policy": "redis", "redis": hung, "namespace": "local", "on_error": "local"})
	strict := start(t, c2, map[string]any{"hour": 2, "policy": "redis", "fault_tolerant": false, "redis": hung, "namespace": "strict"})
	for _, tc := range []struct {
		id   int32
		want string
	}{{tolerant, "[200 200 200 200]"}, {local, "[200 200 429 429]"}} {
		var statuses []int
		for i := 0; i < 4; i++ {
			began := time.Now()
			res := access(t, c1, tc.id, req)
			// A hang would last as long as Redis is stopped; the bound leaves a
			// loaded machine room to schedule.
			if took := time.Since(began); took > time.Second {
				t.Errorf("decision with Redis hung took %s: it waited past the 100ms timeout", took)
			}
			statuses = append(statuses, map[bool]int{false: 200, true: res.Status}[res.Exited])
			if tc.id == tolerant && len(res.Headers) != 0 {
				t.Errorf("fault_tolerant with Redis hung sent headers %v; Kong sends none", res.Headers)
			}
		}
		if fmt.Sprint(statuses) != tc.want {
			t.Errorf("instance %d with Redis hung: %v, want %s", tc.id, statuses, tc.want)
		}
	}
	// fault_tolerant false answers 500 to each request without a log line
	// per request: the plugin server says once that the store is failing,
	// and so does Kong's log, at [error], through one request.
	var told []string
	for i := 0; i < 20; i++ {
		res := access(t, c2, strict, req)
		if !res.Exited || res.Status != 500 {
			t.Fatalf("fault_tolerant false with Redis hung: exited %v status %d, want 500", res.Exited, res.Status)
		}
		told = append(told, res.Logs...)
	}
	if len(told) != 1 || !strings.HasPrefix(told[0], "err: tollgate (ns=strict): rate-limit store failing (") ||
		!strings.HasSuffix(told[0], "its failure policy (on_error fail) decides until it answers again") {
		t.Fatalf("Kong's log for 20 failed requests: %q, want one [error] line with the failure policy", told)
	}
	if n := strings.Count(node2.Log(), "rate-limit store failing"); n != 1 {
		t.Errorf("node 2 logged the failing store %d times for 20 failed requests, want once:\n%s", n, node2.Log())
	}
	// That 500 is what real Kong 3.9.3 answers when its rate-limiting
	// raises an error: its plugin iterator's delayed 500 "An unexpected
	// error occurred" (kong/init.lua), which Kong renders as Accept asks
	// (TestKongRedisDownSideBySide compares every format in real Kong).
	r := req
	r.RequestID = "rid-7"
	if res := access(t, c2, strict, r); !res.Delayed || res.Status != 500 || res.Message != "An unexpected error occurred" ||
		res.Body != "{\n  \"message\":\"An unexpected error occurred\",\n  \"request_id\":\"rid-7\"\n}" {
		t.Errorf("fault_tolerant false: delayed %v %d %q %q; want Kong's delayed 500", res.Delayed, res.Status, res.Message, res.Body)
	}
}

// TestKongSyncRateFollowsFaultTolerant: with sync_rate, Kong's first
// request for a key after a sync asks Redis synchronously
// (kong/plugins/rate-limiting/policies/init.lua, the redis policy's usage
// with sync_rate), so while Redis is down a key the node holds no count
// for fails as fault_tolerant says: 500 when false, proxied with no
// headers when true. tollgate's eventual mode answers such keys the same
// way (keys it holds a count for go on locally; docs/kong.md says where
// that differs). Once Redis is back and a sync succeeds, new keys are
// counted again.
func TestKongSyncRateFollowsFaultTolerant(t *testing.T) {
	rs := redistest.StartT(t)
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	record := withTimeout(rs.KongRecord(), 100)
	tolerant := start(t, c, map[string]any{"minute": 5, "policy": "redis", "redis": record, "sync_rate": 0.05, "limit_by": "ip", "namespace": "sync-tolerant"})
	strict := start(t, c, map[string]any{"minute": 5, "policy": "redis", "redis": record, "sync_rate": 0.05, "limit_by": "ip", "namespace": "sync-strict", "fault_tolerant": false})
	client := 0
	newKey := func() kongproc.Request {
		client++
		return kongproc.Request{ForwardedIP: fmt.Sprintf("198.51.100.%d", client)}
	}
	if res := access(t, c, strict, newKey()); res.Exited || res.Headers.Get("X-RateLimit-Remaining-Minute") != "4" {
		t.Fatalf("Redis up: exited %v headers %v", res.Exited, res.Headers)
	}
	rs.Stop()
	waitfor.True(t, 10*time.Second, "a sync fails and a new key gets 500 with fault_tolerant false", func() bool {
		res := access(t, c, strict, newKey())
		return res.Exited && res.Status == 500
	})
	waitfor.True(t, 10*time.Second, "a new key is proxied with no headers with fault_tolerant true", func() bool {
		res := access(t, c, tolerant, newKey())
		return !res.Exited && len(res.Headers) == 0
	})
	if err := rs.Restart(); err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, 10*time.Second, "a sync succeeds and a new key is counted again", func() bool {
		res := access(t, c, strict, newKey())
		return !res.Exited && res.Headers.Get("X-RateLimit-Remaining-Minute") == "4"
	})
}

// TestKongSmallDifferences pins what tollgate does where Kong's
// rate-limiting differs in small ways (docs/kong.md says each, with its
// Kong file):
//   - a fractional limit: Kong admits requests while the count used is
//     below it (2.5 admits 3) and its headers say 2.5, 1.5, 0.5, 0
//     (handler.lua subtracts the usage from the number as written);
//     tollgate's say 3, 2, 1, 0, the integers the RateLimit fields need;
//   - a denial on Redis with sync_rate -1: Kong's redis policy INCRs every
//     period before deciding (policies/init.lua, usage), so each denied
//     request uses up the other periods; tollgate counts only what it
//     admits, as Kong's local policy does;
//   - the version reported to Kong is tollgate's own, where Kong's bundled
//     plugins report Kong's (kong/meta.lua).
func TestKongSmallDifferences(t *testing.T) {
	rs := redistest.StartT(t)
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	req := kongproc.Request{ForwardedIP: "192.0.2.25"}

	fractional := start(t, c, map[string]any{"minute": 2.5, "limit_by": "ip"})
	var seen []string
	for i := 0; i < 4; i++ {
		res := access(t, c, fractional, req)
		seen = append(seen, fmt.Sprintf("%v:%s/%s", !res.Exited, res.Headers.Get("X-RateLimit-Remaining-Minute"), res.Headers.Get("X-RateLimit-Limit-Minute")))
	}
	if want := "[true:2/3 true:1/3 true:0/3 false:0/3]"; fmt.Sprint(seen) != want {
		t.Errorf("minute 2.5: %v, want %s", seen, want)
	}

	onRedis := start(t, c, map[string]any{"minute": 2, "hour": 100, "limit_by": "ip", "policy": "redis", "redis": rs.KongRecord(), "namespace": "denials"})
	var last *kongproc.Result
	for i := 0; i < 6; i++ {
		last = access(t, c, onRedis, req)
	}
	if !last.Exited || last.Headers.Get("X-RateLimit-Remaining-Hour") != "98" {
		t.Errorf("after 2 admitted and 4 denied on Redis: exited %v, hour remaining %q, want 98 (Kong's redis policy would say 94)",
			last.Exited, last.Headers.Get("X-RateLimit-Remaining-Hour"))
	}

	var info struct{ Plugins []struct{ Version string } } // Kong reads the version from -dump
	if err := json.Unmarshal(kongproc.Dump(t), &info); err != nil {
		t.Fatal(err)
	}
	if info.Plugins[0].Version != kongplugin.Version {
		t.Errorf("version reported %q, want tollgate's %q", info.Plugins[0].Version, kongplugin.Version)
	}
}

// TestKongDump checks what Kong's query command reads: name, phases,
// priority and the schema's fields and types.
func TestKongDump(t *testing.T) {
	for _, variant := range []struct {
		pkg, name, phases string
		adaptive          string // the adaptive field's type; "" when absent
		algorithms        string // a limit's algorithms
	}{
		// tollgate: access only, as Kong's rate-limiting (its handler.lua has
		// access alone); nothing that needs the response.
		{kongproc.PluginPackage, "tollgate", "[access]", "", "[fixed_window sliding_log sliding_counter token_bucket gcra leaky_bucket]"},
		{kongproc.ResponsePackage, "tollgate-response", "[access log]", "record", "[fixed_window sliding_log sliding_counter token_bucket gcra leaky_bucket in_flight]"},
	} {
		var info struct {
			Protocol string
			Plugins  []struct {
				Name     string
				Phases   []string
				Priority int
				Schema   struct {
					Name   string
					Fields []map[string]struct {
						Type   string
						Fields []map[string]map[string]any
					}
				}
			}
		}
		if err := json.Unmarshal(kongproc.DumpOf(t, variant.pkg), &info); err != nil {
			t.Fatal(err)
		}
		if info.Protocol != "ProtoBuf:1" || len(info.Plugins) != 1 {
			t.Fatalf("dump: %+v", info)
		}
		p := info.Plugins[0]
		if p.Name != variant.name || p.Schema.Name != variant.name || fmt.Sprint(p.Phases) != variant.phases || p.Priority != 910 {
			t.Fatalf("plugin info: name %q (schema %q) phases %v priority %d, want %s %s", p.Name, p.Schema.Name, p.Phases, p.Priority, variant.name, variant.phases)
		}
		types := map[string]string{}
		var algorithms any
		for _, f := range p.Schema.Fields[0]["config"].Fields {
			for name, decl := range f {
				types[name], _ = decl["type"].(string)
				if name == "limits" {
					fields := decl["elements"].(map[string]any)["fields"].([]any)
					algorithms = fields[2].(map[string]any)["algorithm"].(map[string]any)["one_of"]
				}
			}
		}
		for name, want := range map[string]string{"second": "number", "minute": "number", "year": "number", "limit_by": "string",
			"policy": "string", "fault_tolerant": "boolean", "error_code": "integer", "sync_rate": "number", "redis": "record",
			"redis_host": "string", "limits": "array", "algorithm": "string", "headers": "string", "namespace": "string", "on_error": "string",
			"adaptive": variant.adaptive} {
			if types[name] != want {
				t.Errorf("%s: schema field %s: type %q, want %q", variant.name, name, types[name], want)
			}
		}
		if fmt.Sprint(algorithms) != variant.algorithms {
			t.Errorf("%s: a limit's algorithms %v, want %s", variant.name, algorithms, variant.algorithms)
		}
		for _, kongs := range []string{"route_id", "service_id", "consumer_id"} {
			if _, ok := types[kongs]; ok {
				t.Errorf("%s: schema declares %s, which Kong adds itself", variant.name, kongs)
			}
		}
	}
}

// TestKongInstancesAndConnections: on a config change Kong starts the new
// instance and then closes the old (kong/runloop/plugin_servers/plugin.lua,
// get_instance_id); counters survive. Several connections decide at
// once and together never exceed the limit. PDK calls per allowed request
// are counted.
func TestKongInstancesAndConnections(t *testing.T) {
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	if _, err := c.PluginInfo(); err != nil {
		t.Fatalf("GetPluginInfo: %v", err)
	}
	cfg := map[string]any{"minute": 50, "limit_by": "ip", "namespace": "instances"}
	id := start(t, c, cfg)
	req := kongproc.Request{ForwardedIP: "192.0.2.10"}
	res := access(t, c, id, req)
	if fmt.Sprint(res.Calls) != "[kong.client.get_forwarded_ip kong.response.set_headers]" {
		t.Errorf("PDK calls for an allowed request: %v, want get_forwarded_ip and set_headers", res.Calls)
	}
	if st, err := c.InstanceStatus(id); err != nil || st.InstanceId != id {
		t.Fatalf("instance status: %v %v", st, err)
	}
	old := id
	id = start(t, c, cfg)
	if err := c.CloseInstance(old); err != nil {
		t.Fatal(err)
	}
	if got := access(t, c, id, req).Headers.Get("X-RateLimit-Remaining-Minute"); got != "48" {
		t.Fatalf("after the instance restarted: remaining %q, want 48", got)
	}
	byConsumer := start(t, c, map[string]any{"minute": 5, "namespace": "calls"})
	if res := access(t, c, byConsumer, kongproc.Request{ConsumerID: "alice"}); len(res.Calls) != 2 {
		t.Errorf("PDK calls with a consumer: %v, want 2", res.Calls)
	}

	// 8 connections, 10 requests each, on the 48 left.
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn := srv.Dial()
			defer conn.Close()
			for i := 0; i < 10; i++ {
				res, err := conn.Access(id, req)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if !res.Exited {
					allowed++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if allowed != 48 {
		t.Fatalf("8 connections allowed %d, want exactly the 48 left", allowed)
	}
}

// TestKongRaisedLimitKeepsUsage: Kong's counters are keyed without the
// limit, so raising minute from 5 to 10 after 2 requests leaves 8, and
// each period on its own, so adding hour or removing minute keeps the
// other's usage, on the memory store and on Redis alike.
func TestKongRaisedLimitKeepsUsage(t *testing.T) {
	rs, err := redistest.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	req := kongproc.Request{ForwardedIP: "192.0.2.77"}
	for _, policy := range []map[string]any{
		{"policy": "local"},
		{"policy": "redis", "redis": map[string]any{"host": "127.0.0.1", "port": rs.Port}},
	} {
		cfg := func(minute int) map[string]any {
			f := map[string]any{"minute": minute, "limit_by": "ip", "namespace": "raise-" + policy["policy"].(string)}
			for k, v := range policy {
				f[k] = v
			}
			return f
		}
		// Each change as Kong makes it: the new instance, then the old closed.
		replace := func(old int32, config map[string]any) int32 {
			t.Helper()
			id := start(t, c, config)
			if err := c.CloseInstance(old); err != nil {
				t.Fatal(err)
			}
			return id
		}
		id := start(t, c, cfg(5))
		access(t, c, id, req)
		access(t, c, id, req)
		id = replace(id, cfg(10))
		res := access(t, c, id, req)
		if got := res.Headers.Get("X-RateLimit-Remaining-Minute"); got != "7" || res.Headers.Get("X-RateLimit-Limit-Minute") != "10" {
			t.Errorf("%s: after raising minute to 10 the 3rd request shows limit %q remaining %q, want 10 and 7 (2 used kept)",
				policy["policy"], res.Headers.Get("X-RateLimit-Limit-Minute"), got)
		}
		// Adding a period keeps the others' usage, as Kong keys each period
		// on its own (kong/plugins/rate-limiting/policies/init.lua); so does
		// removing one.
		withHour := cfg(10)
		withHour["hour"] = 100
		id = replace(id, withHour)
		res = access(t, c, id, req)
		if got, hour := res.Headers.Get("X-RateLimit-Remaining-Minute"), res.Headers.Get("X-RateLimit-Remaining-Hour"); got != "6" || hour != "99" {
			t.Errorf("%s: after adding hour the 4th request shows minute remaining %q and hour %q, want 6 (3 used kept) and 99",
				policy["policy"], got, hour)
		}
		hourOnly := cfg(10)
		delete(hourOnly, "minute")
		hourOnly["hour"] = 100
		id = replace(id, hourOnly)
		res = access(t, c, id, req)
		if got := res.Headers.Get("X-RateLimit-Remaining-Hour"); got != "98" {
			t.Errorf("%s: after removing minute the 5th request shows hour remaining %q, want 98 (1 used kept)", policy["policy"], got)
		}
	}
}

// TestKongCalendarMonthAndYear: Kong's month and year are calendar periods
// in UTC. With month=3, three requests on 31 March and one on 1 April: the
// fourth is allowed (a new month), and year=4 then denies the fifth until 1
// January. The plugin server's stores read the time from a file the test
// sets (openstore.TestClockFileEnv).
func TestKongCalendarMonthAndYear(t *testing.T) {
	clock := testclock.New(t, time.Date(2025, 3, 31, 23, 59, 0, 0, time.UTC))
	srv := kongproc.StartEnv(t, clock.Env())
	c := srv.Dial()
	defer c.Close()
	id := start(t, c, map[string]any{"month": 3, "year": 4, "limit_by": "ip"})
	req := kongproc.Request{ForwardedIP: "192.0.2.31"}
	for i, remaining := range []string{"2", "1", "0"} {
		header(t, fmt.Sprintf("31 Mar request %d", i+1), access(t, c, id, req), map[string]string{
			"X-RateLimit-Limit-Month": "3", "X-RateLimit-Remaining-Month": remaining, "RateLimit-Reset": "60"})
	}
	res := access(t, c, id, req)
	if res.Status != 429 || res.Headers.Get("Retry-After") != "60" {
		t.Fatalf("4th request on 31 Mar 23:59: status %d Retry-After %q, want 429 and 60 (the month ends in a minute)", res.Status, res.Headers.Get("Retry-After"))
	}
	clock.Set(time.Date(2025, 4, 1, 0, 1, 0, 0, time.UTC))
	header(t, "1 Apr 00:01", access(t, c, id, req), map[string]string{
		"X-RateLimit-Remaining-Month": "2", "X-RateLimit-Remaining-Year": "0",
		"RateLimit-Remaining": "0", "RateLimit-Reset": strconv.Itoa(275*86400 - 60)})
	res = access(t, c, id, req)
	if want := strconv.Itoa(275*86400 - 60); res.Status != 429 || res.Headers.Get("Retry-After") != want {
		t.Fatalf("5th request this year: status %d Retry-After %q, want 429 and %s (1 January 2026)", res.Status, res.Headers.Get("Retry-After"), want)
	}
}

// TestKongDenialIsDelayed: a denial is a delayed response that Kong
// renders (kong/init.lua, flush_delayed_response, with kong.response.error:
// body by Accept, the request id, gRPC's terms over HTTP/2): the plugin
// sets the status, error_message and rate-limit headers in one PDK call
// after the key's, reads no Accept, Content-Type or request id, and its
// event ends normally, so the connection stays. The formats themselves
// are Kong's code, compared with Kong's own plugin in real Kong
// (internal/kongreal: every Accept, gRPC over HTTP/2 and HTTP/1.1).
func TestKongDenialIsDelayed(t *testing.T) {
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	// GCRA at one an hour: every request after the first is denied however
	// slowly this machine runs.
	id := start(t, c, map[string]any{"hour": 1, "algorithm": "gcra", "limit_by": "ip", "error_code": 403, "error_message": "Too <many>"})
	req := kongproc.Request{ForwardedIP: "192.0.2.50", RequestID: "abc123", Headers: http.Header{"Accept": {"text/html"}, "Content-Type": {"application/grpc"}}, HTTPVersion: 2}
	if res := access(t, c, id, req); res.Exited || fmt.Sprint(res.Calls) != "[kong.client.get_forwarded_ip kong.response.set_headers]" {
		t.Fatalf("allowed: exited %v calls %v", res.Exited, res.Calls)
	}
	for i := 0; i < 3; i++ {
		res := access(t, c, id, req)
		if !res.Delayed || res.Status != 403 || res.Message != "Too <many>" || res.Headers.Get("Retry-After") == "" || res.Headers.Get("X-Ratelimit-Remaining-Hour") != "0" {
			t.Fatalf("denial %d: delayed %v %d %q headers %v", i+1, res.Delayed, res.Status, res.Message, res.Headers)
		}
		if fmt.Sprint(res.Calls) != "[kong.client.get_forwarded_ip kong.nginx.set_ctx]" {
			t.Errorf("denial %d made PDK calls %v, want the key's and set_ctx", i+1, res.Calls)
		}
	}
}

// TestKongPlans: over the plugin socket, one instance with three plans
// chosen by the consumer's tags: each plan gets its limits exactly, the
// unlimited plan passes with no headers, a consumer with no plan tag takes
// the default, and a consumer retagged from free to pro keeps what it used.
// The plan costs no PDK call beyond the consumer limit_by already fetches.
// A second instance chooses the plan by a header.
func TestKongPlans(t *testing.T) {
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	plans := []any{
		map[string]any{"name": "free", "minute": 2},
		map[string]any{"name": "pro", "minute": 4},
		map[string]any{"name": "internal", "unlimited": true},
	}
	byTag := start(t, c, map[string]any{"plans": plans, "default_plan": "free", "namespace": "plans-by-tag"})
	statuses := func(id int32, req kongproc.Request, n int) string {
		var got []string
		for i := 0; i < n; i++ {
			res := access(t, c, id, req)
			switch {
			case res.Exited:
				got = append(got, strconv.Itoa(res.Status))
			default:
				got = append(got, "pass")
			}
		}
		return strings.Join(got, " ")
	}
	consumer := func(id string, tags ...string) kongproc.Request {
		return kongproc.Request{ConsumerID: id, ConsumerTags: tags, ForwardedIP: "192.0.2.9"}
	}
	for _, tc := range []struct {
		req  kongproc.Request
		n    int
		want string
	}{
		{consumer("c-free", "team-a", "free"), 3, "pass pass 429"},
		{consumer("c-pro", "pro"), 5, "pass pass pass pass 429"},
		{consumer("c-int", "internal"), 6, "pass pass pass pass pass pass"},
		{consumer("c-none"), 3, "pass pass 429"},
		{consumer("c-free", "pro"), 3, "pass pass 429"}, // 2 used on free count against pro's 4
	} {
		if got := statuses(byTag, tc.req, tc.n); got != tc.want {
			t.Errorf("consumer %s tags %v: %s, want %s", tc.req.ConsumerID, tc.req.ConsumerTags, got, tc.want)
		}
	}
	res := access(t, c, byTag, consumer("c-pro-2", "pro"))
	header(t, "pro", res, map[string]string{"X-Ratelimit-Limit-Minute": "4", "X-Ratelimit-Remaining-Minute": "3"})
	if fmt.Sprint(res.Calls) != "[kong.client.get_consumer kong.response.set_headers]" {
		t.Errorf("PDK calls of an allowed request with a plan: %v, want the consumer and the headers only", res.Calls)
	}
	if res := access(t, c, byTag, consumer("c-int", "internal")); res.Exited || len(res.Headers) != 0 {
		t.Errorf("unlimited plan: exited %v headers %v, want passed with no rate-limit headers", res.Exited, res.Headers)
	}

	byHeader := start(t, c, map[string]any{"plans": plans, "default_plan": "free", "plan_by": "header",
		"plan_header": "X-Plan", "limit_by": "header", "header_name": "X-Key", "namespace": "plans-by-header"})
	req := func(key, plan string) kongproc.Request {
		h := http.Header{"X-Key": {key}}
		if plan != "" {
			h.Set("X-Plan", plan)
		}
		return kongproc.Request{Headers: h, ForwardedIP: "192.0.2.9"}
	}
	if got := statuses(byHeader, req("k1", "pro"), 5); got != "pass pass pass pass 429" {
		t.Errorf("X-Plan pro: %s", got)
	}
	if got := statuses(byHeader, req("k2", "platinum"), 3); got != "pass pass 429" {
		t.Errorf("X-Plan naming no plan: %s, want the default plan's 2", got)
	}
}

// TestKongInFlight: two plugin servers (two Kong nodes) on one redis-server
// share a limit of 2 requests in flight: the access phase takes a slot and
// carries it in kong.ctx.shared to the log phase, which gives it back;
// while 2 are held both nodes refuse the third with Retry-After 1. Then
// node 1 is killed holding both slots: node 2 gets them back within the
// 2 s lease. Both nodes also share the 429 status and the IETF item
// qu="concurrent-requests".
func TestKongInFlight(t *testing.T) {
	rs := redistest.StartT(t)
	const lease = 2 * time.Second
	cfg := map[string]any{"limits": []any{map[string]any{"count": 2, "window": "2s", "algorithm": "in_flight", "name": "exports"}},
		"policy": "redis", "redis": rs.KongRecord(), "limit_by": "header", "header_name": "X-Key",
		"headers": "both"}
	node1, node2 := kongproc.StartResponse(t), kongproc.StartResponse(t) // in-flight slots go back in the log phase
	c1, c2 := node1.Dial(), node2.Dial()
	defer c2.Close()
	id1, id2 := start(t, c1, cfg), start(t, c2, cfg)
	request := func() kongproc.Request {
		return kongproc.Request{Headers: http.Header{"X-Key": {"acme"}}, ForwardedIP: "198.51.100.7", Shared: map[string]any{}}
	}
	a, b := request(), request()
	if res := access(t, c1, id1, a); res.Exited {
		t.Fatalf("first: %d", res.Status)
	}
	res := access(t, c2, id2, b)
	if res.Exited {
		t.Fatalf("second: %d", res.Status)
	}
	header(t, "second", res, map[string]string{"Ratelimit-Policy": `"exports";q=2;qu="concurrent-requests"`})
	for _, n := range []struct {
		c  *kongproc.Client
		id int32
	}{{c1, id1}, {c2, id2}} {
		res := access(t, n.c, n.id, request())
		if !res.Exited || res.Status != 429 {
			t.Fatalf("third while two are held: exited %v status %d, want 429", res.Exited, res.Status)
		}
		header(t, "third", res, map[string]string{"Retry-After": "1"})
	}
	if _, err := c2.Log(id2, b); err != nil { // b's response finished on node 2
		t.Fatal(err)
	}
	held := request()
	if res := access(t, c1, id1, held); res.Exited {
		t.Fatalf("after b's log phase: %d, want its slot back", res.Status)
	}
	// Node 1 now holds both slots (a and held) and dies.
	node1.Kill()
	killed := time.Now()
	freed := waitfor.True(t, lease+3*time.Second, "node 2 gets a slot back", func() bool {
		r := request()
		if res := access(t, c2, id2, r); res.Exited {
			return false
		}
		_, _ = c2.Log(id2, r)
		return true
	})
	t.Logf("node 1's slots came back %v after it was killed (lease %v)", freed, lease)
	if since := time.Since(killed); since < lease/3 {
		t.Errorf("a slot came back %v after the kill: before any of node 1's leases could end", since)
	}
}

// withTimeout is a redis record with its timeout in ms.
func withTimeout(record map[string]any, ms int) map[string]any {
	record["timeout"] = ms
	return record
}
