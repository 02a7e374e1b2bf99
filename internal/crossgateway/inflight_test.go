package crossgateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// upstream is a slow service that counts the requests it serves at once.
type upstream struct {
	now, most, served atomic.Int64
	work              time.Duration // each request's service time
	hang              chan struct{} // /hang blocks until it closes
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.now.Add(1)
	defer u.now.Add(-1)
	for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
	}
	if r.URL.Path == "/hang" {
		select {
		case <-u.hang:
		case <-r.Context().Done():
		}
		return
	}
	// The model's service time, not a synchronisation. Like a well-behaved
	// service it stops when the gateway abandons the request (its client
	// left): the gateway gave the slot back then.
	select {
	case <-time.After(u.work):
		u.served.Add(1)
	case <-r.Context().Done():
	}
}

// TestInFlightFleetCaddyAndKong: two Caddies and two Kong plugin servers
// on one redis-server share one key's limit of 4 requests in flight, with
// 24 Caddy clients and 8 Kong clients in front of an upstream that takes
// 50 ms per request: the upstream never sees more than 4 at once, and does
// see 4 (the slots are used). A Caddy client that gives up gives its slot
// back at once. Then a Kong node, and later a Caddy, is killed with
// SIGKILL while holding all 4 slots: the surviving Caddy gets them back
// within the 2 s lease, and not before the lease could have ended.
func TestInFlightFleetCaddyAndKong(t *testing.T) {
	srv := redistest.StartT(t)
	up := &upstream{work: 50 * time.Millisecond, hang: make(chan struct{})}
	backend := httptest.NewServer(up)
	t.Cleanup(backend.Close)
	t.Cleanup(func() { close(up.hang) })
	const n, lease = 4, 2 * time.Second
	// Kong keys a namespaced policy "ns=<namespace>|<identifier>": the
	// Caddies name the same policy and key, so all four share the slots.
	body := fmt.Sprintf(`
	tollgate {
		store redis redis://%s
		policy exports {
			key "ns=exports|acme"
			limit %d/%s in_flight
		}
		headers ietf
	}
	reverse_proxy %s`, srv.Addr, n, lease, backend.Listener.Addr())
	nodes := []*caddyproc.Caddy{caddyproc.Start(t, body), caddyproc.Start(t, body)}
	kongCfg := map[string]any{"namespace": "exports", "policy": "redis", "redis": srv.KongRecord(),
		"limits":   []any{map[string]any{"count": n, "window": lease.String(), "algorithm": "in_flight"}},
		"limit_by": "header", "header_name": "X-Key"}
	kongs := []*kongproc.Server{kongproc.StartResponse(t), kongproc.StartResponse(t)} // tollgate-response: slots go back in the log phase
	kongIDs := make([]int32, len(kongs))
	for i, k := range kongs {
		c := k.Dial()
		var err error
		if kongIDs[i], err = c.StartInstance(kongCfg); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	kongRequest := func() kongproc.Request {
		return kongproc.Request{Headers: http.Header{"X-Key": {"acme"}}, ForwardedIP: "198.51.100.7", Shared: map[string]any{}}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var ok, denied atomic.Int64
	var wg sync.WaitGroup
	var policyHeader atomic.Value
	for g := 0; g < 24; g++ {
		wg.Add(1)
		go func(node *caddyproc.Caddy) {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, node.URL+"/export", nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					ok.Add(1)
					policyHeader.Store(resp.Header.Get("RateLimit-Policy"))
				case 429:
					denied.Add(1)
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		}(nodes[g%2])
	}
	var kongOK, kongDenied atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := kongs[i].Dial()
			defer c.Close()
			for ctx.Err() == nil {
				req := kongRequest()
				res, err := c.Access(kongIDs[i], req)
				if err != nil {
					return
				}
				if res.Exited {
					kongDenied.Add(1)
					continue
				}
				// Kong proxies, then runs the log phase.
				if resp, err := http.Get(backend.URL + "/export"); err == nil {
					resp.Body.Close()
					kongOK.Add(1)
				}
				if _, err := c.Log(kongIDs[i], req); err != nil {
					return
				}
			}
		}(g % 2)
	}
	wg.Wait()
	t.Logf("Caddy: %d served, %d denied; Kong: %d served, %d denied; upstream served %d, at most %d at once",
		ok.Load(), denied.Load(), kongOK.Load(), kongDenied.Load(), up.served.Load(), up.most.Load())
	// The upstream's mean concurrency: its served requests' time over the load's.
	t.Logf("upstream busy %.1f of %d slots on average", float64(up.served.Load())*up.work.Seconds()/1.5, n)
	if kongOK.Load() == 0 || kongDenied.Load() == 0 {
		t.Error("the Kong nodes were never served or never denied: they did not share the slots")
	}
	if most := up.most.Load(); most != n {
		t.Errorf("upstream saw at most %d requests at once, want exactly %d (never more, and all slots used)", most, n)
	}
	if got := policyHeader.Load(); got != `"exports";q=4;qu="concurrent-requests"` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if denied.Load() == 0 {
		t.Error("24 clients on 4 slots were never denied")
	}

	// A client that gives up gives its slot back: if it did not, only 3 of
	// the 4 requests below would reach the upstream.
	hangCtx, hangUp := context.WithCancel(context.Background())
	go func() {
		req, _ := http.NewRequestWithContext(hangCtx, http.MethodGet, nodes[1].URL+"/hang", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitfor.True(t, 5*time.Second, "a request held at the upstream", func() bool { return up.now.Load() == 1 })
	hangUp()
	waitfor.True(t, 5*time.Second, "the cancelled request gone from the upstream", func() bool { return up.now.Load() == 0 })

	// A Kong node takes every slot (access phases with no log phase yet) and
	// dies: its slots come back within the lease.
	kc := kongs[0].Dial()
	for i := 0; i < n; i++ {
		if res, err := kc.Access(kongIDs[0], kongRequest()); err != nil || res.Exited {
			t.Fatalf("Kong access %d: %v (exited %v)", i, err, res != nil && res.Exited)
		}
	}
	if resp, _ := nodes[1].Get("/export"); resp.StatusCode != 429 {
		t.Fatalf("with 4 slots held through Kong, Caddy answered %d, want 429", resp.StatusCode)
	}
	kongs[0].Kill()
	killedKong := time.Now()
	freed := waitfor.True(t, lease+3*time.Second, "Caddy gets a slot back from the dead Kong node", func() bool {
		resp, _ := nodes[1].Get("/export")
		return resp.StatusCode == 200
	})
	t.Logf("the Kong node's slots came back %v after it was killed", freed)
	if since := time.Since(killedKong); since < lease/3 {
		t.Errorf("a slot came back %v after the kill: before any lease of the dead node could end", since)
	}
	waitfor.True(t, lease+3*time.Second, "every slot back", func() bool {
		resp, _ := nodes[1].Get("/export")
		return resp.StatusCode == 200 && up.now.Load() == 0
	})

	// Every slot held through node 0 (a request refused while the cancelled
	// one's slot is on its way back tries again), then node 0 dies holding
	// them. Within half the lease: a slot that came back only by expiring
	// would be too late.
	for i := 0; i < n; i++ {
		go func() {
			for {
				resp, err := http.Get(nodes[0].URL + "/hang")
				if err != nil {
					return
				}
				resp.Body.Close()
				if resp.StatusCode != 429 {
					return
				}
			}
		}()
	}
	waitfor.True(t, lease/2, "4 slots held at the upstream", func() bool { return up.now.Load() == n })
	if resp, _ := nodes[1].Get("/export"); resp.StatusCode != 429 {
		t.Fatalf("with 4 slots held through node 0, node 1 answered %d, want 429", resp.StatusCode)
	}
	killed := time.Now()
	nodes[0].Kill()
	freed = waitfor.True(t, lease+3*time.Second, "node 1 gets a slot back", func() bool {
		resp, _ := nodes[1].Get("/export")
		return resp.StatusCode == 200
	})
	t.Logf("slots came back %v after node 0 was killed (lease %v, renewed every %v)", freed, lease, lease/3)
	if since := time.Since(killed); since < lease/3 {
		t.Errorf("a slot came back %v after the kill: before any lease of the dead node could end", since)
	}
}
