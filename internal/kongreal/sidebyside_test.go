//go:build kongreal

package kongreal

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// The tests of this file run Kong's bundled rate-limiting and tollgate on
// the same traffic in one real Kong 3.9: each scenario of Kong's own
// spec/03-plugins/23-rate-limiting/04-access_spec.lua gets two sibling
// services with the same config, one under Kong's plugin and one under
// tollgate's, and the same requests go to both, interleaved. Statuses,
// bodies and every rate-limit header must be equal; where tollgate
// differs on purpose, the difference is in docs/kong.md's table and the
// scenario asserts exactly it.

// realIP makes Kong take the client address from X-Forwarded-For sent by
// the test (loopback is the trusted proxy), so scenarios can be many
// clients.
var realIP = []string{"trusted_ips = 127.0.0.1/32", "real_ip_header = X-Forwarded-For"}

// side is one of a scenario's two sibling services.
type side struct {
	plugin string // the plugin's name in Kong
	path   string // the route's path prefix
}

// sides names a scenario's two services: Kong's plugin and tollgate's.
func sides(name, kongPlugin, tollgatePlugin string) [2]side {
	return [2]side{{kongPlugin, "/" + name + "/kong"}, {tollgatePlugin, "/" + name + "/tollgate"}}
}

// pairOpts shape a scenario's two services.
type pairOpts struct {
	serviceWide bool                      // the plugin on the service, not the route
	extra       []any                     // more plugins on each route (key-auth)
	configOf    func(side) map[string]any // per-side config (limit_by path names each side's own path)
}

// addPair adds a scenario's two services to d, each proxying to up, each
// with plugin config on its route (or its service).
func addPair(d Declarative, up *Upstream, name string, s [2]side, config map[string]any, o pairOpts) {
	for i, sd := range s {
		cfg := maps.Clone(config)
		if o.configOf != nil {
			maps.Copy(cfg, o.configOf(sd))
		}
		plugin := map[string]any{"name": sd.plugin, "config": cfg}
		route := map[string]any{"name": fmt.Sprintf("%s-%d", name, i), "paths": []string{sd.path}, "plugins": append([]any{}, o.extra...)}
		svc := map[string]any{"name": fmt.Sprintf("%s-svc-%d", name, i), "url": up.URL, "routes": []any{route}}
		if o.serviceWide {
			svc["plugins"] = []any{plugin}
		} else {
			route["plugins"] = append(route["plugins"].([]any), plugin)
		}
		d.AddService(svc)
	}
}

// interleave sends each request to both sides in turn (Kong's first) and
// returns both answers, request by request.
func interleave(k *Kong, s [2]side, n int, suffix string, headers ...string) (kong, tollgate []Answer) {
	return interleaveWith(k.Get, s, n, suffix, headers...)
}

func interleaveWith(get func(string, ...string) Answer, s [2]side, n int, suffix string, headers ...string) (kong, tollgate []Answer) {
	for i := 0; i < n; i++ {
		kong = append(kong, get(s[0].path+suffix, headers...))
		tollgate = append(tollgate, get(s[1].path+suffix, headers...))
	}
	return kong, tollgate
}

// same fails t for each request whose answers differ, other than by
// what allowed says (nil: nothing may differ) of request i's diffs.
func same(t *testing.T, kong, tollgate []Answer, allowed func(i int, diffs []string) []string) {
	t.Helper()
	for i := range kong {
		diffs := Diff(kong[i], tollgate[i])
		if allowed != nil {
			diffs = allowed(i, diffs)
		}
		if len(diffs) > 0 {
			t.Errorf("request %d: Kong's rate-limiting and tollgate differ:\n  kong:     %s\n  tollgate: %s\n  %s", i+1, kong[i], tollgate[i], strings.Join(diffs, "\n  "))
		}
	}
}

// only allows exactly the documented differences given, each as Diff
// words it, and no other.
func only(documented ...string) func(int, []string) []string {
	return func(_ int, diffs []string) []string {
		var rest []string
		for _, d := range diffs {
			if !slices.Contains(documented, d) {
				rest = append(rest, d)
			}
		}
		return rest
	}
}

// statuses are the answers' statuses.
func statuses(as []Answer) []int {
	var out []int
	for _, a := range as {
		out = append(out, a.Status)
	}
	return out
}

// notNearMinuteEnd waits until the wall clock is at least margin away
// from the next minute: Kong's periods are aligned to the minute, and a
// scenario's requests must land in one window on both sides.
func notNearMinuteEnd(t *testing.T, margin time.Duration) { notNearEnd(t, time.Minute, margin) }

// notNearEnd waits until the wall clock is at least margin away from the
// end of the current period (a minute or an hour, aligned as Kong's).
func notNearEnd(t *testing.T, period, margin time.Duration) {
	t.Helper()
	waitfor.TrueEvery(t, margin+10*time.Second, 50*time.Millisecond, "a period with room for the scenario", func() bool {
		now := time.Now()
		return now.Truncate(period).Add(period).Sub(now) > margin
	})
}

// consumers adds two consumers with key-auth credentials (apikey: <name>-key).
func consumers(d Declarative, names ...string) {
	var cs []any
	for _, n := range names {
		cs = append(cs, map[string]any{"username": n, "keyauth_credentials": []any{map[string]any{"key": n + "-key"}}})
	}
	d["consumers"] = cs
}

var keyAuth = map[string]any{"name": "key-auth", "config": map[string]any{"key_names": []string{"apikey"}}}

// TestKongRateLimitingSideBySide is 04-access_spec.lua's scenarios in real
// Kong, Kong's rate-limiting beside tollgate, on policy local and redis.
func TestKongRateLimitingSideBySide(t *testing.T) {
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	k := Start(t, Options{Extra: realIP})
	for _, policy := range []string{"local", "redis"} {
		t.Run(policy, func(t *testing.T) {
			base := map[string]any{"policy": policy}
			if policy == "redis" {
				base["redis"] = rds.KongRecord()
			}
			with := func(fields map[string]any) map[string]any {
				c := maps.Clone(base)
				maps.Copy(c, fields)
				return c
			}
			n := 0
			scenario := func(t *testing.T, fields map[string]any, o pairOpts, run func(t *testing.T, s [2]side)) {
				n++
				name := fmt.Sprintf("%s-%d", policy, n)
				s := sides(name, "rate-limiting", "tollgate")
				d := NewDeclarative("/probe-" + name)
				consumers(d, "bob", "alice")
				addPair(d, up, name, s, with(fields), o)
				k.MustLoad(d)
				notNearMinuteEnd(t, 15*time.Second)
				run(t, s)
			}
			seven := func(t *testing.T, s [2]side, headers ...string) {
				kong, tg := interleave(k, s, 7, "", headers...)
				if got := statuses(kong); fmt.Sprint(got) != "[200 200 200 200 200 200 429]" {
					t.Errorf("Kong's own plugin: statuses %v, want six 200s and a 429 (as its spec)", got)
				}
				same(t, kong, tg, nil)
			}
			for _, limitBy := range []string{"ip", "consumer", "credential", "service", "header", "path"} {
				t.Run("blocks if exceeding limit (single "+limitBy+")", func(t *testing.T) {
					o := pairOpts{extra: []any{keyAuth}, configOf: func(sd side) map[string]any { return map[string]any{"path": sd.path} }}
					scenario(t, map[string]any{"minute": 6, "limit_by": limitBy, "header_name": "test-header"}, o, func(t *testing.T, s [2]side) {
						seven(t, s, "apikey: bob-key", "test-header: test", "X-Forwarded-For: 198.51.100.10")
					})
				})
			}
			t.Run("blocks if exceeding limit (multiple ip)", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 6, "limit_by": "ip"}, pairOpts{}, func(t *testing.T, s [2]side) {
					seven(t, s, "X-Forwarded-For: 198.51.100.11")
					seven(t, s, "X-Forwarded-For: 198.51.100.12")
				})
			})
			t.Run("blocks if exceeding limit (multiple header)", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 6, "limit_by": "header", "header_name": "test-header"}, pairOpts{}, func(t *testing.T, s [2]side) {
					seven(t, s, "test-header: a")
					seven(t, s, "test-header: b")
				})
			})
			t.Run("blocks if exceeding limit (multiple consumer)", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 6, "limit_by": "consumer"}, pairOpts{extra: []any{keyAuth}}, func(t *testing.T, s [2]side) {
					seven(t, s, "apikey: bob-key")
					seven(t, s, "apikey: alice-key")
				})
			})
			t.Run("limit_by header without the header falls back to the ip", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 6, "limit_by": "header", "header_name": "test-header"}, pairOpts{}, func(t *testing.T, s [2]side) {
					seven(t, s, "X-Forwarded-For: 198.51.100.13")
				})
			})
			t.Run("service-wide instance (single service)", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 6, "limit_by": "service"}, pairOpts{serviceWide: true}, func(t *testing.T, s [2]side) {
					seven(t, s)
				})
			})
			t.Run("blocks if exceeding limit #grpc (single ip)", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 6, "limit_by": "ip"}, pairOpts{}, func(t *testing.T, s [2]side) {
					kong, tg := interleaveWith(k.GetH2, s, 7, "", "Content-Type: application/grpc", "X-Forwarded-For: 198.51.100.14")
					if kong[6].Status != 429 || kong[6].Headers.Get("Grpc-Status") != "8" {
						t.Errorf("Kong's own gRPC denial: %s, want 429 with grpc-status 8", kong[6])
					}
					same(t, kong, tg, nil) // Kong renders both denials

				})
			})
			t.Run("a gRPC content type over HTTP/1.1 is not gRPC", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 6, "limit_by": "ip"}, pairOpts{}, func(t *testing.T, s [2]side) {
					seven(t, s, "Content-Type: application/grpc", "X-Forwarded-For: 198.51.100.19")
				})
			})
			t.Run("hide_client_headers (single ip)", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 6, "limit_by": "ip", "hide_client_headers": true}, pairOpts{}, func(t *testing.T, s [2]side) {
					seven(t, s, "X-Forwarded-For: 198.51.100.15")
				})
			})
			t.Run("handles multiple limits (single ip)", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 6, "hour": 99999, "limit_by": "ip"}, pairOpts{}, func(t *testing.T, s [2]side) {
					seven(t, s, "X-Forwarded-For: 198.51.100.16")
				})
			})
			t.Run("blocks with a custom error code and message", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 1, "limit_by": "ip", "error_code": 404, "error_message": "Fake Not Found"}, pairOpts{}, func(t *testing.T, s [2]side) {
					kong, tg := interleave(k, s, 2, "", "X-Forwarded-For: 198.51.100.17")
					same(t, kong, tg, nil)
				})
			})
			t.Run("denials formatted by Accept", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 1, "limit_by": "ip"}, pairOpts{}, func(t *testing.T, s [2]side) {
					for _, accept := range []string{"", "application/json", "text/html", "application/xml", "text/plain", "*/*", "text/html;q=0.5, application/xml"} {
						kong, tg := interleave(k, s, 2, "", "X-Forwarded-For: 198.51.100.18", "Accept: "+accept)
						same(t, kong[1:], tg[1:], nil)
					}
				})
			})
			t.Run("a custom code and a message with markup, by Accept", func(t *testing.T) {
				scenario(t, map[string]any{"minute": 1, "limit_by": "ip", "error_code": 503, "error_message": `Too "many" <requests> & 100%`}, pairOpts{}, func(t *testing.T, s [2]side) {
					for _, accept := range []string{"", "text/html", "application/xml", "text/plain"} {
						kong, tg := interleave(k, s, 2, "", "X-Forwarded-For: 198.51.100.21", "Accept: "+accept)
						same(t, kong[1:], tg[1:], nil)
					}
					kong, tg := interleaveWith(k.GetH2, s, 1, "", "Content-Type: application/grpc", "X-Forwarded-For: 198.51.100.21")
					same(t, kong, tg, nil)
				})
			})
			t.Run("beside other plugins", func(t *testing.T) {
				// key-auth runs before (priority 1250); post-function after
				// (-1000) in the access phase, skipped once a plugin has
				// denied; response-transformer in the header filter, which
				// Kong runs on a denial too.
				after := []any{keyAuth,
					map[string]any{"name": "post-function", "config": map[string]any{"access": []string{`kong.response.set_header("X-Probe-Post-Access", "ran")`}}},
					map[string]any{"name": "response-transformer", "config": map[string]any{"add": map[string]any{"headers": []string{"X-Probe-Transformed:yes"}}}},
				}
				scenario(t, map[string]any{"minute": 2, "limit_by": "consumer"}, pairOpts{extra: after}, func(t *testing.T, s [2]side) {
					kong, tg := interleave(k, s, 3, "", "apikey: bob-key")
					if got := fmt.Sprint(statuses(kong)); got != "[200 200 429]" {
						t.Fatalf("Kong's own plugin beside others: %s, want two 200s and a 429", got)
					}
					for i, a := range kong {
						if ran := a.Headers.Get("X-Probe-Post-Access") != ""; ran != (a.Status == 200) || a.Headers.Get("X-Probe-Transformed") != "yes" {
							t.Errorf("Kong's request %d: %s; want post-function's header only when allowed and response-transformer's always", i+1, a)
						}
					}
					same(t, kong, tg, nil)
					kong, tg = interleave(k, s, 1, "") // key-auth refuses first on both
					same(t, kong, tg, nil)
				})
			})
		})
	}
}

// TestKongRedisDownSideBySide is 04-access_spec.lua's "fault tolerance"
// in real Kong: Redis stopped, Kong's rate-limiting and tollgate on
// policy redis, fault_tolerant true and false, a client never denied and
// a client denied before Redis stopped, with every Accept.
func TestKongRedisDownSideBySide(t *testing.T) {
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	k := Start(t, Options{Extra: realIP})
	d := NewDeclarative("/probe-down")
	for _, ft := range []bool{true, false} {
		name := fmt.Sprintf("down-%v", ft)
		addPair(d, up, name, sides(name, "rate-limiting", "tollgate"),
			map[string]any{"hour": 3, "limit_by": "ip", "policy": "redis", "redis": map[string]any{"host": rds.KongRecord()["host"], "port": rds.KongRecord()["port"], "timeout": 200}, "fault_tolerant": ft}, pairOpts{})
	}
	k.MustLoad(d)
	notNearEnd(t, time.Hour, 30*time.Second)
	const denied, fresh = "X-Forwarded-For: 198.51.100.90", "X-Forwarded-For: 198.51.100.91"
	for _, ft := range []bool{true, false} {
		kong, tg := interleave(k, sides(fmt.Sprintf("down-%v", ft), "rate-limiting", "tollgate"), 4, "", denied)
		same(t, kong, tg, nil)
	}
	rds.Stop()
	for _, accept := range []string{"", "application/json", "text/html", "text/plain", "application/xml"} {
		t.Run("fault_tolerant true, Accept "+accept, func(t *testing.T) {
			s := sides("down-true", "rate-limiting", "tollgate")
			kong, tg := interleave(k, s, 2, "", fresh, "Accept: "+accept)
			if kong[0].Status != 200 || len(kong[0].Headers["X-Ratelimit-Limit-Hour"]) != 0 {
				t.Errorf("Kong's own plugin with Redis down: %s, want 200 with no rate-limit headers", kong[0])
			}
			same(t, kong, tg, nil)
			// docs/kong.md: a client denied before Redis stopped stays
			// denied until its window ends (the deny cache answers it);
			// Kong's plugin lets it through.
			kong, tg = interleave(k, s, 1, "", denied, "Accept: "+accept)
			if kong[0].Status != 200 || tg[0].Status != 429 {
				t.Errorf("a client denied before Redis stopped: Kong %s, tollgate %s; want Kong's 200 and tollgate's 429", kong[0], tg[0])
			}
		})
		t.Run("fault_tolerant false, Accept "+accept, func(t *testing.T) {
			s := sides("down-false", "rate-limiting", "tollgate")
			kong, tg := interleave(k, s, 2, "", fresh, "Accept: "+accept)
			if kong[0].Status != 500 {
				t.Errorf("Kong's own plugin with Redis down, fault_tolerant false: %s, want 500", kong[0])
			}
			same(t, kong, tg, nil)
			kong, tg = interleave(k, s, 1, "", denied, "Accept: "+accept)
			if kong[0].Status != 500 || tg[0].Status != 429 {
				t.Errorf("a client denied before Redis stopped: Kong %s, tollgate %s; want Kong's 500 and tollgate's 429", kong[0], tg[0])
			}
		})
	}
}

// TestKongGlobalAndSyncRateSideBySide: 04-access_spec.lua's "global for
// single consumer" (a plugin on no service or route: one count for the
// consumer across every service), Kong's plugin in one config and
// tollgate in the next, the same requests; and sync_rate (counted on the
// node, synced to Redis every second) on sibling services.
func TestKongGlobalAndSyncRateSideBySide(t *testing.T) {
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	// One worker: Kong's local policy counts each request in a timer after
	// it (kong/plugins/rate-limiting/handler.lua, timer_at(0, increment)),
	// and the Admin API's /timers tells when it ran only of the worker it
	// asks. Each of Kong's requests waits for it, as Kong's spec waits with
	// helpers.wait_timer: on a loaded machine the next request could
	// otherwise pass before the count lands.
	k := Start(t, Options{Extra: realIP, Workers: 1})
	idle := k.Timers().Running
	global := func(plugin string) []Answer {
		d := NewDeclarative("/probe-global-" + plugin)
		consumers(d, "bob")
		for i := 0; i < 3; i++ {
			d.AddService(map[string]any{"name": fmt.Sprintf("global-%d", i), "url": up.URL, "routes": []any{
				map[string]any{"name": fmt.Sprintf("global-%d", i), "paths": []string{fmt.Sprintf("/global-%d", i)}, "plugins": []any{keyAuth}}}})
		}
		d["plugins"] = []any{map[string]any{"name": plugin, "config": map[string]any{"minute": 6, "limit_by": "consumer"}}}
		k.MustLoad(d)
		notNearMinuteEnd(t, 15*time.Second)
		var out []Answer
		for i := 0; i < 7; i++ {
			before := k.Timers()
			out = append(out, k.Get(fmt.Sprintf("/global-%d", i%3), "apikey: bob-key"))
			if plugin == "rate-limiting" && out[i].Status == 200 {
				k.TimersRan(before, idle) // Kong's count of it has landed
			}
		}
		return out
	}
	kong := global("rate-limiting")
	if fmt.Sprint(statuses(kong)) != "[200 200 200 200 200 200 429]" {
		t.Errorf("Kong's own global plugin: %v, want six 200s across the services and a 429", statuses(kong))
	}
	same(t, kong, global("tollgate"), func(_ int, diffs []string) []string {
		var rest []string
		for _, d := range diffs { // the two runs are seconds apart
			if !strings.HasPrefix(d, "Ratelimit-Reset") && !strings.HasPrefix(d, "Retry-After") {
				rest = append(rest, d)
			}
		}
		return rest
	})

	t.Run("sync_rate", func(t *testing.T) {
		d := NewDeclarative("/probe-sync-rate")
		addPair(d, up, "sync", sides("sync", "rate-limiting", "tollgate"),
			map[string]any{"minute": 6, "limit_by": "ip", "policy": "redis", "redis": rds.KongRecord(), "sync_rate": 1}, pairOpts{})
		k.MustLoad(d)
		notNearMinuteEnd(t, 15*time.Second)
		kong, tg := interleave(k, sides("sync", "rate-limiting", "tollgate"), 7, "", "X-Forwarded-For: 198.51.100.120")
		// docs/kong.md: Kong's node admits a seventh of six: a key's first
		// request is counted in Redis by usage()'s INCR and not in the
		// node's own count, so its second request reads 5 left again.
		// tollgate counts each request once.
		remaining := func(as []Answer) string {
			var out []string
			for _, a := range as {
				out = append(out, fmt.Sprintf("%d/%s", a.Status, a.Headers.Get("X-Ratelimit-Remaining-Minute")))
			}
			return strings.Join(out, " ")
		}
		if got := remaining(kong); got != "200/5 200/5 200/4 200/3 200/2 200/1 200/0" {
			t.Errorf("Kong's own plugin with sync_rate: %s, want the seventh admitted (docs/kong.md)", got)
		}
		if got := remaining(tg); got != "200/5 200/4 200/3 200/2 200/1 200/0 429/0" {
			t.Errorf("tollgate with sync_rate: %s, want six admitted", got)
		}
	})
}
