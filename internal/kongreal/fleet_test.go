//go:build kongreal

package kongreal

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// TestKongFleetSharesOneLimit: two Kong nodes (two prefixes, each with its
// own plugin servers) on one Redis hold one exact limit, seen from the
// client side: clients hammering both nodes get exactly the hour's 40
// admitted between them. Then Redis is stopped under load: with
// fault_tolerant true every answer is a 200 without rate-limit headers or
// a 429 of a client denied before (docs/kong.md), never a 500, and every
// request is answered.
func TestKongFleetSharesOneLimit(t *testing.T) {
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	d := NewDeclarative("/probe-fleet")
	d.AddService(map[string]any{"name": "fleet", "url": up.URL, "routes": []any{map[string]any{"name": "fleet", "paths": []string{"/fleet"},
		"plugins": []any{map[string]any{"name": "tollgate", "config": map[string]any{
			"hour": 40, "limit_by": "header", "header_name": "X-Client", "policy": "redis",
			"redis": map[string]any{"host": rds.KongRecord()["host"], "port": rds.KongRecord()["port"], "timeout": 200}}}}}}})
	file, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	nodes := []*Kong{Start(t, Options{Declarative: string(file)}), Start(t, Options{Declarative: string(file)})}
	for _, k := range nodes {
		k.MustLoad(d)
	}
	notNearEnd(t, time.Hour, time.Minute)

	var admitted, denied, other atomic.Int64
	var wg sync.WaitGroup
	for _, k := range nodes {
		for c := 0; c < 4; c++ {
			wg.Add(1)
			go func(k *Kong) {
				defer wg.Done()
				for i := 0; i < 25; i++ {
					switch a := k.Get("/fleet", "X-Client: shared"); a.Status {
					case 200:
						admitted.Add(1)
					case 429:
						denied.Add(1)
					default:
						other.Add(1)
					}
				}
			}(k)
		}
	}
	wg.Wait()
	if admitted.Load() != 40 || denied.Load() != 160 || other.Load() != 0 {
		t.Errorf("two nodes, 200 requests of one client: %d admitted, %d denied, %d other; want exactly 40 admitted", admitted.Load(), denied.Load(), other.Load())
	}

	// Redis stopped under load.
	var statuses sync.Map
	var total atomic.Int64
	count := func(status int, headers bool) {
		total.Add(1)
		key := fmt.Sprintf("%d headers=%v", status, headers)
		n, _ := statuses.LoadOrStore(key, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	stop := make(chan struct{})
	for i, k := range nodes {
		for c := 0; c < 2; c++ {
			wg.Add(1)
			go func(k *Kong, client string) {
				defer wg.Done()
				for j := 0; ; j++ {
					select {
					case <-stop:
						return
					default:
					}
					a := k.Get("/fleet", "X-Client: "+client+fmt.Sprint(j%5))
					count(a.Status, a.Headers.Get("X-Ratelimit-Limit-Hour") != "")
				}
			}(k, fmt.Sprintf("load-%d-%d-", i, c))
		}
	}
	waitfor.True(t, 10*time.Second, "load on both nodes", func() bool { return total.Load() >= 100 })
	rds.Stop()
	// Serve on without Redis: the breaker opens, nothing hangs.
	var after atomic.Int64
	deadline := time.Now().Add(20 * time.Second)
	for after.Load() < 100 && time.Now().Before(deadline) {
		a := nodes[0].Get("/fleet", "X-Client: after-the-fault")
		if a.Status != 200 || a.Headers.Get("X-Ratelimit-Limit-Hour") != "" {
			t.Fatalf("a new client with Redis down: %s, want 200 without rate-limit headers (fault_tolerant)", a)
		}
		after.Add(1)
	}
	close(stop)
	wg.Wait()
	statuses.Range(func(k, v any) bool {
		key := k.(string)
		if key != "200 headers=true" && key != "200 headers=false" && key != "429 headers=true" {
			t.Errorf("under load with Redis stopped: %d answers %s, want only 200s and 429s", v.(*atomic.Int64).Load(), key)
		}
		return true
	})
	if after.Load() < 100 {
		t.Errorf("only %d requests answered in 20 s after Redis stopped", after.Load())
	}
}
