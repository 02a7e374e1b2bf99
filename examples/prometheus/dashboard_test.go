//go:build monitoring

// Package prometheus holds tollgate's alerting rules and Grafana dashboard;
// this test proves every dashboard query against a real Prometheus. It
// needs Debian's prometheus package, so it runs under `make monitoring`
// (the monitoring build tag), not `make test`.
package prometheus

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// TestDashboardQueriesReturnData runs a real Caddy with tollgate on a real
// redis-server (a policy with plans, an adaptive one), a real Prometheus
// (Debian's package) scraping Caddy's /metrics every second, and a steady
// load, and checks that every query of tollgate-dashboard.json returns data
// (a number, not NaN).
func TestDashboardQueriesReturnData(t *testing.T) {
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	b, err := os.ReadFile("tollgate-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	rs := redistest.StartT(t)
	caddy := caddyproc.Start(t, fmt.Sprintf(`
	tollgate {
		store redis redis://%s
		policy api {
			key {http.request.header.X-Key}
			plan {http.request.header.X-Plan}
			plans {
				free 5/1s
				pro 50/1s
			}
			default_plan free
		}
		policy upstream {
			match {
				path /upstream
			}
			key all
			limit 100/1s gcra burst 10
			adaptive {
				interval 200ms
			}
		}
	}
	respond "ok"`, rs.Addr))

	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	admin := strings.TrimPrefix(caddy.AdminURL, "http://")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: caddy\n    static_configs:\n      - targets: [%q]\n", admin)), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := exec.Command("prometheus", "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port))
	logf, _ := os.Create(filepath.Join(dir, "prometheus.log"))
	prom.Stdout, prom.Stderr = logf, logf
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prom.Process.Kill(); _ = prom.Wait() })

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { // steady load: some denied, some of each plan, the adaptive route
		for i := 0; ctx.Err() == nil; i++ {
			plan := []string{"free", "pro", ""}[i%3]
			path := []string{"/", "/upstream"}[i%2]
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, caddy.URL+path, nil)
			req.Header.Set("X-Key", "k"+strconv.Itoa(i%4))
			req.Header.Set("X-Plan", plan)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()

	api := "http://127.0.0.1:" + strconv.Itoa(port) + "/api/v1/query?query="
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			waitfor.True(t, 60*time.Second, fmt.Sprintf("panel %q: %s returns data", p.Title, target.Expr), func() bool {
				resp, err := http.Get(api + url.QueryEscape(target.Expr))
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				var out struct {
					Status string
					Data   struct {
						Result []struct{ Value []any }
					}
				}
				body, _ := io.ReadAll(resp.Body)
				if json.Unmarshal(body, &out) != nil || out.Status != "success" {
					return false
				}
				for _, r := range out.Data.Result {
					if v, ok := r.Value[1].(string); ok && v != "NaN" {
						return true
					}
				}
				return false
			})
			t.Logf("panel %q: data", p.Title)
		}
	}
}
