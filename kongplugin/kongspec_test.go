package kongplugin_test

// Kong's own spec of its rate-limiting plugin (Kong 3.9.3,
// spec/03-plugins/23-rate-limiting/), replayed as tables through the real
// plugin binary over its socket: each config goes through the dumped
// schema as Kong's Admin API would process it (defaults filled:
// kongschema.Check, which TestKongStoresAsKong holds to Kong's own schema
// code), then to StartInstance; each request is one access event with the
// PDK answers Kong's proxy would give (internal/kongproc). The same
// scenarios run in real Kong beside Kong's own plugin in `make kong-test`
// (internal/kongreal, TestKongRateLimitingSideBySide and
// TestKongAdminAPIVerdicts), which is where a Kong claim is proven. What
// these add: they run in make test in seconds, on every change, without
// Kong, and they pin the plugin's side of the protocol (the configs
// StartInstance takes, the PDK calls an event makes).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
)

// adminAPI is Kong's Admin API for the plugin: its dumped schema, as Kong
// reads it from the query command.
func adminAPI(t *testing.T) *kongschema.Schema {
	t.Helper()
	return adminAPIOf(t, kongproc.PluginPackage)
}

// adminAPIOf is adminAPI for the plugin server command pkg.
func adminAPIOf(t *testing.T, pkg string) *kongschema.Schema {
	t.Helper()
	var dump struct {
		Plugins []struct{ Schema map[string]any }
	}
	dec := json.NewDecoder(bytes.NewReader(kongproc.DumpOf(t, pkg)))
	dec.UseNumber() // numbers as dumped
	if err := dec.Decode(&dump); err != nil {
		t.Fatal(err)
	}
	schema := dump.Plugins[0].Schema
	delete(schema, "name") // the plugin's name, which -dump adds to the declaration
	b, _ := json.Marshal(schema)
	s, err := kongschema.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// stored is config as Kong stores and sends it: processed by the Admin
// API (defaults filled), with the ids Kong adds.
func stored(t *testing.T, api *kongschema.Schema, config map[string]any, routeID, serviceID any) (map[string]any, error) {
	t.Helper()
	b, _ := json.Marshal(config)
	var c map[string]any
	_ = json.Unmarshal(b, &c) // a copy, numbers as JSON's
	if err := api.Check(c); err != nil {
		return nil, err
	}
	c["route_id"], c["service_id"], c["consumer_id"], c["__plugin_id"] = routeID, serviceID, nil, "plugin-spec"
	return c, nil
}

// specRedis are the redis records of Kong's schema specs: without a host
// (what "verifies that redis required fields are supplied" writes), and
// with one (spec/internal/constants.lua's defaults).
func specRedis() (redis, withHost map[string]any) {
	redis = map[string]any{"port": 6379, "database": 0, "username": "test", "password": "testXXX", "ssl": true, "ssl_verify": false,
		"timeout": 1100, "server_name": "test-redis.example.com"}
	withHost = map[string]any{"host": "localhost"}
	for k, v := range redis {
		withHost[k] = v
	}
	return redis, withHost
}

// TestKongSpecSchema replays every it() of 01-schema_spec.lua: Kong's
// verdict at the Admin API, and an accepted config must start in the
// plugin. The two period-order cases are tollgate's documented choice (a
// Lua validator no dump carries; the plugin takes the config and enforces
// each period), and two refusals word their error differently (tollgate
// also takes limits and plans, and Cluster or Sentinel instead of a host).
func TestKongSpecSchema(t *testing.T) {
	api := adminAPI(t)
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	redis, withHost := specRedis()
	for _, tc := range []struct {
		it      string
		config  map[string]any
		kong    string // Kong's error ("" accepts)
		differs string // why tollgate's verdict or words differ
	}{
		{"proper config validates", map[string]any{"second": 10}, "", ""},
		{"proper config validates (bis)", map[string]any{"second": 10, "minute": 20, "hour": 30, "day": 40, "month": 50, "year": 60}, "", ""},
		{"proper config validates (header)", map[string]any{"second": 10, "limit_by": "header", "header_name": "X-App-Version"}, "", ""},
		{"proper config validates (path)", map[string]any{"second": 10, "limit_by": "path", "path": "/request"}, "", ""},
		{"errors: limits: smaller unit is less than bigger unit", map[string]any{"second": 20, "hour": 10},
			"The limit for hour(10.0) cannot be lower than the limit for second(20.0)", "taken: Kong's check is Lua no dump carries"},
		{"errors: limits: smaller unit is less than bigger unit (bis)", map[string]any{"second": 10, "minute": 20, "hour": 30, "day": 40, "month": 60, "year": 50},
			"The limit for year(50.0) cannot be lower than the limit for month(60.0)", "taken: Kong's check is Lua no dump carries"},
		{"errors: invalid limit", map[string]any{},
			"at least one of these fields must be non-empty: 'config.second', 'config.minute', 'config.hour', 'config.day', 'config.month', 'config.year'",
			"refused naming limits and plans too"},
		{"errors: is limited by header but the header_name field is missing", map[string]any{"second": 10, "limit_by": "header"}, "config.header_name: required field missing", ""},
		{"errors: is limited by path but the path field is missing", map[string]any{"second": 10, "limit_by": "path"}, "config.path: required field missing", ""},
		{"errors: proper config validates with redis new structure", map[string]any{"second": 10, "policy": "redis", "redis": withHost}, "", ""},
		{"errors: proper config validates with redis legacy structure", map[string]any{"second": 10, "policy": "redis", "redis_host": "localhost", "redis_port": 6379,
			"redis_database": 0, "redis_username": "test", "redis_password": "testXXX", "redis_ssl": true, "redis_ssl_verify": false, "redis_timeout": 1100,
			"redis_server_name": "test-redis.example.com"}, "", ""},
		{"errors: verifies that redis required fields are supplied", map[string]any{"second": 10, "policy": "redis", "redis": redis},
			"config.redis.host: required field missing", "refused as must set one of 'config.redis.host', ... (Cluster and Sentinel need no host)"},
	} {
		config, err := stored(t, api, tc.config, nil, nil)
		switch {
		case tc.kong == "" && err != nil:
			t.Errorf("%s: Kong accepts; the dumped schema refuses: %v", tc.it, err)
			continue
		case tc.kong != "" && tc.differs == "" && (err == nil || !strings.Contains(err.Error(), tc.kong)):
			t.Errorf("%s: Kong refuses with %q; the dumped schema says %v", tc.it, tc.kong, err)
			continue
		case tc.kong != "" && strings.HasPrefix(tc.differs, "refused") && err == nil:
			t.Errorf("%s: Kong refuses; the dumped schema accepts", tc.it)
			continue
		case tc.kong != "" && strings.HasPrefix(tc.differs, "taken") && err != nil:
			t.Errorf("%s: tollgate takes it (%s); the dumped schema says %v", tc.it, tc.differs, err)
			continue
		}
		if err != nil {
			continue // refused at the Admin API: no instance
		}
		if _, err := c.StartInstance(config); err != nil {
			t.Errorf("%s: the Admin API stores it, the plugin does not start it: %v", tc.it, err)
			c = srv.Dial()
		}
	}
}

// specRequest is one request of 04-access_spec.lua's and what came back.
type specResult struct {
	status  int
	headers http.Header
	body    string
}

func (r specResult) int(name string) int {
	n, err := strconv.Atoi(r.headers.Get(name))
	if err != nil {
		return -1
	}
	return n
}

// TestKongSpecAccess replays the behaviours 04-access_spec.lua asserts,
// on policy local and redis, as the spec runs them.
func TestKongSpecAccess(t *testing.T) {
	rs := redistest.StartT(t)
	api := adminAPI(t)
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	// startSpec starts an instance of fields on policy, attached to
	// routeID and serviceID (nil: global); fresh empties the stores
	// first, as the spec's before_each resets Redis (local counters are
	// kept apart by the instance's namespace).
	instance := 0
	startSpec := func(t *testing.T, policy string, fields map[string]any, routeID, serviceID any, fresh bool) int32 {
		t.Helper()
		fields["policy"] = policy
		if policy == "redis" {
			fields["redis"] = rs.KongRecord()
		}
		if fresh {
			instance++
		}
		fields["namespace"] = fmt.Sprintf("spec-%d-%v-%v", instance, routeID, serviceID)
		config, err := stored(t, api, fields, routeID, serviceID)
		if err != nil {
			t.Fatalf("the Admin API refuses %v: %v", fields, err)
		}
		if policy == "redis" && fresh {
			if _, err := rs.Do("FLUSHALL"); err != nil {
				t.Fatal(err)
			}
		}
		id, err := c.StartInstance(config)
		if err != nil {
			t.Fatalf("StartInstance: %v", err)
		}
		return id
	}
	send := func(t *testing.T, id int32, req kongproc.Request) specResult {
		t.Helper()
		res, err := c.Access(id, req)
		if err != nil {
			t.Fatalf("access: %v", err)
		}
		if res.Exited {
			return specResult{res.Status, res.Headers, res.Body}
		}
		return specResult{200, res.Headers, ""}
	}
	// validateHeaders is the spec's validate_headers for 7 requests at
	// minute 6: limits 6, remaining 5..0 then 0, statuses 200 ×6 then 429,
	// resets within the window.
	validateHeaders := func(t *testing.T, results []specResult, window int, checkHour bool) {
		t.Helper()
		var status, limit, remaining, minuteLimit, minuteRemaining []int
		for _, r := range results {
			status = append(status, r.status)
			limit, remaining = append(limit, r.int("RateLimit-Limit")), append(remaining, r.int("RateLimit-Remaining"))
			minuteLimit, minuteRemaining = append(minuteLimit, r.int("X-RateLimit-Limit-Minute")), append(minuteRemaining, r.int("X-RateLimit-Remaining-Minute"))
			if reset := r.int("RateLimit-Reset"); reset < 0 || reset > window {
				t.Errorf("RateLimit-Reset %d, want 0..%d", reset, window)
			}
			if checkHour && (r.int("X-RateLimit-Limit-Hour") <= 0 || r.int("X-RateLimit-Remaining-Hour") < 0) {
				t.Errorf("hour headers %q %q", r.headers.Get("X-RateLimit-Limit-Hour"), r.headers.Get("X-RateLimit-Remaining-Hour"))
			}
		}
		six, counts := []int{6, 6, 6, 6, 6, 6, 6}, []int{5, 4, 3, 2, 1, 0, 0}
		for _, got := range []struct {
			name      string
			got, want []int
		}{{"status", status, []int{200, 200, 200, 200, 200, 200, 429}}, {"RateLimit-Limit", limit, six}, {"RateLimit-Remaining", remaining, counts},
			{"X-RateLimit-Limit-Minute", minuteLimit, six}, {"X-RateLimit-Remaining-Minute", minuteRemaining, counts}} {
			if !slices.Equal(got.got, got.want) {
				t.Errorf("%s: %v, want %v", got.name, got.got, got.want)
			}
		}
		var denial struct{ Message string }
		if err := json.Unmarshal([]byte(results[6].body), &denial); err != nil || denial.Message != "API rate limit exceeded" {
			t.Errorf("denial body %q", results[6].body)
		}
	}
	seven := func(t *testing.T, id int32, req kongproc.Request) []specResult {
		// Seven requests in one minute window, as the spec's retry() makes
		// sure: not in a minute's last second.
		waitfor.True(t, 2*time.Second, "a minute's last second passes", func() bool { return time.Now().Second() < 59 })
		var out []specResult
		for i := 0; i < 7; i++ {
			out = append(out, send(t, id, req))
		}
		return out
	}
	ip := "198.51.100.60"
	for _, policy := range []string{"local", "redis"} {
		t.Run(policy, func(t *testing.T) {
			for _, limitBy := range []string{"ip", "consumer", "credential", "service", "header", "path"} {
				t.Run("blocks if exceeding limit (single "+limitBy+")", func(t *testing.T) {
					id := startSpec(t, policy, map[string]any{"minute": 6, "limit_by": limitBy, "path": "/test", "header_name": "test-header"}, "route-1", "service-1", true)
					req := kongproc.Request{ForwardedIP: ip, Path: "/test", ServiceID: "service-1", Headers: http.Header{"Test-Header": {"test"}}}
					if limitBy == "consumer" || limitBy == "credential" {
						req.ConsumerID, req.CredentialID = "consumer-bob", "credential-bob"
					}
					validateHeaders(t, seven(t, id, req), 60, false)
				})
			}
			t.Run("blocks if exceeding limit (multiple ip)", func(t *testing.T) {
				id := startSpec(t, policy, map[string]any{"minute": 6, "limit_by": "ip"}, "route-1", "service-1", true)
				validateHeaders(t, seven(t, id, kongproc.Request{ForwardedIP: "198.51.100.61"}), 60, false)
				validateHeaders(t, seven(t, id, kongproc.Request{ForwardedIP: "198.51.100.62"}), 60, false)
			})
			for _, multiple := range []struct {
				limitBy string
				a, b    kongproc.Request
			}{
				{"service", kongproc.Request{ForwardedIP: ip, ServiceID: "service-a"}, kongproc.Request{ForwardedIP: ip, ServiceID: "service-b"}},
				{"path", kongproc.Request{ForwardedIP: ip, Path: "/test"}, kongproc.Request{ForwardedIP: ip, Path: "/test"}},
				{"header", kongproc.Request{ForwardedIP: ip, Headers: http.Header{"Test-Header": {"a"}}}, kongproc.Request{ForwardedIP: ip, Headers: http.Header{"Test-Header": {"b"}}}},
				{"consumer", kongproc.Request{ForwardedIP: ip, ConsumerID: "consumer-1"}, kongproc.Request{ForwardedIP: ip, ConsumerID: "consumer-2"}},
			} {
				// The spec attaches one plugin per service or route for
				// service and path (two instances), and one plugin for
				// header and consumer, keyed by each value.
				t.Run("blocks if exceeding limit (multiple "+multiple.limitBy+")", func(t *testing.T) {
					fields := func() map[string]any {
						return map[string]any{"minute": 6, "limit_by": multiple.limitBy, "path": "/test", "header_name": "test-header"}
					}
					id := startSpec(t, policy, fields(), "route-1", "service-1", true)
					other := id
					if multiple.limitBy == "path" {
						other = startSpec(t, policy, fields(), "route-2", "service-2", false)
					}
					validateHeaders(t, seven(t, id, multiple.a), 60, false)
					validateHeaders(t, seven(t, other, multiple.b), 60, false)
				})
			}
			t.Run("blocks if exceeding limit #grpc (single ip)", func(t *testing.T) {
				id := startSpec(t, policy, map[string]any{"minute": 6, "limit_by": "ip"}, "route-1", "service-1", true)
				req := kongproc.Request{ForwardedIP: ip, Headers: http.Header{"Content-Type": {"application/grpc"}}, HTTPVersion: 2}
				results := seven(t, id, req)
				for i, r := range results[:6] {
					if r.status != 200 || r.int("X-RateLimit-Limit-Minute") != 6 || r.int("X-RateLimit-Remaining-Minute") != 5-i ||
						r.int("RateLimit-Limit") != 6 || r.int("RateLimit-Remaining") != 5-i {
						t.Errorf("gRPC request %d: %d %v", i+1, r.status, r.headers)
					}
				}
				// Kong renders the denial in gRPC's terms (grpc-status 8)
				// from the delayed response: internal/kongreal checks that
				// in real Kong beside Kong's plugin.
				denied := results[6]
				if denied.status != 429 || denied.int("RateLimit-Limit") != 6 || denied.int("RateLimit-Remaining") != 0 ||
					denied.int("Retry-After") <= 0 || denied.int("Retry-After") > 60 || denied.int("RateLimit-Reset") <= 0 || denied.int("RateLimit-Reset") > 60 {
					t.Errorf("gRPC denial: %d %v, want 429 with the headers", denied.status, denied.headers)
				}
			})
			t.Run("hide_client_headers (single ip)", func(t *testing.T) {
				id := startSpec(t, policy, map[string]any{"minute": 6, "limit_by": "ip", "hide_client_headers": true}, "route-1", "service-1", true)
				results := seven(t, id, kongproc.Request{ForwardedIP: ip})
				for i, r := range results {
					for _, name := range []string{"X-Ratelimit-Limit-Minute", "X-Ratelimit-Remaining-Minute", "Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset", "Retry-After"} {
						if r.headers.Get(name) != "" {
							t.Errorf("request %d: %s = %q", i+1, name, r.headers.Get(name))
						}
					}
				}
				if results[6].status != 429 {
					t.Errorf("7th: %d, want 429", results[6].status)
				}
			})
			t.Run("handles multiple limits (single ip)", func(t *testing.T) {
				id := startSpec(t, policy, map[string]any{"minute": 6, "hour": 99999, "limit_by": "ip"}, "route-1", "service-1", true)
				validateHeaders(t, seven(t, id, kongproc.Request{ForwardedIP: ip}), 60, true)
			})
			t.Run("expire counter", func(t *testing.T) {
				id := startSpec(t, policy, map[string]any{"second": 1, "limit_by": "ip"}, "route-1", "service-1", true)
				// The spec retries the pair until both land in one second.
				waitfor.True(t, 10*time.Second, "a 200 and a 429 in one second", func() bool {
					first, second := send(t, id, kongproc.Request{ForwardedIP: "198.51.100.70"}), send(t, id, kongproc.Request{ForwardedIP: "198.51.100.70"})
					return first.status == 200 && first.int("RateLimit-Limit") == 1 && first.int("RateLimit-Remaining") == 0 && first.int("RateLimit-Reset") >= 0 &&
						first.int("X-RateLimit-Limit-Second") == 1 && first.int("X-RateLimit-Remaining-Second") == 0 &&
						second.status == 429 && strings.Contains(second.body, "API rate limit exceeded")
				})
				waitfor.True(t, 10*time.Second, "the counter expires", func() bool {
					return send(t, id, kongproc.Request{ForwardedIP: "198.51.100.70"}).status == 200
				})
			})
			t.Run("blocks with a custom error code and message", func(t *testing.T) {
				id := startSpec(t, policy, map[string]any{"minute": 1, "limit_by": "ip", "error_code": 404, "error_message": "Fake Not Found"}, "route-1", "service-1", true)
				if r := send(t, id, kongproc.Request{ForwardedIP: "198.51.100.71"}); r.status != 200 {
					t.Errorf("first: %d", r.status)
				}
				r := send(t, id, kongproc.Request{ForwardedIP: "198.51.100.71"})
				var denial struct{ Message string }
				if err := json.Unmarshal([]byte(r.body), &denial); err != nil || r.status != 404 || !strings.Contains(denial.Message, "Fake Not Found") {
					t.Errorf("second: %d %q, want 404 Fake Not Found", r.status, r.body)
				}
			})
			t.Run("global for single consumer", func(t *testing.T) {
				// A global plugin (no route or service): one counter for the
				// consumer across every service.
				id := startSpec(t, policy, map[string]any{"minute": 6, "limit_by": "consumer"}, nil, nil, true)
				var results []specResult
				for i := 0; i < 7; i++ {
					results = append(results, send(t, id, kongproc.Request{ForwardedIP: ip, ConsumerID: "consumer-global", ServiceID: fmt.Sprintf("service-%d", i%3)}))
				}
				validateHeaders(t, results, 60, false)
			})
		})
	}
}

// TestKongSpecFaultTolerance replays 04-access_spec.lua's "does not work
// if an error occurs" and "keeps working if an error occurs" with Redis
// gone: fault_tolerant false answers 500, true proxies with no rate-limit
// headers.
func TestKongSpecFaultTolerance(t *testing.T) {
	rs := redistest.StartT(t)
	api := adminAPI(t)
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	start := func(tolerant bool) int32 {
		config, err := stored(t, api, map[string]any{"minute": 6, "limit_by": "ip", "policy": "redis", "redis": withTimeout(rs.KongRecord(), 200),
			"fault_tolerant": tolerant, "namespace": fmt.Sprintf("spec-tolerant-%v", tolerant)}, "route-1", "service-1")
		if err != nil {
			t.Fatal(err)
		}
		id, err := c.StartInstance(config)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	strict, tolerant := start(false), start(true)
	req := kongproc.Request{ForwardedIP: "198.51.100.80"}
	for _, id := range []int32{strict, tolerant} {
		if res := access(t, c, id, req); res.Exited || res.Headers.Get("X-RateLimit-Remaining-Minute") != "5" {
			t.Fatalf("Redis up: %v %v", res.Exited, res.Headers)
		}
	}
	rs.Stop()
	res := access(t, c, strict, req)
	if !res.Exited || res.Status != 500 {
		t.Errorf("does not work if an error occurs: exited %v status %d, want 500", res.Exited, res.Status)
	}
	c = srv.Dial()
	if res := access(t, c, tolerant, req); res.Exited || len(res.Headers) != 0 {
		t.Errorf("keeps working if an error occurs: exited %v headers %v, want proxied with none", res.Exited, res.Headers)
	}
}

// TestKongSpecShorthandFields replays 06-shorthand_fields_spec.lua's
// config with the flat redis_* names: Kong's Admin API (through the dump)
// stores and echoes the flat names as written, and the plugin dials them.
// Where Kong differs, on purpose or by necessity: Kong's own plugin also
// writes them into the redis record (a shorthand needs a Lua function, so
// the dump cannot ask Kong to), so the stored record keeps its defaults.
func TestKongSpecShorthandFields(t *testing.T) {
	rs := redistest.StartT(t)
	api := adminAPI(t)
	host, port := rs.KongRecord()["host"], rs.KongRecord()["port"]
	legacy := map[string]any{"minute": 100, "policy": "redis", "redis_host": host, "redis_port": port, "redis_database": 1, "redis_timeout": 1100,
		"limit_by": "ip", "namespace": "spec-shorthand"}
	config, err := stored(t, api, legacy, "route-1", "service-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"redis_host", "redis_port", "redis_database", "redis_timeout"} {
		if fmt.Sprint(config[field]) != fmt.Sprint(legacy[field]) {
			t.Errorf("%s stored as %v, want the value written, %v", field, config[field], legacy[field])
		}
	}
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	id, err := c.StartInstance(config)
	if err != nil {
		t.Fatal(err)
	}
	if res := access(t, c, id, kongproc.Request{ForwardedIP: "198.51.100.90"}); res.Exited || res.Headers.Get("X-RateLimit-Remaining-Minute") != "99" {
		t.Fatalf("legacy fields: exited %v headers %v", res.Exited, res.Headers)
	}
	if keys, err := rs.Do("DBSIZE"); err != nil || keys != ":0" {
		t.Errorf("database 0 holds %q keys (%v), want none: the counter is in redis_database 1", keys, err)
	}
}
