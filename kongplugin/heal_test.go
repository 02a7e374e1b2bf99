package kongplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/pgtest"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// Kong's rate-limiting table (kong/plugins/rate-limiting/migrations:
// 000_base, 004_200_to_210's ttl), written here from its columns.
const kongRateLimitingTable = `CREATE TABLE ratelimiting_metrics (
  identifier TEXT NOT NULL, period TEXT NOT NULL, period_date TIMESTAMP WITH TIME ZONE NOT NULL,
  service_id UUID NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'::UUID,
  route_id UUID NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'::UUID,
  value INTEGER, ttl TIMESTAMP WITH TIME ZONE,
  PRIMARY KEY (identifier, period, period_date, service_id, route_id));`

// TestKongRefusalHeals: an instance refused because of the world (policy
// cluster, and Kong's settings file not there yet) says so at [error]
// once, answers Kong's 500 meanwhile, tries again on its own, and serves
// once the file is there, saying so at [notice], with no config change.
// A refusal of the config itself does not heal (TestKongRefusedConfigs).
func TestKongRefusalHeals(t *testing.T) {
	t.Run("tollgate", func(t *testing.T) { refusalHeals(t, kongproc.Start(t), false) })
	// tollgate-response's log phase reaches the refused instance too,
	// before the access event that tells the return.
	t.Run("tollgate-response", func(t *testing.T) { refusalHeals(t, kongproc.StartResponse(t), true) })
}

func refusalHeals(t *testing.T, srv *kongproc.Server, logPhase bool) {
	c := srv.Dial()
	defer c.Close()
	config := kongConfig(map[string]any{"minute": 5, "policy": "cluster"})
	config["route_id"], config["service_id"] = "7c2a6a43-4a4c-4b8a-9d37-4d1b0a0f0001", "7c2a6a43-4a4c-4b8a-9d37-4d1b0a0f0002"
	id, err := c.StartInstance(config)
	if err != nil {
		t.Fatal(err)
	}
	req := kongproc.Request{ForwardedIP: "192.0.2.1"}
	var logs []string
	for i := range 3 {
		res := access(t, c, id, req)
		if !res.Delayed || res.Status != 500 {
			t.Fatalf("request %d while refused: delayed %v %d, want Kong's 500", i+1, res.Delayed, res.Status)
		}
		logs = append(logs, res.Logs...)
	}
	if len(logs) != 1 || !strings.Contains(logs[0], "config refused, every request answered 500 until the cause is gone") ||
		!strings.Contains(logs[0], ".kong_env, where Kong writes its settings, is missing") {
		t.Fatalf("Kong's log while refused: %q, want one line with the reason and that it heals", logs)
	}

	db := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.DSN("kong"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, kongRateLimitingTable); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	env := fmt.Sprintf("database = postgres\npg_host = 127.0.0.1\npg_port = %d\npg_user = kong\npg_database = kong\n", db.Port)
	if err := os.WriteFile(filepath.Join(srv.Prefix, ".kong_env"), []byte(env), 0o640); err != nil {
		t.Fatal(err)
	}
	logs = nil
	waitfor.True(t, 30*time.Second, "the refused instance serving", func() bool {
		if logPhase {
			if _, err := c.Log(id, req); err != nil {
				t.Fatal(err)
			}
		}
		res := access(t, c, id, req)
		logs = append(logs, res.Logs...)
		return !res.Exited && res.Headers.Get("X-RateLimit-Limit-Minute") == "5"
	})
	if len(logs) != 1 || !strings.Contains(logs[0], "config in force again") {
		t.Fatalf("Kong's log when it healed: %q, want one line", logs)
	}
	for i := range 4 {
		if res := access(t, c, id, req); res.Exited {
			t.Fatalf("request %d after healing: refused %d (minute 5: six in all)", i+2, res.Status)
		}
	}
	if res := access(t, c, id, req); !res.Exited || res.Status != 429 {
		t.Fatalf("the sixth request: exited %v %d, want 429 (counted in Kong's table)", res.Exited, res.Status)
	}
}

// TestKongStoreOutageToldAtKongsLevel: Redis stops under a tollgate on
// policy redis (fault_tolerant, Kong's default: requests go on without a
// limit, as Kong's plugin lets them): the instance's next request after
// the breaker opens tells Kong's log at [error], once, with the failure
// policy; Redis back, the next request tells it at [notice]. The plugin
// server's own line of it reaches Kong's log at info only.
func TestKongStoreOutageToldAtKongsLevel(t *testing.T) {
	rds := redistest.StartT(t)
	srv := kongproc.Start(t)
	c := srv.Dial()
	defer c.Close()
	id, err := c.StartInstance(kongConfig(map[string]any{"minute": 100, "policy": "redis", "redis": rds.KongRecord()}))
	if err != nil {
		t.Fatal(err)
	}
	req := kongproc.Request{ForwardedIP: "192.0.2.9"}
	if res := access(t, c, id, req); res.Exited || len(res.Logs) != 0 {
		t.Fatalf("with Redis up: exited %v, logs %q", res.Exited, res.Logs)
	}
	rds.Stop()
	var logs []string
	waitfor.True(t, 20*time.Second, "the outage in Kong's log", func() bool {
		res := access(t, c, id, req)
		if res.Exited {
			t.Fatalf("fault_tolerant true: %d, want the request proxied", res.Status)
		}
		logs = append(logs, res.Logs...)
		return len(logs) > 0
	})
	for range 5 {
		logs = append(logs, access(t, c, id, req).Logs...)
	}
	if len(logs) != 1 || !strings.HasPrefix(logs[0], "err: tollgate (route=route-1,service=service-1): rate-limit store failing (") ||
		!strings.Contains(logs[0], "its failure policy (on_error allow) decides until it answers again") {
		t.Fatalf("Kong's log during the outage: %q, want one [error] line with the failure policy", logs)
	}
	if err := rds.Restart(); err != nil {
		t.Fatal(err)
	}
	logs = nil
	waitfor.True(t, 20*time.Second, "Redis's return in Kong's log", func() bool {
		logs = append(logs, access(t, c, id, req).Logs...)
		return len(logs) > 0
	})
	if len(logs) != 1 || logs[0] != "notice: tollgate (route=route-1,service=service-1): rate-limit store answering again" {
		t.Fatalf("Kong's log after the outage: %q", logs)
	}
}
