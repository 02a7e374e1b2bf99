package kongplugin_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/procstat"
	"github.com/tollgate/tollgate/internal/redistest"
)

// TestKongThousandInstanceRestarts restarts the plugin's instances as Kong
// does on every config change (StartInstance with the new config, then
// CloseInstance of the old) 50 times in `make test` and 1,000 in `make
// chaos`, for a Redis, a local and an adaptive policy, each restart followed by
// requests. Counters survive every restart, and the plugin server's file
// descriptors, Redis connections and RSS come back to where they were.
func TestKongThousandInstanceRestarts(t *testing.T) {
	restarts := 50
	if os.Getenv("TOLLGATE_CHAOS") == "long" {
		restarts = 1000
	}
	rs := redistest.StartT(t)
	node := kongproc.StartResponse(t) // the adaptive config needs it
	c := node.Dial()
	defer c.Close()
	configs := map[string]map[string]any{
		"redis": {"minute": 100_000, "policy": "redis", "redis": rs.KongRecord(), "limit_by": "ip"},
		"local": {"minute": 100_000, "limit_by": "ip", "namespace": "local-restarts"},
		// An adaptive controller per instance start. A token bucket, whose
		// burst is its count: GCRA's burst is 1, so at 100,000 a minute it
		// refused a request that came within 0.6 ms of the one before (a
		// fast run did). Its remaining refills, so only the resources are
		// compared.
		"adaptive": {"minute": 100_000, "policy": "redis", "redis": rs.KongRecord(), "limit_by": "ip", "namespace": "adaptive-restarts",
			"algorithm": "token_bucket", "adaptive": map[string]any{"enabled": true}},
	}
	ids := map[string]int32{}
	restart := func(name string, i int) {
		cfg := map[string]any{"error_message": "limited " + strconv.Itoa(i)} // a changed config: a new instance
		for k, v := range configs[name] {
			cfg[k] = v
		}
		id := start(t, c, cfg)
		if old, ok := ids[name]; ok {
			if err := c.CloseInstance(old); err != nil {
				t.Fatalf("CloseInstance: %v", err)
			}
		}
		ids[name] = id
	}
	remaining := func(name, ip string) string {
		res := access(t, c, ids[name], kongproc.Request{ForwardedIP: ip})
		if res.Exited {
			t.Fatalf("%s: refused %d", name, res.Status)
		}
		return res.Headers.Get("X-Ratelimit-Remaining-Minute")
	}
	type resources struct {
		fds, redisClients int
		rss               int64
	}
	measure := func() resources {
		var r resources
		var err error
		if r.fds, err = procstat.FDs(node.Pid()); err != nil {
			t.Fatal(err)
		}
		if r.rss, err = procstat.RSS(node.Pid()); err != nil {
			t.Fatal(err)
		}
		if r.redisClients, err = rs.ConnectedClients(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for name := range configs {
		restart(name, 0)
		for i := 0; i < 3; i++ {
			remaining(name, "203.0.113.50")
		}
	}
	for i := 1; i <= 10; i++ { // warm up
		for name := range configs {
			restart(name, i)
			remaining(name, "198.51.100.1")
		}
	}
	base := measure()
	for i := 11; i < 11+restarts; i++ {
		for name := range configs {
			restart(name, i)
			remaining(name, "198.51.100."+strconv.Itoa(1+i%200))
		}
	}
	end := measure()
	t.Logf("%d restarts of 3 instances: before %d fds, %d Redis connections, RSS %.1f MB; after %d fds, %d Redis connections, RSS %.1f MB",
		restarts, base.fds, base.redisClients, float64(base.rss)/(1<<20), end.fds, end.redisClients, float64(end.rss)/(1<<20))
	for _, name := range []string{"redis", "local"} {
		if got := remaining(name, "203.0.113.50"); got != "99996" {
			t.Errorf("%s after %d restarts: remaining %s, want 99996 (the 3 used before them kept)", name, restarts, got)
		}
	}
	if end.fds > base.fds+10 || end.redisClients > base.redisClients+10 || end.rss > base.rss+64<<20 {
		t.Errorf("after %d restarts the plugin server holds more than before (margins +10 fds, +10 Redis connections, +64 MB)", restarts)
	}
}
