package caddymodule_test

import (
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// TestCaddyAdaptiveStallIsNotTheUpstream: a real Caddy with the default
// (gradient) controller, in front of an upstream that answers in 100 ms,
// is offered 200 requests/s (20 in flight, far under its 1000/s limit),
// and once its factor is 1 it is stopped with SIGSTOP for 300 ms. The
// answers it had in flight reach reverse_proxy 300 ms late, and it
// measures them so: a fifth of an interval's answers, enough to lift the
// 90th percentile to four times the unloaded latency. Caddy's stall watch
// leaves those intervals unjudged: the factor stays at 0.8 or more (the
// same run with the watch disabled cut it to 0.47), and
// tollgate_adaptive_stalled_intervals_total counts them.
func TestCaddyAdaptiveStallIsNotTheUpstream(t *testing.T) {
	oneAdaptiveTestAtATime(t)
	stallIsNotTheUpstream(t, 1)
}

// TestCaddyAdaptiveStallInAFleetIsNotTheUpstream: the same with two Caddies
// sharing their limit and adaptive state through one redis-server, 100
// requests/s each, both stopped at once (one busy machine stalls every
// gateway on it). Each sends the stalled interval's signals marked, and
// the fleet's shared rule holds that interval and the next.
func TestCaddyAdaptiveStallInAFleetIsNotTheUpstream(t *testing.T) {
	oneAdaptiveTestAtATime(t)
	stallIsNotTheUpstream(t, 2)
}

// stallIsNotTheUpstream runs the stall test on n Caddies: one alone on
// the memory store, or a fleet on one redis-server.
func stallIsNotTheUpstream(t *testing.T, n int) {
	up := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond)
	}))
	store := ""
	if n > 1 {
		store = "store redis redis://" + redistest.StartT(t).Addr
	}
	nodes := make([]*caddyproc.Caddy, n)
	urls := make([]string, n)
	for i := range nodes {
		nodes[i] = caddyproc.Start(t, fmt.Sprintf(`
		tollgate {
			%s
			policy upstream {
				key all
				limit 1000/1s gcra burst 200
				adaptive
			}
		}
		reverse_proxy %s`, store, up))
		urls[i] = nodes[i].URL + "/"
	}
	// The load runs until 4 s after the stall (at most 20 s in all).
	loaded, enough := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(loaded)
		offerUntil(t, urls, 200/n, 20*time.Second, enough)
	}()
	// The factor is 1 once the unloaded latency is known: a measurement
	// holds it low for a few intervals first, and the factor then climbs
	// back past what the restored load's first interval served, about 5 s
	// in all, later on a busy machine.
	start := time.Now()
	waitfor.True(t, 15*time.Second, "the factor at 1 on every node with the load running for 2 s", func() bool {
		for _, c := range nodes {
			if f, err := readFactor(c); err != nil || f != 1 {
				return false
			}
		}
		return time.Since(start) > 2*time.Second
	})

	// From the stall on, the lowest factor seen every 50 ms.
	var mu sync.Mutex
	lowest := 1.0
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, c := range nodes {
				if f, err := readFactor(c); err == nil {
					mu.Lock()
					lowest = min(lowest, f)
					mu.Unlock()
				}
			}
		}
	}()
	for _, c := range nodes {
		if err := syscall.Kill(c.Pid(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // the stall itself, not a wait for anything
	for _, c := range nodes {
		if err := syscall.Kill(c.Pid(), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	time.AfterFunc(4*time.Second, func() { close(enough) }) // what follows the stall is watched for 4 s
	<-loaded
	close(stop)
	<-stopped
	stalled := gauge(t, nodes[0], "tollgate_adaptive_stalled_intervals_total", "upstream")
	t.Logf("%d node(s), after a 300 ms SIGSTOP: lowest factor %.2f, %v intervals unjudged (first node), judged latency now %.3fs", n, lowest, stalled,
		gauge(t, nodes[0], "tollgate_adaptive_latency_seconds", "upstream"))
	if lowest < 0.8 {
		t.Errorf("the factor fell to %.2f after the gateway's own 300 ms stall, want at least 0.8", lowest)
	}
	if stalled < 1 {
		t.Errorf("%v intervals unjudged for the stall, want at least 1", stalled)
	}
}
