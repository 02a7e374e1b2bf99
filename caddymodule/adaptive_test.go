package caddymodule_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/redistest"
)

// overloadableUpstream serves up to capacity requests per second quickly,
// and answers the excess slowly with 503: a service that struggles under
// load.
type overloadableUpstream struct {
	capacity int
	mu       sync.Mutex
	recent   []time.Time // requests served in the last second
	served   []upstreamHit
}

type upstreamHit struct {
	at     time.Time
	status int
}

func (u *overloadableUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	u.mu.Lock()
	cut := 0
	for cut < len(u.recent) && now.Sub(u.recent[cut]) > time.Second {
		cut++
	}
	u.recent = u.recent[cut:]
	over := len(u.recent) >= u.capacity
	status := 200
	if over {
		status = 503
	} else {
		u.recent = append(u.recent, now)
	}
	u.served = append(u.served, upstreamHit{now, status})
	u.mu.Unlock()
	if over {
		time.Sleep(80 * time.Millisecond)
	}
	w.WriteHeader(status)
}

// serveUpstream serves an overloadableUpstream of capacity on a loopback
// port until the test ends.
func serveUpstream(t *testing.T, capacity int) (*overloadableUpstream, string) {
	t.Helper()
	up := &overloadableUpstream{capacity: capacity}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: up}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return up, l.Addr().String()
}

// rate returns the requests per second the upstream received in [from, to)
// and the fraction it failed.
func (u *overloadableUpstream) rate(from, to time.Time) (float64, float64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	n, failed := 0, 0
	for _, h := range u.served {
		if !h.at.Before(from) && h.at.Before(to) {
			n++
			if h.status != 200 {
				failed++
			}
		}
	}
	if n == 0 {
		return 0, 0
	}
	return float64(n) / to.Sub(from).Seconds(), float64(failed) / float64(n)
}

// offer sends rps requests per second to url for d, and returns how many
// got past tollgate (anything but 429).
func offer(t *testing.T, url string, rps int, d time.Duration) int {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 5 * time.Second}
	tick := time.NewTicker(time.Second / time.Duration(rps))
	defer tick.Stop()
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for time.Now().Before(end) {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get(url)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests {
				mu.Lock()
				passed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return passed
}

// TestCaddyAdaptiveFollowsUpstream: behind a real Caddy, an upstream that
// handles 100 requests/s is offered 300/s through a policy of 400/s. The
// adaptive limit falls until the upstream gets about its capacity and
// stops failing; when the load drops, the limit climbs back to 400.
func TestCaddyAdaptiveFollowsUpstream(t *testing.T) {
	const capacity = 100
	up, upAddr := serveUpstream(t, capacity)

	c := caddyproc.Start(t, fmt.Sprintf(`
	tollgate {
		policy upstream {
			key all
			limit 400/1s sliding_counter
			adaptive {
				min 0.1
				error_rate 0.05
				latency 50ms
				interval 500ms
			}
		}
	}
	reverse_proxy %s`, upAddr))

	start := time.Now()
	passed := offer(t, c.URL+"/", 3*capacity, 8*time.Second)
	settled := time.Now()
	rateLate, failedLate := up.rate(settled.Add(-3*time.Second), settled)
	rateEarly, failedEarly := up.rate(start, start.Add(time.Second))
	factor := metric(t, c, `tollgate_adaptive_factor{policy="upstream"}`)
	t.Logf("offered 300/s for 8 s: %d passed; upstream got %.0f/s (%.0f%% failed) in the first second, %.0f/s (%.0f%% failed) in the last 3 s; factor %.2f",
		passed, rateEarly, 100*failedEarly, rateLate, 100*failedLate, factor)
	if rateLate < 0.5*capacity || rateLate > 1.5*capacity {
		t.Errorf("upstream received %.0f/s once settled, want about its capacity %d", rateLate, capacity)
	}
	// AIMD probes past the capacity now and then, so some requests still
	// fail; far fewer than the two in three before the limit adapted.
	if failedLate > 0.4 || failedLate > 0.6*failedEarly {
		t.Errorf("upstream still failed %.0f%% of requests once settled (%.0f%% at first)", 100*failedLate, 100*failedEarly)
	}
	if factor > 0.5 {
		t.Errorf("adaptive factor %.2f under 3x overload, want it well below 1", factor)
	}

	// Load drops to half the capacity: the limit climbs back to 400.
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		offer(t, c.URL+"/", capacity/2, time.Second)
		if metric(t, c, `tollgate_adaptive_factor{policy="upstream"}`) == 1 {
			break
		}
	}
	resp, _ := c.Get("/")
	if f := metric(t, c, `tollgate_adaptive_factor{policy="upstream"}`); f != 1 || resp.Header.Get("X-Ratelimit-Limit") != "400" {
		t.Fatalf("after the load dropped: factor %.2f, X-Ratelimit-Limit %q; want the configured 400 back", f, resp.Header.Get("X-Ratelimit-Limit"))
	}
	t.Logf("limit back to 400/s %s after the load dropped", time.Since(settled).Round(100*time.Millisecond))
}

// metric reads one series' value from Caddy's /metrics.
func metric(t *testing.T, c *caddyproc.Caddy, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(series) + ` ([0-9.e+-]+)`).FindStringSubmatch(c.Metrics())
	if m == nil {
		t.Fatalf("metrics lack %s", series)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestCaddyAdaptiveFleetSharesFactor: two Caddies on one redis-server with
// the same adaptive policy; only the first carries traffic to a struggling
// upstream, yet the second tightens with it (one factor in Redis).
func TestCaddyAdaptiveFleetSharesFactor(t *testing.T) {
	rs := redistest.StartT(t)
	_, upAddr := serveUpstream(t, 50)
	body := fmt.Sprintf(`
	tollgate {
		store redis redis://%s
		policy upstream {
			key all
			limit 400/1s sliding_counter
			adaptive {
				interval 500ms
			}
		}
	}
	reverse_proxy %s`, rs.Addr, upAddr)
	busy, idle := caddyproc.Start(t, body), caddyproc.Start(t, body)
	offer(t, busy.URL+"/", 150, 3*time.Second)
	fb := metric(t, busy, `tollgate_adaptive_factor{policy="upstream"}`)
	fi := metric(t, idle, `tollgate_adaptive_factor{policy="upstream"}`)
	t.Logf("after 3 s of overload through one node: factor %.2f on it, %.2f on the idle node", fb, fi)
	if fb > 0.6 || fi > 0.6 {
		t.Fatalf("factors %.2f (busy) and %.2f (idle): the fleet did not tighten together", fb, fi)
	}
}
