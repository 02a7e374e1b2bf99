package caddymodule_test

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/faultproxy"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// faultHold is how long each network fault lasts: short in `make test`,
// 3 s in `make chaos`.
func faultHold() time.Duration {
	if os.Getenv("TOLLGATE_CHAOS") == "long" {
		return 3 * time.Second
	}
	return 400 * time.Millisecond
}

// netFaultCaddy is a Caddy whose Redis store is reached through addr,
// with a 200 ms timeout and on_error local, limiting key k to limit per
// second (sliding_log); its site answers the deciding store and when it
// decided.
func netFaultCaddy(t *testing.T, addr string, limit int) *caddyproc.Caddy {
	return caddyproc.Start(t, fmt.Sprintf(`
	tollgate {
		store redis redis://%s {
			timeout 200ms
			on_error local
		}
		policy p {
			key {http.request.header.X-Key}
			limit %d/1s sliding_log
		}
	}
	respond "{http.tollgate.store} {http.tollgate.decided_at}"`, addr, limit))
}

// storeErrors reads tollgate_store_errors_total: decisions the failure
// policy made because Redis could not.
func storeErrors(t *testing.T, c *caddyproc.Caddy) int {
	m := regexp.MustCompile(`(?m)^tollgate_store_errors_total\{policy="p"\} (\d+)`).FindStringSubmatch(c.Metrics())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// phaseReport summarizes the requests sent between from and to.
type phaseReport struct {
	requests, errors5xx, failed int
	p50, p99, max               time.Duration
}

func (r phaseReport) String() string {
	return fmt.Sprintf("%d requests, 5xx %d, failed %d, p50 %s, p99 %s, max %s", r.requests, r.errors5xx, r.failed,
		r.p50.Round(time.Millisecond/10), r.p99.Round(time.Millisecond/10), r.max.Round(time.Millisecond/10))
}

func summarize(samples []sample, from, to time.Time) phaseReport {
	var r phaseReport
	var took []time.Duration
	for _, s := range samples {
		if s.sent.Before(from) || !s.sent.Before(to) {
			continue
		}
		r.requests++
		switch {
		case s.status < 0:
			r.failed++
		case s.status >= 500:
			r.errors5xx++
		}
		took = append(took, s.took)
	}
	if len(took) > 0 {
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		r.p50, r.p99, r.max = took[len(took)/2], took[len(took)*99/100], took[len(took)-1]
	}
	return r
}

// backToShared is how long after healed the first request decided by
// Redis was sent (-1: none).
func backToShared(samples []sample, healed time.Time) time.Duration {
	back := time.Duration(-1)
	for _, s := range samples {
		if s.store == "shared" && !s.sent.Before(healed) && (back < 0 || s.sent.Sub(healed) < back) {
			back = s.sent.Sub(healed)
		}
	}
	return back
}

// decisions returns when store ("shared": Redis, or "fallback") allowed
// each request (µs, that store's clock).
func decisions(samples []sample, store string) []int64 {
	var at []int64
	for _, s := range samples {
		if s.store == store {
			at = append(at, s.decided)
		}
	}
	return at
}

// TestCaddyRedisNetworkFaults puts a real Toxiproxy between a real Caddy
// and a real redis-server and, under steady load from 8 clients, injects
// each fault a network makes. For each: requests, 5xx, p50/p99/max
// latency, the decisions the fallback made, and the time back to Redis
// after healing. Every fault must be answered (no 5xx, no failed request),
// no request may wait past the store's timeout by more than a loaded
// machine's margin, Redis's decisions must stay exact (never more than the
// limit allowed in any second: no decision from a torn reply), and the
// breaker must close after healing.
func TestCaddyRedisNetworkFaults(t *testing.T) {
	const (
		timeout = 200 * time.Millisecond
		limit   = 300
	)
	type step struct {
		name   string
		toxics func(p *faultproxy.Proxy)
		// fallback: whether the fallback must decide (the breaker opens),
		// must not (the fault stays within the timeout), or may (-1).
		fallback int
	}
	latency := func(ms, jitter int) func(p *faultproxy.Proxy) {
		return func(p *faultproxy.Proxy) {
			p.Add("latency", "latency", "downstream", map[string]any{"latency": ms, "jitter": jitter})
		}
	}
	faults := []struct {
		name  string
		steps []step
	}{
		// 0 → 50 ms → 400 ms → 0: the breaker opens only past the timeout.
		{"latency_steps", []step{
			{"latency 50ms ±10ms", latency(50, 10), 0},
			{"latency 400ms ±50ms", latency(400, 50), 1},
		}},
		{"timeout", []step{{"accepts, never answers", func(p *faultproxy.Proxy) {
			p.Add("timeout", "timeout", "upstream", map[string]any{"timeout": 0})
		}, 1}}},
		{"reset_peer", []step{{"connections reset", func(p *faultproxy.Proxy) {
			p.Add("reset", "reset_peer", "upstream", map[string]any{"timeout": 0})
		}, 1}}},
		{"slow_close", []step{{"closes delayed 1s", func(p *faultproxy.Proxy) {
			p.Add("slow_close", "slow_close", "downstream", map[string]any{"delay": 1000})
		}, -1}}},
		{"limit_data", []step{{"replies cut after 100 bytes", func(p *faultproxy.Proxy) {
			p.Add("limit_data", "limit_data", "downstream", map[string]any{"bytes": 100})
		}, 1}}},
		{"slicer", []step{{"replies in 1-7 byte pieces", func(p *faultproxy.Proxy) {
			p.Add("slicer", "slicer", "downstream", map[string]any{"average_size": 4, "size_variation": 3, "delay": 50})
		}, 0}}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			srv := redistest.StartT(t)
			proxy := faultproxy.Start(t, srv.Addr)
			c := netFaultCaddy(t, proxy.Addr, limit)
			began := time.Now()
			load := startLoad(c, "k")
			waitfor.TrueEvery(t, 10*time.Second, 20*time.Millisecond, "a steady load on Redis before the fault", func() bool { return load.sharedFor(began) >= 300*time.Millisecond })
			var bounds []time.Time
			var fallbacks []int
			for _, st := range f.steps {
				before := storeErrors(t, c)
				bounds = append(bounds, time.Now())
				st.toxics(proxy)
				time.Sleep(faultHold()) // the fault lasts this long
				fallbacks = append(fallbacks, storeErrors(t, c)-before)
				proxy.Remove(map[string]string{"latency_steps": "latency", "timeout": "timeout", "reset_peer": "reset",
					"slow_close": "slow_close", "limit_data": "limit_data", "slicer": "slicer"}[f.name])
			}
			healed := time.Now()
			waitfor.TrueEvery(t, 5*time.Second, 20*time.Millisecond, "Redis deciding again after healing, steadily", func() bool { return load.sharedFor(healed) >= 300*time.Millisecond })
			samples := load.finish()

			for i, st := range f.steps {
				end := healed
				if i+1 < len(bounds) {
					end = bounds[i+1]
				}
				r := summarize(samples, bounds[i], end)
				t.Logf("%s: %s; %d decisions by the fallback", st.name, r, fallbacks[i])
				if r.errors5xx != 0 || r.failed != 0 {
					t.Errorf("%s: %d 5xx and %d failed requests, want none", st.name, r.errors5xx, r.failed)
				}
				// Target: the timeout plus a few ms (docs/testing.md, Reliability).
				// A hang would last the whole fault; the bound leaves a
				// loaded 2-core machine room to schedule.
				if r.p99 > 4*timeout {
					t.Errorf("%s: p99 %s, past the %s timeout: requests waited on the network", st.name, r.p99, timeout)
				}
				switch {
				case st.fallback == 1 && fallbacks[i] == 0:
					t.Errorf("%s: the fallback decided nothing: Redis answered through the fault?", st.name)
				case st.fallback == 0 && fallbacks[i] != 0:
					t.Errorf("%s: %d decisions fell back though the fault stays within the %s timeout", st.name, fallbacks[i], timeout)
				}
			}
			back := backToShared(samples, healed)
			after := summarize(samples, healed, time.Now())
			t.Logf("healed: %s; Redis deciding again %s after healing; Redis allowed at most %d in any 1 s (limit %d)",
				after, back.Round(time.Millisecond), mostInWindow(decisions(samples, "shared"), time.Second), limit)
			if back < 0 || back > 5*time.Second {
				t.Errorf("Redis decided again %s after healing: the breaker did not close", back)
			}
			if worst := mostInWindow(decisions(samples, "shared"), time.Second); worst > limit {
				t.Errorf("Redis allowed %d in 1 s, above the limit %d: a decision came from a torn reply", worst, limit)
			}
		})
	}
}

// TestCaddyPartitionOneNode: two Caddies share one redis-server; one
// reaches it through Toxiproxy and is cut off (nothing gets through,
// connections stay open). The cut node falls back to local limiting,
// the other stays on Redis throughout, and after healing both decide in
// Redis again: Redis's decisions from both nodes never exceed the limit
// in any second.
func TestCaddyPartitionOneNode(t *testing.T) {
	const limit = 100
	srv := redistest.StartT(t)
	proxy := faultproxy.Start(t, srv.Addr)
	cut, direct := netFaultCaddy(t, proxy.Addr, limit), netFaultCaddy(t, srv.Addr, limit)
	started := time.Now()
	loadCut, loadDirect := startLoad(cut, "k"), startLoad(direct, "k")
	waitfor.TrueEvery(t, 10*time.Second, 20*time.Millisecond, "both nodes steadily on Redis before the cut", func() bool {
		return loadCut.sharedFor(started) >= 300*time.Millisecond && loadDirect.sharedFor(started) >= 300*time.Millisecond
	})
	began := time.Now()
	proxy.Cut()
	time.Sleep(faultHold()) // the cut lasts this long
	proxy.Heal()
	healed := time.Now()
	waitfor.TrueEvery(t, 10*time.Second, 20*time.Millisecond, "the cut node deciding in Redis again, both for a whole window", func() bool {
		return loadCut.sharedFor(healed) >= time.Second && loadDirect.sharedFor(healed) >= time.Second
	})
	samplesCut, samplesDirect := loadCut.finish(), loadDirect.finish()

	fallback, fallbackDirect := len(decisions(samplesCut, "fallback")), len(decisions(samplesDirect, "fallback"))
	back := backToShared(samplesCut, healed)
	both := append(decisions(samplesCut, "shared"), decisions(samplesDirect, "shared")...)
	t.Logf("cut node during the partition: %s, %d allowed by the fallback; other node: %s, %d by the fallback; cut node back on Redis %s after healing; Redis allowed at most %d in any 1 s (limit %d)",
		summarize(samplesCut, began, healed), fallback, summarize(samplesDirect, began, healed), fallbackDirect,
		back.Round(time.Millisecond), mostInWindow(both, time.Second), limit)
	if fallback == 0 {
		t.Error("the cut node never fell back")
	}
	if fallbackDirect != 0 {
		t.Errorf("the node that kept Redis fell back %d times", fallbackDirect)
	}
	if back < 0 || back > 5*time.Second {
		t.Errorf("the cut node decided in Redis again %s after healing", back)
	}
	if worst := mostInWindow(both, time.Second); worst > limit {
		t.Errorf("the two nodes' Redis decisions allowed %d in 1 s, above %d", worst, limit)
	}
	for _, r := range []phaseReport{summarize(samplesCut, began, healed), summarize(samplesDirect, began, healed)} {
		if r.errors5xx != 0 || r.failed != 0 {
			t.Errorf("during the partition: %s; want no 5xx and no failed request", r)
		}
	}
}

// TestCaddyPartitionEventual: two Caddies in eventual mode (sync 100 ms)
// on one redis-server, one cut off from it. Each side then counts alone,
// so the fleet admits at most twice the limit in a window while cut (the
// bound docs/testing.md states); after healing the counts merge and the fleet is
// back within the limit plus one sync's worth per node.
//
// It once saw 203 in a window: a decision whose clock reading was
// overtaken across a window boundary moved the key's state back a window
// (TestEventualKeyTimeNeverGoesBack), fixed since.
func TestCaddyPartitionEventual(t *testing.T) {
	const limit = 100
	srv := redistest.StartT(t)
	proxy := faultproxy.Start(t, srv.Addr)
	config := func(addr string) string {
		return fmt.Sprintf(`
	tollgate {
		store redis redis://%s {
			timeout 200ms
			mode eventual sync 100ms
		}
		policy p {
			key {http.request.header.X-Key}
			limit %d/1s fixed_window
		}
	}
	respond "{http.tollgate.store} {http.tollgate.decided_at}"`, addr, limit)
	}
	cut, other := caddyproc.Start(t, config(proxy.Addr)), caddyproc.Start(t, config(srv.Addr))
	started := time.Now()
	loadCut, loadOther := startLoad(cut, "k"), startLoad(other, "k")
	waitfor.TrueEvery(t, 10*time.Second, 20*time.Millisecond, "a steady load on both nodes before the cut", func() bool {
		return loadCut.answeredFor(started) >= 300*time.Millisecond && loadOther.answeredFor(started) >= 300*time.Millisecond
	})
	proxy.Cut()
	time.Sleep(faultHold() + time.Second) // the fault lasts this long
	proxy.Heal()
	healed := time.Now()
	waitfor.TrueEvery(t, 10*time.Second, 20*time.Millisecond, "both nodes answered for 1.5 s after healing (syncs resume)", func() bool {
		return loadCut.answeredFor(healed) >= 1500*time.Millisecond && loadOther.answeredFor(healed) >= 1500*time.Millisecond
	})
	// Allowed per fixed 1 s window, on the nodes' clocks (one machine),
	// by node: [cut, other].
	perWindow := map[int64][2]int{}
	for node, samples := range [][]sample{loadCut.finish(), loadOther.finish()} {
		for _, s := range samples {
			if s.status == 200 {
				n := perWindow[s.decided/1_000_000]
				n[node]++
				perWindow[s.decided/1_000_000] = n
			}
		}
	}
	worst := 0
	for _, n := range perWindow {
		worst = max(worst, n[0]+n[1])
	}
	t.Logf("eventual mode, one node cut off: at most %d allowed in a 1 s window (limit %d, bound while cut %d); by window [cut other]: %v",
		worst, limit, 2*limit, perWindow)
	if worst > 2*limit {
		t.Errorf("the fleet allowed %d in one window with one node cut off, above the bound %d", worst, 2*limit)
	}
}
