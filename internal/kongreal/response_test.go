//go:build kongreal

package kongreal

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// usage is a path suffix that makes the upstream answer with the given
// X-Kong-Limit lines (and any other "Name:value" lines given as headers).
func usage(lines ...string) string {
	q := url.Values{}
	for _, l := range lines {
		if strings.Contains(l, ":") {
			q.Add("header", l)
		} else {
			q.Add("header", "X-Kong-Limit:"+l)
		}
	}
	return "?" + q.Encode()
}

// kongCharge is what Kong's response-ratelimiting counts in a period for
// a response the upstream answered as suffix (see usage) asks: each entry
// of the first X-Kong-Limit line whose resource has limits.
func kongCharge(limits map[string]any, suffix string) int64 {
	q, _ := url.ParseQuery(strings.TrimPrefix(suffix, "?"))
	for _, h := range q["header"] {
		line, ok := strings.CutPrefix(h, "X-Kong-Limit:")
		if !ok {
			continue
		}
		var total int64
		for _, entry := range strings.Split(line, ",") {
			name, value, _ := strings.Cut(entry, "=")
			if _, ok := limits[strings.TrimSpace(name)]; ok {
				v, _ := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
				total += v
			}
		}
		return total // the first line only
	}
	return 0
}

// TestKongResponseRateLimitingSideBySide is 24-response-rate-limiting's
// 04-access_spec.lua in real Kong: Kong's response-ratelimiting beside
// tollgate-response-ratelimiting, on policy local and redis, the
// upstream reporting each call's cost in X-Kong-Limit.
func TestKongResponseRateLimitingSideBySide(t *testing.T) {
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	// One worker: Kong counts each response in a timer (log.lua), and the
	// Admin API's /timers tells when it ran only of the worker it asks.
	k := Start(t, Options{Extra: realIP, Workers: 1})
	idle := k.Timers().Running
	for _, policy := range []string{"local", "redis"} {
		t.Run(policy, func(t *testing.T) {
			base := map[string]any{"policy": policy}
			if policy == "redis" {
				base["redis"] = rds.KongRecord()
			}
			n := 0
			var counters *kongCounters // Kong's counters in Redis, on policy redis
			var limits map[string]any  // the scenario's limits
			scenario := func(t *testing.T, fields map[string]any, o pairOpts) [2]side {
				limits, _ = fields["limits"].(map[string]any)
				if policy == "redis" {
					counters = newKongCounters(t, rds)
				}
				n++
				name := fmt.Sprintf("rrl-%s-%d", policy, n)
				s := sides(name, "response-ratelimiting", "tollgate-response-ratelimiting")
				d := NewDeclarative("/probe-" + name)
				consumers(d, "bob", "alice")
				c := maps.Clone(base)
				maps.Copy(c, fields)
				addPair(d, up, name, s, c, o)
				k.MustLoad(d)
				notNearMinuteEnd(t, 15*time.Second)
				return s
			}
			// runEach sends request i to Kong's side with kongSuffixes[i]
			// and then to tollgate's with tgSuffixes[i].
			runEach := func(t *testing.T, s [2]side, kongSuffixes, tgSuffixes []string, headers ...string) (kong, tg []Answer) {
				for i := range kongSuffixes {
					before := k.Timers()
					kong = append(kong, k.GetOnce(s[0].path+kongSuffixes[i], headers...))
					if kong[i].Status == 200 && kongCharge(limits, kongSuffixes[i]) > 0 {
						k.TimersRan(before, idle) // Kong's count of it has landed
						if counters != nil {
							counters.counted(kongCharge(limits, kongSuffixes[i]))
						}
					}
					tg = append(tg, k.Get(s[1].path+tgSuffixes[i], headers...))
				}
				return kong, tg
			}
			// run sends each request (a path suffix) to both sides in turn.
			run := func(t *testing.T, s [2]side, suffixes []string, headers ...string) (kong, tg []Answer) {
				return runEach(t, s, suffixes, suffixes, headers...)
			}
			repeat := func(n int, suffix string) []string {
				var out []string
				for i := 0; i < n; i++ {
					out = append(out, suffix)
				}
				return out
			}
			video6 := map[string]any{"limits": map[string]any{"video": map[string]any{"minute": 6}}}

			t.Run("returns remaining counter", func(t *testing.T) {
				s := scenario(t, video6, pairOpts{})
				kong, tg := run(t, s, repeat(4, usage("video=1")), "X-Forwarded-For: 198.51.100.30")
				same(t, kong, tg, nil)
			})
			t.Run("blocks if exceeding limit", func(t *testing.T) {
				s := scenario(t, video6, pairOpts{})
				kong, tg := run(t, s, repeat(8, usage("video=1")), "X-Forwarded-For: 198.51.100.31")
				if got := fmt.Sprint(statuses(kong)); got != "[200 200 200 200 200 200 429 429]" {
					t.Errorf("Kong's own plugin: statuses %s, want six 200s then 429s", got)
				}
				same(t, kong, tg, nil)
			})
			t.Run("charges what the upstream reports (video=2)", func(t *testing.T) {
				s := scenario(t, video6, pairOpts{})
				kong, tg := run(t, s, repeat(5, usage("video=2")), "X-Forwarded-For: 198.51.100.32")
				if got := fmt.Sprint(statuses(kong)); got != "[200 200 200 429 429]" {
					t.Errorf("Kong's own plugin: statuses %s, want three 200s then 429s", got)
				}
				same(t, kong, tg, nil)
			})
			t.Run("handles multiple limits", func(t *testing.T) {
				s := scenario(t, map[string]any{"limits": map[string]any{
					"video": map[string]any{"minute": 6, "hour": 100},
					"image": map[string]any{"minute": 4},
				}}, pairOpts{})
				kong, tg := run(t, s, repeat(4, usage("video=2, image=1")), "X-Forwarded-For: 198.51.100.33")
				// docs/kong.md: the response refused (video spent) is
				// charged nothing; Kong's headers on it show what would be
				// left had it been charged (header_filter.lua subtracts the
				// usage from what access read), tollgate's what is left.
				same(t, kong, tg, func(i int, diffs []string) []string {
					if i != 3 {
						return diffs
					}
					return only(`X-Ratelimit-Remaining-Image-Minute ["0"] vs ["1"]`, `X-Ratelimit-Remaining-Video-Hour ["92"] vs ["94"]`)(i, diffs)
				})
			})
			t.Run("combines multiple x-kong-limit headers from upstream", func(t *testing.T) {
				s := scenario(t, map[string]any{"limits": map[string]any{
					"video": map[string]any{"minute": 6},
					"image": map[string]any{"minute": 4},
				}}, pairOpts{})
				// docs/kong.md: Kong reads the first X-Kong-Limit line only
				// (header_filter.lua takes kong.service.response.get_header,
				// the first line), though its spec's "combines multiple
				// x-kong-limit headers" expects every line to count;
				// tollgate reads every line as one field (RFC 9110 5.3). So
				// tollgate on two lines answers as Kong on one line with
				// both entries...
				two := append(repeat(3, usage("video=2", "image=1")), usage("video=1"), usage("video=2", "image=1"))
				one := append(repeat(3, usage("video=2, image=1")), usage("video=1"), usage("video=2, image=1"))
				kong, tg := runEach(t, s, one, two, "X-Forwarded-For: 198.51.100.34")
				same(t, kong, tg, func(i int, diffs []string) []string {
					if i != 4 {
						return diffs
					}
					return only(`X-Ratelimit-Remaining-Image-Minute ["0"] vs ["1"]`)(i, diffs) // the refused response, as above
				})
				// ... and Kong on two lines charges only the first.
				s2 := scenario(t, map[string]any{"limits": map[string]any{"image": map[string]any{"minute": 4}}}, pairOpts{})
				kong, _ = run(t, s2, repeat(2, usage("video=2", "image=1")), "X-Forwarded-For: 198.51.100.34")
				if got := kong[1].Headers.Get("X-Ratelimit-Remaining-Image-Minute"); got != "4" {
					t.Errorf("Kong on a second X-Kong-Limit line: image remaining %q, want 4 (the second line unread)", got)
				}
			})
			t.Run("should block on first violation", func(t *testing.T) {
				s := scenario(t, map[string]any{"block_on_first_violation": true, "limits": map[string]any{
					"video": map[string]any{"minute": 6},
					"image": map[string]any{"minute": 4},
				}}, pairOpts{})
				kong, tg := run(t, s, []string{usage("video=2, image=4"), usage("video=2")}, "X-Forwarded-For: 198.51.100.35")
				if kong[1].Status != 429 || !strings.Contains(kong[1].Body, "API rate limit exceeded for 'image'") {
					t.Errorf("Kong's own plugin: %s, want 429 for 'image'", kong[1])
				}
				same(t, kong, tg, nil)
			})
			t.Run("hide_client_headers", func(t *testing.T) {
				s := scenario(t, map[string]any{"hide_client_headers": true, "limits": map[string]any{"video": map[string]any{"minute": 2}}}, pairOpts{})
				kong, tg := run(t, s, repeat(3, usage("video=1")), "X-Forwarded-For: 198.51.100.36")
				// docs/kong.md: Kong still sends X-RateLimit-Remaining-<resource>
				// (access.lua stores it whatever hide_client_headers says);
				// tollgate hides every rate-limit header.
				same(t, kong, tg, func(i int, diffs []string) []string {
					return only(fmt.Sprintf(`X-Ratelimit-Remaining-Video [%q] vs []`, fmt.Sprint(2-min(i, 2))))(i, diffs)
				})
			})
			t.Run("blocks per consumer (key-auth)", func(t *testing.T) {
				s := scenario(t, map[string]any{"limit_by": "consumer", "limits": map[string]any{"video": map[string]any{"minute": 3}}}, pairOpts{extra: []any{keyAuth}})
				kong, tg := run(t, s, repeat(4, usage("video=1")), "apikey: bob-key")
				same(t, kong, tg, nil)
				kong, tg = run(t, s, repeat(2, usage("video=1")), "apikey: alice-key")
				same(t, kong, tg, nil)
			})
			t.Run("a usage header of a resource with no limit, and none", func(t *testing.T) {
				s := scenario(t, video6, pairOpts{})
				kong, tg := run(t, s, []string{usage("audio=3"), "", usage("video=6"), ""}, "X-Forwarded-For: 198.51.100.37")
				same(t, kong, tg, nil)
			})
		})
	}
}

// kongCounters watches Kong's response-ratelimiting counters in a Redis:
// Kong counts a response in a timer after it (log.lua), so a client's
// next request can arrive before the count lands. Its wait makes the test
// what Kong's spec makes it with its SLEEP_TIME: each response counted
// before the next request is sent.
type kongCounters struct {
	t    *testing.T
	c    *goredis.Client
	want int64
}

func newKongCounters(t *testing.T, rds *redistest.Server) *kongCounters {
	c := goredis.NewClient(&goredis.Options{Addr: rds.Addr})
	t.Cleanup(func() { c.Close() })
	kc := &kongCounters{t: t, c: c}
	kc.want = kc.sum()
	return kc
}

// sum adds up Kong's minute counters (response-ratelimit:<route>:
// <service>:<identifier>:<period start>:<resource>:minute; Kong counts
// every period, and minutes outlive a scenario; tollgate's keys begin
// with tollgate:).
func (kc *kongCounters) sum() int64 {
	ctx := context.Background()
	var total int64
	for _, pattern := range []string{"response-ratelimit:*:minute"} {
		keys, err := kc.c.Keys(ctx, pattern).Result()
		if err != nil {
			kc.t.Fatal(err)
		}
		for _, key := range keys {
			n, err := kc.c.Get(ctx, key).Int64()
			if err != nil && err != goredis.Nil {
				kc.t.Fatal(err)
			}
			total += n
		}
	}
	return total
}

// counted waits until Kong has counted delta more units since the last
// wait.
func (kc *kongCounters) counted(delta int64) {
	kc.t.Helper()
	kc.want += delta
	waitfor.True(kc.t, 10*time.Second, fmt.Sprintf("Kong's counters in Redis reach %d", kc.want), func() bool { return kc.sum() >= kc.want })
	if got := kc.sum(); got != kc.want {
		kc.t.Fatalf("Kong's counters in Redis: %d, want %d", got, kc.want)
	}
}

// TestKongResponseLimitsProxyGRPC: a gRPC call on a gRPC route with
// tollgate-response-ratelimiting is proxied to its gRPC service (a plugin
// with a response handler would send it through Kong's buffered path,
// which answers gRPC with 500), with the same headers as Kong's
// response-ratelimiting beside it (04-access_spec.lua's "returns remaining
// counter #grpc"), on policy local.
func TestKongResponseLimitsProxyGRPC(t *testing.T) {
	grpcURL, calls := StartGRPCUpstream(t)
	k := Start(t, Options{Extra: realIP, Workers: 1})
	d := NewDeclarative("/probe-rrl-grpc")
	s := sides("rrl-grpc", "response-ratelimiting", "tollgate-response-ratelimiting")
	for i, sd := range s {
		d.AddService(map[string]any{"name": fmt.Sprintf("rrl-grpc-svc-%d", i), "url": grpcURL,
			"routes": []any{map[string]any{"name": fmt.Sprintf("rrl-grpc-%d", i), "protocols": []string{"grpc"},
				"paths": []string{sd.path}, "strip_path": false,
				"plugins": []any{map[string]any{"name": sd.plugin, "config": map[string]any{"limits": map[string]any{"video": map[string]any{"minute": 6}}}}}}}})
	}
	k.MustLoad(d)
	notNearMinuteEnd(t, 15*time.Second)
	kong, tg := interleaveWith(k.GetH2, s, 3, "/hello.HelloService/SayHello", "Content-Type: application/grpc", "X-Forwarded-For: 198.51.100.40")
	for i, a := range tg {
		if a.Status != 200 || a.Headers.Get("Content-Type") != "application/grpc" || a.Headers.Get("X-Ratelimit-Remaining-Video-Minute") != "6" {
			t.Errorf("gRPC call %d through tollgate-response-ratelimiting: %s, want the service's 200 (application/grpc) and X-RateLimit-Remaining-video-minute 6\n%s", i+1, a, k.logTail(10))
		}
	}
	same(t, kong, tg, nil)
	if n := calls.Load(); n != 6 {
		t.Errorf("the gRPC service had %d calls, want 6 (3 through each plugin)", n)
	}
}
