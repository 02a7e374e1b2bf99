package kongplugin_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/testclock"
)

// These tests drive the real tollgate-response-ratelimiting plugin server
// over its socket as Kong 3.9.3 does for a Go plugin with the access and
// response phases (kong/runloop/plugin_servers/plugin.lua: one event per
// phase; the response phase has the upstream's buffered response). They
// replay spec/03-plugins/24-response-rate-limiting/04-access_spec.lua's
// cases against Kong's response-ratelimiting as its Lua reads. Real Kong
// runs them beside Kong's own plugin in `make kong-test`
// (TestKongResponseRateLimitingSideBySide); these add the plugin server's
// clock moved to a window's end and the fleet on one Redis, in make test's
// seconds, without Kong.

// newRRLClock pins the plugin server's clock half way through a second, so
// a test's requests share each period's window, as the spec's wait() makes
// them share a second.
func newRRLClock(t *testing.T) *testclock.Clock {
	return testclock.New(t, time.Date(2025, 6, 1, 12, 0, 0, 500_000_000, time.UTC))
}

// rrlNode is one plugin server and Kong's connection to it.
type rrlNode struct {
	t   *testing.T
	srv *kongproc.Server
	c   *kongproc.Client
}

func startRRL(t *testing.T, clock *testclock.Clock) *rrlNode {
	srv := kongproc.StartPackage(t, kongproc.ResponseLimitsPackage, clock.Env())
	n := &rrlNode{t: t, srv: srv, c: srv.Dial()}
	t.Cleanup(func() { n.c.Close() })
	return n
}

// rrlConfig is a config as Kong stores it for response-ratelimiting's
// schema (the defaults filled, as the kong-schema harness shows Kong 3.9.3
// storing them), with fields over it and Kong's own additions.
func rrlConfig(fields map[string]any) map[string]any {
	c := map[string]any{"header_name": "x-kong-limit", "limit_by": "consumer", "policy": "local", "fault_tolerant": true,
		"block_on_first_violation": false, "hide_client_headers": false,
		"redis":    map[string]any{"host": nil, "port": 6379, "timeout": 2000, "database": 0, "ssl": false, "ssl_verify": false},
		"route_id": "route-1", "service_id": "service-1", "consumer_id": nil, "__plugin_id": "plugin-rrl"}
	for k, v := range fields {
		c[k] = v
	}
	return c
}

func (n *rrlNode) start(fields map[string]any) int32 {
	n.t.Helper()
	id, err := n.c.StartInstance(rrlConfig(fields))
	if err != nil {
		n.t.Fatalf("StartInstance: %v", err)
	}
	return id
}

// rrlResult is what the client got: the status, the headers (the
// upstream's, less those the plugin cleared, and the plugin's) and the
// body of a refusal; events are the events Kong sent and calls the PDK
// calls the plugin made, over both phases.
type rrlResult struct {
	status  int
	headers http.Header
	body    string
	events  int
	calls   []string
}

func (r rrlResult) int(name string) int {
	v, err := strconv.Atoi(r.headers.Get(name))
	if err != nil {
		return -1
	}
	return v
}

// call sends one request through the access phase and, when it passes, an
// upstream answer with usage headers through the response phase.
func (n *rrlNode) call(id int32, req kongproc.Request, usage ...string) rrlResult {
	n.t.Helper()
	req.Shared = map[string]any{}
	res, err := n.c.Access(id, req)
	if err != nil {
		n.t.Fatalf("access: %v", err)
	}
	out := rrlResult{headers: res.Headers.Clone(), events: 1, calls: res.Calls}
	if res.Exited { // a delayed response: the event ended, the connection stays
		out.status, out.body = res.Status, res.Body
		return out
	}
	upstream := http.Header{"Content-Type": {"application/json"}}
	for _, u := range usage {
		upstream.Add("X-Kong-Limit", u)
	}
	req.ServiceHeaders = upstream
	res, err = n.c.Response(id, req)
	if err != nil {
		n.t.Fatalf("response: %v", err)
	}
	out.events++
	out.calls = append(out.calls, res.Calls...)
	for k, v := range upstream {
		if !slices.ContainsFunc(res.Cleared, func(c string) bool { return strings.EqualFold(c, k) }) {
			out.headers[k] = v
		}
	}
	for k, v := range res.Headers {
		out.headers[k] = v
	}
	out.status = 200
	if res.Exited {
		n.c = n.srv.Dial() // kong.response.exit in the response phase ends the connection, as in Kong
		out.status, out.body = res.Status, res.Body
	}
	return out
}

const iterations = 10 // the spec's ITERATIONS

var ip = kongproc.Request{ForwardedIP: "192.0.2.44"}

// TestKongResponseLimitsSpecAccess replays 04-access_spec.lua's
// "Without authentication (IP address)", "With authentication", "Upstream
// usage headers", block_on_first_violation and hide_client_headers cases,
// on policy local and redis.
func TestKongResponseLimitsSpecAccess(t *testing.T) {
	rs := redistest.StartT(t)
	for _, policy := range []string{"local", "redis"} {
		t.Run(policy, func(t *testing.T) {
			clock := newRRLClock(t)
			node := startRRL(t, clock)
			route := 0
			start := func(fields map[string]any) int32 {
				fields["policy"] = policy
				if policy == "redis" {
					fields["redis"] = rs.KongRecord()
				}
				if _, ok := fields["route_id"]; !ok {
					route++ // each spec route its own counters
					fields["route_id"] = fmt.Sprintf("%s-route-%d", policy, route)
				}
				return node.start(fields)
			}
			video := func(second any) map[string]any { return map[string]any{"video": map[string]any{"second": second}} }

			t.Run("returns remaining counter", func(t *testing.T) {
				id := start(map[string]any{"limits": video(iterations)})
				for i := 0; i < iterations/2; i++ {
					if r := node.call(id, ip, "video=1"); r.status != 200 {
						t.Fatalf("request %d: %d", i+1, r.status)
					}
				}
				r := node.call(id, ip, "video=1")
				if r.status != 200 || r.int("X-Ratelimit-Limit-Video-Second") != iterations || r.int("X-Ratelimit-Remaining-Video-Second") != iterations-iterations/2-1 {
					t.Fatalf("6th: %d limit %d remaining %d, want 200, 10 and 4", r.status, r.int("X-Ratelimit-Limit-Video-Second"), r.int("X-Ratelimit-Remaining-Video-Second"))
				}
				if r.headers.Get("X-Kong-Limit") != "" {
					t.Fatalf("the usage header reached the client: %q (header_filter.lua clears it)", r.headers.Get("X-Kong-Limit"))
				}
			})

			// testLimit is the spec's test_limit: limit calls of video=1 pass,
			// the next is refused in the response phase, without a body.
			testLimit := func(t *testing.T, id int32, req kongproc.Request, limit int) {
				t.Helper()
				for i := 0; i < limit; i++ {
					if r := node.call(id, req, "video=1"); r.status != 200 {
						t.Fatalf("request %d: %d", i+1, r.status)
					}
				}
				r := node.call(id, req, "video=1")
				if r.status != 429 || r.body != "" || r.int("X-Ratelimit-Limit-Video-Second") != limit || r.int("X-Ratelimit-Remaining-Video-Second") != 0 {
					t.Fatalf("request %d: %d %q limit %d remaining %d, want a bodiless 429 with %d and 0", limit+1, r.status, r.body,
						r.int("X-Ratelimit-Limit-Video-Second"), r.int("X-Ratelimit-Remaining-Video-Second"), limit)
				}
			}
			t.Run("blocks if exceeding limit", func(t *testing.T) {
				testLimit(t, start(map[string]any{"limits": video(iterations)}), ip, iterations)
			})

			t.Run("counts against the same service register from different routes", func(t *testing.T) {
				// One plugin on a service: route_id null, counters shared by its routes.
				cfg := map[string]any{"limits": video(iterations), "route_id": nil, "service_id": policy + "-service-10"}
				a, b := start(cfg), start(cfg)
				for i := 0; i < iterations; i++ {
					id := a
					if i >= iterations/2 {
						id = b
					}
					if r := node.call(id, ip, fmt.Sprintf("video=1, test=%d", iterations)); r.status != 200 {
						t.Fatalf("request %d: %d", i+1, r.status)
					}
				}
				if r := node.call(a, ip, fmt.Sprintf("video=1, test=%d", iterations)); r.status != 429 {
					t.Fatalf("11th: %d, want 429", r.status)
				}
			})

			t.Run("handles multiple limits", func(t *testing.T) {
				id := start(map[string]any{"limits": map[string]any{
					"video": map[string]any{"second": iterations * 2, "minute": iterations * 4},
					"image": map[string]any{"second": iterations}}})
				n := iterations / 2
				var r rrlResult
				for i := 0; i < n; i++ {
					if r = node.call(id, ip, "video=2, image=1"); r.status != 200 {
						t.Fatalf("request %d: %d", i+1, r.status)
					}
				}
				want := map[string]int{"X-Ratelimit-Limit-Video-Second": iterations * 2, "X-Ratelimit-Remaining-Video-Second": iterations*2 - n*2,
					"X-Ratelimit-Limit-Video-Minute": iterations * 4, "X-Ratelimit-Remaining-Video-Minute": iterations*4 - n*2,
					"X-Ratelimit-Limit-Image-Second": iterations, "X-Ratelimit-Remaining-Image-Second": iterations - n}
				for name, v := range want {
					if r.int(name) != v {
						t.Errorf("after %d calls: %s %d, want %d", n, name, r.int(name), v)
					}
				}
				for i := n; i < iterations; i++ {
					if r := node.call(id, ip, "video=1, image=1"); r.status != 200 {
						t.Fatalf("request %d: %d", i+1, r.status)
					}
				}
				r = node.call(id, ip, "video=1, image=1")
				// A refused response is charged nothing: it shows what the
				// access phase saw, as the spec asserts.
				want = map[string]int{"X-Ratelimit-Remaining-Image-Second": 0,
					"X-Ratelimit-Remaining-Video-Minute": iterations*4 - n*2 - (iterations - n),
					"X-Ratelimit-Remaining-Video-Second": iterations*2 - n*2 - (iterations - n)}
				for name, v := range want {
					if r.int(name) != v {
						t.Errorf("refused call: %s %d, want %d", name, r.int(name), v)
					}
				}
				if r.status != 429 {
					t.Fatalf("refused call: %d, want 429", r.status)
				}
			})

			t.Run("With authentication: per consumer & route, and per route", func(t *testing.T) {
				// Kong picks the consumer's own plugin for consumer 1 (8 a
				// second) and the route's for consumer 2 (7); both key on the
				// consumer (limit_by's default).
				routeID := policy + "-route-3"
				perConsumer := start(map[string]any{"limits": video(iterations - 2), "route_id": routeID, "consumer_id": "consumer-1"})
				perRoute := start(map[string]any{"limits": video(iterations - 3), "route_id": routeID})
				testLimit(t, perConsumer, kongproc.Request{ForwardedIP: "192.0.2.1", ConsumerID: "consumer-1"}, iterations-2)
				testLimit(t, perRoute, kongproc.Request{ForwardedIP: "192.0.2.1", ConsumerID: "consumer-2"}, iterations-3)
			})

			t.Run("Upstream usage headers: the remaining of each resource", func(t *testing.T) {
				id := start(map[string]any{"limits": map[string]any{
					"video": map[string]any{"second": iterations, "minute": iterations * 2},
					"image": map[string]any{"second": iterations - 1}}})
				r := node.call(id, ip)
				if r.int("X-Ratelimit-Remaining-Image") != iterations-1 || r.int("X-Ratelimit-Remaining-Video") != iterations {
					t.Fatalf("first call: image %d video %d, want 9 and 10", r.int("X-Ratelimit-Remaining-Image"), r.int("X-Ratelimit-Remaining-Video"))
				}
				node.call(id, ip, "video=2, image=1")
				r = node.call(id, ip)
				if r.int("X-Ratelimit-Remaining-Image") != iterations-2 || r.int("X-Ratelimit-Remaining-Video") != iterations-2 {
					t.Fatalf("after video=2, image=1: image %d video %d, want 8 and 8", r.int("X-Ratelimit-Remaining-Image"), r.int("X-Ratelimit-Remaining-Video"))
				}
			})

			t.Run("combines multiple x-kong-limit headers from upstream", func(t *testing.T) {
				id := start(map[string]any{"limits": map[string]any{
					"video": map[string]any{"second": iterations*2 + 2}, "image": map[string]any{"second": iterations}}})
				for i := 0; i < iterations; i++ {
					if r := node.call(id, ip, "video=2", "image=1"); r.status != 200 {
						t.Fatalf("request %d: %d", i+1, r.status)
					}
				}
				if r := node.call(id, ip, "video=1"); r.status != 200 {
					t.Fatalf("video=1 alone, image spent: %d, want 200 (it takes no image)", r.status)
				}
				r := node.call(id, ip, "video=2", "image=1")
				if r.status != 429 || r.int("X-Ratelimit-Remaining-Image-Second") != 0 || r.int("X-Ratelimit-Remaining-Video-Second") != 1 {
					t.Fatalf("image spent: %d image %d video %d, want 429, 0 and 1", r.status,
						r.int("X-Ratelimit-Remaining-Image-Second"), r.int("X-Ratelimit-Remaining-Video-Second"))
				}
			})

			t.Run("should block on first violation", func(t *testing.T) {
				id := start(map[string]any{"block_on_first_violation": true, "limits": map[string]any{
					"video": map[string]any{"second": iterations, "minute": iterations * 2}, "image": map[string]any{"second": 4}}})
				if r := node.call(id, ip, "video=2, image=4"); r.status != 200 {
					t.Fatalf("first: %d", r.status)
				}
				r := node.call(id, ip, "video=2")
				var body map[string]string
				if err := json.Unmarshal([]byte(r.body), &body); err != nil || r.status != 429 || body["message"] != "API rate limit exceeded for 'image'" {
					t.Fatalf("second: %d %q, want 429 with {\"message\":\"API rate limit exceeded for 'image'\"}", r.status, r.body)
				}
				if r.events != 1 {
					t.Fatalf("refused in %d events, want 1: refused in the access phase, before the upstream", r.events)
				}
			})

			t.Run("does not send rate-limit headers when hide_client_headers==true", func(t *testing.T) {
				id := start(map[string]any{"hide_client_headers": true, "limits": video(iterations)})
				r := node.call(id, ip, "video=1")
				for name := range r.headers {
					if strings.HasPrefix(strings.ToLower(name), "x-ratelimit") {
						t.Fatalf("header %s sent with hide_client_headers", name)
					}
				}
			})

			t.Run("expires a counter", func(t *testing.T) {
				id := start(map[string]any{"limits": video(iterations), "fault_tolerant": false})
				for range 2 {
					r := node.call(id, ip, "video=1")
					if r.status != 200 || r.int("X-Ratelimit-Limit-Video-Second") != iterations || r.int("X-Ratelimit-Remaining-Video-Second") != iterations-1 {
						t.Fatalf("%d limit %d remaining %d, want 200, 10 and 9", r.status, r.int("X-Ratelimit-Limit-Video-Second"), r.int("X-Ratelimit-Remaining-Video-Second"))
					}
					clock.Advance(time.Second) // the next second's counter
				}
			})

			t.Run("global for single consumer, no matter what route", func(t *testing.T) {
				// A plugin on a consumer alone: no route, no service.
				id := start(map[string]any{"limits": video(iterations), "route_id": nil, "service_id": nil, "consumer_id": "consumer-126"})
				testLimit(t, id, kongproc.Request{ForwardedIP: "192.0.2.2", ConsumerID: "consumer-126"}, iterations)
			})
		})
	}
}

// TestKongResponseLimitsFaultTolerance is the spec's "fault tolerance"
// block: with Redis unreachable, fault_tolerant false answers 500 and
// true proxies without headers.
func TestKongResponseLimitsFaultTolerance(t *testing.T) {
	clock := newRRLClock(t)
	node := startRRL(t, clock)
	port, err := redistest.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	dead := map[string]any{"host": "127.0.0.1", "port": port, "timeout": 200, "database": 0, "ssl": false, "ssl_verify": false}
	strict := node.start(map[string]any{"policy": "redis", "redis": dead, "fault_tolerant": false, "limits": map[string]any{"video": map[string]any{"second": iterations}}})
	if r := node.call(strict, ip, "video=1"); r.status != 500 || !strings.Contains(r.body, "An unexpected error occurred") {
		t.Fatalf("fault_tolerant false: %d %q, want 500 with Kong's error", r.status, r.body)
	}
	tolerant := node.start(map[string]any{"policy": "redis", "redis": dead, "fault_tolerant": true, "route_id": "route-2",
		"limits": map[string]any{"video": map[string]any{"second": iterations}}})
	r := node.call(tolerant, ip, "video=1")
	if r.status != 200 || r.headers.Get("X-Ratelimit-Remaining-Video") != "" || r.headers.Get("X-Ratelimit-Limit-Video-Second") != "" {
		t.Fatalf("fault_tolerant true: %d %v, want 200 without rate-limit headers", r.status, r.headers)
	}
}

// TestKongResponseLimitsFleet: two plugin servers on one Redis share each
// resource's counters, and the PDK calls per request are what
// docs/kong.md's table says.
func TestKongResponseLimitsFleet(t *testing.T) {
	rs := redistest.StartT(t)
	clock := newRRLClock(t)
	nodes := []*rrlNode{startRRL(t, clock), startRRL(t, clock)}
	cfg := map[string]any{"policy": "redis", "redis": rs.KongRecord(), "limit_by": "ip",
		"limits": map[string]any{"tokens": map[string]any{"minute": 1000}}}
	ids := []int32{nodes[0].start(cfg), nodes[1].start(cfg)}
	served := 0
	var last rrlResult
	for i := 0; i < 20; i++ {
		last = nodes[i%2].call(ids[i%2], ip, "tokens=150")
		if last.status != 200 {
			break
		}
		served++
	}
	// 6 calls leave 100; the 7th is admitted (a unit left) and overdraws by
	// 50; the 8th is refused, in its response phase, and not charged.
	if served != 7 || last.status != 429 {
		t.Fatalf("served %d calls of 150 tokens before a %d, want 7 then 429", served, last.status)
	}
	r := nodes[0].call(ids[0], ip)
	if r.status != 200 || r.int("X-Ratelimit-Remaining-Tokens") != 0 {
		t.Fatalf("a call that reports no usage: %d remaining %d, want 200 and 0 (it takes nothing)", r.status, r.int("X-Ratelimit-Remaining-Tokens"))
	}
	t.Logf("events per request: %d; PDK calls: %v", r.events, r.calls)
	wantCalls := []string{"kong.client.get_forwarded_ip", "kong.request.get_header", "kong.response.set_headers", "kong.ctx.shared.set",
		"kong.ctx.shared.get", "kong.response.get_headers", "kong.response.clear_header", "kong.response.set_headers"}
	if r.events != 2 || !slices.Equal(r.calls, wantCalls) {
		t.Fatalf("events %d calls %v, want 2 events and %v", r.events, r.calls, wantCalls)
	}
}

// TestKongResponseLimitsSpecSchema replays every it() of
// spec/03-plugins/24-response-rate-limiting/01-schema_spec.lua against
// the dumped schema, as Kong's Admin API reads it, with Kong 3.9.3's
// verdicts and stored configs as the kong-schema harness gave them
// (KONG_PLUGIN=response-ratelimiting): the same verdict on every case a
// dump can express. The period-order cases are Kong's custom_validator, a
// Lua function no dump carries: the plugin takes them (and logs Kong's
// words), enforcing each period on its own. An accepted config must start
// in the plugin.
func TestKongResponseLimitsSpecSchema(t *testing.T) {
	api := adminAPIOf(t, kongproc.ResponseLimitsPackage)
	clock := newRRLClock(t)
	node := startRRL(t, clock)
	video := func(periods map[string]any) map[string]any { return map[string]any{"video": periods} }
	redis, withHost := specRedis()
	for _, tc := range []struct {
		it     string
		config map[string]any
		kong   string // Kong's error ("" accepts)
		taken  bool   // Kong refuses in Lua; tollgate takes it
	}{
		{"proper config validates", map[string]any{"limits": video(map[string]any{"second": 1})}, "", false},
		{"proper config validates (bis)", map[string]any{"limits": video(map[string]any{"second": 1, "minute": 2, "hour": 3, "day": 4, "month": 5, "year": 6})}, "", false},
		{"empty config", map[string]any{}, "config.limits: required field missing", false},
		{"empty config (limits = {})", map[string]any{"limits": map[string]any{}}, "config.limits: length must be at least 1", false},
		{"invalid limit", map[string]any{"limits": video(map[string]any{"seco": 1})}, "config.limits.seco: unknown field", false},
		{"limits: 'null' value does not cause 500, issue #8314", map[string]any{"limits": video(map[string]any{"second": nil, "minute": 1})}, "", false},
		{"limits: smaller unit is less than bigger unit", map[string]any{"limits": video(map[string]any{"second": 2, "minute": 1})},
			"the limit for minute(1.0) cannot be lower than the limit for second(2.0)", true},
		{"limits: smaller unit is less than bigger unit (bis)", map[string]any{"limits": video(map[string]any{"second": 1, "minute": 2, "hour": 3, "day": 4, "month": 6, "year": 5})},
			"the limit for year(5.0) cannot be lower than the limit for month(6.0)", true},
		{"invaldid unit type", map[string]any{"limits": map[string]any{"second": 10}}, "config.limits: expected a record", false},
		{"proper config validates with redis new structure", map[string]any{"limits": video(map[string]any{"second": 10}), "policy": "redis", "redis": withHost}, "", false},
		{"proper config validates with redis legacy structure", map[string]any{"limits": video(map[string]any{"second": 10}), "policy": "redis",
			"redis_host": "localhost", "redis_port": 6379, "redis_database": 0, "redis_username": "test", "redis_password": "testXXX",
			"redis_ssl": true, "redis_ssl_verify": false, "redis_timeout": 1100, "redis_server_name": "test-redis.example.com"}, "", false},
		// Kong: config.redis.host: required field missing; tollgate's
		// record also takes Cluster or Sentinel addresses instead of a host.
		{"verifies that redis required fields are supplied", map[string]any{"limits": video(map[string]any{"second": 10}), "policy": "redis", "redis": redis},
			"must set one of 'config.redis.host', 'config.redis_host', 'config.redis.cluster_addresses', 'config.redis.sentinel_master' when 'policy' is 'redis'", false},
	} {
		config, err := stored(t, api, tc.config, "route-schema", nil)
		switch {
		case tc.kong == "" || tc.taken:
			if err != nil {
				t.Errorf("%s: Kong's Admin API stores it; the dumped schema refuses: %v", tc.it, err)
				continue
			}
		case err == nil || !strings.Contains(err.Error(), tc.kong):
			t.Errorf("%s: Kong refuses with %q; the dumped schema says %v", tc.it, tc.kong, err)
			continue
		default:
			continue // refused at the Admin API: no instance
		}
		if _, err := node.c.StartInstance(config); err != nil {
			t.Errorf("%s: the Admin API stores it, the plugin does not start it: %v", tc.it, err)
			node.c = node.srv.Dial()
		}
	}
	// What Kong 3.9.3 stores for {limits = {video = {minute = 10}}}: the
	// stored config's Kong fields, as the harness printed them.
	config, err := stored(t, api, map[string]any{"limits": video(map[string]any{"minute": 10})}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for field, want := range map[string]any{"header_name": "x-kong-limit", "limit_by": "consumer", "policy": "local", "fault_tolerant": true,
		"block_on_first_violation": false, "hide_client_headers": false} {
		if config[field] != want {
			t.Errorf("stored %s = %v, Kong stores %v", field, config[field], want)
		}
	}
}

// TestKongResponseLimitsKeys: the keys command reads each resource's
// counters from Redis, the resource picked by --policy (the first by
// name by default), and names the config's resources when --policy names
// none of them.
func TestKongResponseLimitsKeys(t *testing.T) {
	rs := redistest.StartT(t)
	clock := newRRLClock(t)
	node := startRRL(t, clock)
	fields := map[string]any{"policy": "redis", "redis": rs.KongRecord(), "limit_by": "ip",
		"limits": map[string]any{"video": map[string]any{"minute": 20}, "image": map[string]any{"minute": 10}}}
	id := node.start(fields)
	const ip = "203.0.113.9"
	for range 3 {
		if r := node.call(id, kongproc.Request{ForwardedIP: ip}, "video=2, image=1"); r.status != 200 {
			t.Fatalf("call: %d", r.status)
		}
	}
	config := rrlConfig(fields)
	for _, attached := range []string{"route_id", "service_id", "consumer_id", "__plugin_id"} {
		delete(config, attached)
	}
	b, _ := json.Marshal(map[string]any{"id": "plugin-rrl", "name": "tollgate-response-ratelimiting", "config": config,
		"route": map[string]any{"id": "route-1"}, "service": map[string]any{"id": "service-1"}})
	plugin := filepath.Join(t.TempDir(), "plugin.json")
	if err := os.WriteFile(plugin, b, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(want int, args ...string) (map[string]any, string) {
		t.Helper()
		cmd := exec.Command(kongproc.BinaryOf(t, kongproc.ResponseLimitsPackage), append([]string{"keys"}, args...)...)
		cmd.Env = append(os.Environ(), clock.Env()) // the plugin server's time
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, _ := cmd.Output()
		if code := cmd.ProcessState.ExitCode(); code != want {
			t.Fatalf("keys %v: exit %d, want %d\n%s%s", args, code, want, out, stderr.String())
		}
		var v map[string]any
		if want == 0 {
			if err := json.Unmarshal(out, &v); err != nil {
				t.Fatalf("keys %v: %v\n%s", args, err, out)
			}
		}
		return v, stderr.String()
	}
	for _, tc := range []struct{ policy, want, name string }{
		{"", "minute:3/10", "route=route-1,service=service-1,policy=image"},
		{"image", "minute:3/10", "route=route-1,service=service-1,policy=image"},
		{"video", "minute:6/20", "route=route-1,service=service-1,policy=video"},
	} {
		args := []string{"show", "--plugin", plugin, "--key", ip}
		if tc.policy != "" {
			args = append(args, "--policy", tc.policy)
		}
		v, _ := run(0, args...)
		if got := used(v); got != tc.want || v["policy"] != tc.name {
			t.Errorf("--policy %q: %s as %v, want %s as %s", tc.policy, got, v["policy"], tc.want, tc.name)
		}
	}
	if _, stderr := run(1, "show", "--plugin", plugin, "--key", ip, "--policy", "audio"); !strings.Contains(stderr, `["image" "video"]`) {
		t.Errorf("--policy audio: %q, want the config's resources named", stderr)
	}
}
