package kongplugin_test

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/faultproxy"
	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// hammer sends access events for req to instance id from clients
// goroutines, each on a socket connection of its own, until the returned
// stop is called (it waits for them); record hears every call, from any
// goroutine.
func hammer(node *kongproc.Server, id int32, clients int, req kongproc.Request, record func(sent time.Time, res *kongproc.Result, err error)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < clients; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := node.Dial()
			defer c.Close()
			for {
				select {
				case <-done:
					return
				default:
				}
				sent := time.Now()
				res, err := c.Access(id, req)
				record(sent, res, err)
			}
		}()
	}
	return func() { close(done); wg.Wait() }
}

// kongCall is one access event of the load.
type kongCall struct {
	sent   time.Time
	took   time.Duration
	shared bool // Redis decided: the rate-limit headers are there
	err    error
}

// TestKongRedisNetworkFaults: the real plugin binary over its socket, its
// Redis behind a real Toxiproxy, under 4 clients' steady load. For each
// fault: calls, p50/p99/max, the calls fault_tolerant answered without
// Redis (no headers, as Kong), and the time back to Redis after healing.
// Nothing may fail or wait past the 200 ms timeout by more than a loaded
// machine's margin.
func TestKongRedisNetworkFaults(t *testing.T) {
	const timeout = 200 * time.Millisecond
	hold := 700 * time.Millisecond
	if os.Getenv("TOLLGATE_CHAOS") == "long" {
		hold = 3 * time.Second
	}
	for _, f := range []struct {
		name, kind, stream string
		attributes         map[string]any
		fallback           bool // the fault must reach the failure policy
	}{
		{"latency 400ms", "latency", "downstream", map[string]any{"latency": 400, "jitter": 50}, true},
		{"accepts, never answers", "timeout", "upstream", map[string]any{"timeout": 0}, true},
		{"connections reset", "reset_peer", "upstream", map[string]any{"timeout": 0}, true},
		{"closes delayed 1s", "slow_close", "downstream", map[string]any{"delay": 1000}, false},
		{"replies cut after 100 bytes", "limit_data", "downstream", map[string]any{"bytes": 100}, true},
		{"replies in 1-7 byte pieces", "slicer", "downstream", map[string]any{"average_size": 4, "size_variation": 3, "delay": 50}, false},
	} {
		t.Run(strings.ReplaceAll(f.name, " ", "_"), func(t *testing.T) {
			rs := redistest.StartT(t)
			proxy := faultproxy.Start(t, rs.Addr)
			host, port, _ := strings.Cut(proxy.Addr, ":")
			portN, _ := strconv.Atoi(port)
			node := kongproc.Start(t)
			setup := node.Dial()
			defer setup.Close()
			id := start(t, setup, map[string]any{"second": 1_000_000, "policy": "redis", "limit_by": "ip",
				"redis": map[string]any{"host": host, "port": portN, "timeout": int(timeout / time.Millisecond)}})
			var mu sync.Mutex
			var calls []kongCall
			stop := hammer(node, id, 4, kongproc.Request{ForwardedIP: "203.0.113.9"}, func(sent time.Time, res *kongproc.Result, err error) {
				call := kongCall{sent: sent, took: time.Since(sent), err: err, shared: err == nil && len(res.Headers) > 0}
				mu.Lock()
				calls = append(calls, call)
				mu.Unlock()
			})
			// sharedFor is how long Redis has decided the calls sent at or after t.
			sharedFor := func(t time.Time) time.Duration {
				mu.Lock()
				defer mu.Unlock()
				var first, last time.Time
				for _, c := range calls {
					if c.shared && !c.sent.Before(t) {
						if first.IsZero() {
							first = c.sent
						}
						last = c.sent
					}
				}
				return last.Sub(first)
			}
			loaded := time.Now()
			waitfor.TrueEvery(t, 10*time.Second, 20*time.Millisecond, "a steady load on Redis before the fault", func() bool { return sharedFor(loaded) >= 300*time.Millisecond })
			began := time.Now()
			proxy.Add("fault", f.kind, f.stream, f.attributes)
			time.Sleep(hold) // the fault lasts this long
			proxy.Remove("fault")
			healed := time.Now()
			waitfor.TrueEvery(t, 10*time.Second, 20*time.Millisecond, "Redis deciding again after healing, for a second", func() bool { return sharedFor(healed) >= time.Second })
			stop()

			var took []time.Duration
			fallback, failed := 0, 0
			back := time.Duration(-1)
			for _, c := range calls {
				if c.err != nil {
					failed++
				}
				if c.sent.After(began) && c.sent.Before(healed) {
					took = append(took, c.took)
					if !c.shared {
						fallback++
					}
				}
				if c.shared && !c.sent.Before(healed) && (back < 0 || c.sent.Sub(healed) < back) {
					back = c.sent.Sub(healed)
				}
			}
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			p50, p99, worst := took[len(took)/2], took[len(took)*99/100], took[len(took)-1]
			t.Logf("%s: %d calls during the fault, p50 %s, p99 %s, max %s; %d answered without Redis (fault_tolerant); %d failed in all; Redis deciding again %s after healing",
				f.name, len(took), p50.Round(time.Millisecond/10), p99.Round(time.Millisecond/10), worst.Round(time.Millisecond/10), fallback, failed, back.Round(time.Millisecond))
			if failed != 0 {
				t.Errorf("%d access events failed on the socket", failed)
			}
			if p99 > 4*timeout {
				t.Errorf("p99 %s past the %s timeout: decisions waited on the network", p99, timeout)
			}
			if f.fallback != (fallback > 0) {
				t.Errorf("%d calls answered without Redis; want some: %v", fallback, f.fallback)
			}
			if back < 0 || back > 5*time.Second {
				t.Errorf("Redis deciding again %s after healing", back)
			}
		})
	}
}
