//go:build kongreal

package kongreal

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/waitfor"
)

// TestKongClusterKeepsKongsCounts: on Kong with Postgres, a route limited
// by Kong's rate-limiting on policy cluster, then by tollgate on cluster,
// then by Kong's again, keeps one count: tollgate reads and adds to the
// rows Kong's plugin wrote (ratelimiting_metrics), and Kong's plugin
// reads tollgate's. Each switch changes the hour's limit, so the
// X-RateLimit-Limit-Hour header tells which plugin answered.
func TestKongClusterKeepsKongsCounts(t *testing.T) {
	up := StartUpstream(t)
	pg := StartPostgres(t)
	k := Start(t, Options{Extra: defaultLogLevel, Postgres: pg})
	call := k.AdminWant
	ctx := context.Background()
	db, err := pgx.Connect(ctx, pg.DSN("kong"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	const client = "198.51.100.50"
	counted := func(want int64) {
		t.Helper()
		var got int64
		waitfor.TrueEvery(t, 20*time.Second, 50*time.Millisecond, "the hour's row of "+client+" in ratelimiting_metrics at "+strconv.FormatInt(want, 10), func() bool {
			got = 0
			_ = db.QueryRow(ctx, `SELECT COALESCE(SUM(value), 0) FROM ratelimiting_metrics WHERE identifier = $1 AND period = 'hour'
				AND period_date = date_trunc('hour', now())`, client).Scan(&got)
			return got == want
		})
	}
	answeredBy := func(limit string) {
		t.Helper()
		everyWorker(t, k, "X-RateLimit-Limit-Hour "+limit, "/cl", func() []string { return []string{probeClient()} },
			func(a Answer) bool { return a.Headers.Get("X-Ratelimit-Limit-Hour") == limit })
	}
	request := func() string {
		a := k.GetOnce("/cl", "X-Forwarded-For: "+client)
		return strconv.Itoa(a.Status) + "/" + a.Headers.Get("X-Ratelimit-Remaining-Hour")
	}
	call(201, "POST", "/services", map[string]any{"name": "cl", "url": up.URL})
	call(201, "POST", "/services/cl/routes", map[string]any{"name": "cl", "paths": []string{"/cl"}})
	probeWorkers(k, "cl")
	config := func(hour int) map[string]any {
		return map[string]any{"hour": hour, "limit_by": "ip", "policy": "cluster", "fault_tolerant": false}
	}
	plugin := call(201, "POST", "/routes/cl/plugins", map[string]any{"name": "rate-limiting", "config": config(5)})
	answeredBy("5")
	notNearEnd(t, time.Hour, 60*time.Second)
	for i, want := range []string{"200/4", "200/3"} {
		if got := request(); got != want {
			t.Fatalf("Kong's plugin, request %d: %s, want %s", i+1, got, want)
		}
		counted(int64(i + 1)) // Kong counts in a timer after the response
	}

	call(204, "DELETE", "/plugins/"+plugin["id"].(string), nil)
	plugin = call(201, "POST", "/routes/cl/plugins", map[string]any{"name": "tollgate", "config": config(6)})
	answeredBy("6")
	for i, want := range []string{"200/3", "200/2", "200/1", "200/0", "429/0"} {
		if got := request(); got != want {
			t.Fatalf("tollgate after Kong's 2, request %d: %s, want %s", i+1, got, want)
		}
	}
	counted(6) // the denial counts nothing
	keysShowsTheRows(t, k, plugin, client)

	call(204, "DELETE", "/plugins/"+plugin["id"].(string), nil)
	call(201, "POST", "/routes/cl/plugins", map[string]any{"name": "rate-limiting", "config": config(7)})
	answeredBy("7")
	if got := request(); got != "200/0" {
		t.Fatalf("Kong's plugin after tollgate's 6 of 7: %s, want 200/0", got)
	}
	counted(7)
	if got := request(); got != "429/0" {
		t.Fatalf("Kong's plugin at 7 of 7: %s, want 429/0", got)
	}
}

// keysShowsTheRows: the keys command reads a key's usage from Kong's rows
// given the plugin as Kong's Admin API returns it and the Kong whose
// database they are in (--kong-prefix); without the prefix it says what
// it needs.
func keysShowsTheRows(t *testing.T, k *Kong, plugin map[string]any, client string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "plugin.json")
	b, err := json.Marshal(plugin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(PluginDir(t), "tollgate")
	out, err := exec.Command(bin, "keys", "show", "--plugin", file, "--kong-prefix", k.Prefix, "--key", client).Output()
	var shown struct {
		Limits []struct {
			Limit       string
			Used, Count int64
		}
	}
	if err != nil || json.Unmarshal(out, &shown) != nil || len(shown.Limits) != 1 ||
		shown.Limits[0].Limit != "hour" || shown.Limits[0].Used != 6 || shown.Limits[0].Count != 6 {
		t.Fatalf("keys show --kong-prefix on policy cluster: %v\n%s\nwant the hour's 6 of 6", err, out)
	}
	cmd := exec.Command(bin, "keys", "show", "--plugin", file, "--key", client)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); cmd.ProcessState.ExitCode() != 1 || !strings.Contains(stderr.String(), "--kong-prefix") {
		t.Errorf("keys show on policy cluster without --kong-prefix: %v %q, want exit 1 naming --kong-prefix", err, stderr.String())
	}
}

// TestKongClusterRefusedWithoutDatabase: a DB-less Kong has no cluster
// policy. Its query command (docs/kong.md's line, with -kong-prefix)
// dumps a schema without it, as Kong's rate-limiting's schema is there, so
// Kong refuses a declarative config that asks for it, naming the field,
// in the words it uses for its own plugin; a dump without -kong-prefix
// keeps cluster.
func TestKongClusterRefusedWithoutDatabase(t *testing.T) {
	up := StartUpstream(t)
	k := Start(t, Options{Extra: defaultLogLevel})
	out, err := exec.Command(filepath.Join(PluginDir(t), "tollgate"), "-dump", "-kong-prefix", k.Prefix).Output()
	if err != nil {
		t.Fatal(err)
	}
	if s := string(out); !strings.Contains(s, `"one_of":["local","redis"]`) || strings.Contains(s, `"cluster"`) {
		t.Errorf("-dump for a DB-less Kong offers policy cluster:\n%s", s)
	}
	if out, _ = exec.Command(filepath.Join(PluginDir(t), "tollgate"), "-dump").Output(); !strings.Contains(string(out), `"one_of":["local","cluster","redis"]`) {
		t.Errorf("-dump without -kong-prefix leaves cluster out:\n%s", out)
	}
	bodies := map[string]string{}
	for _, plugin := range []string{"rate-limiting", "tollgate"} {
		d := NewDeclarative("/probe-cluster")
		d.AddService(map[string]any{"name": "cl", "url": up.URL, "routes": []any{map[string]any{"name": "cl", "paths": []string{"/cl"},
			"plugins": []any{map[string]any{"name": plugin, "config": map[string]any{"minute": 5, "policy": "cluster"}}}}}})
		status, body := k.LoadConfig(d)
		if status != 400 || !strings.Contains(string(body), `expected one of: local, redis`) {
			t.Errorf("%s on policy cluster, DB-less: /config answered %d %s, want 400 naming config.policy", plugin, status, body)
		}
		bodies[plugin] = strings.ReplaceAll(string(body), plugin, "<plugin>")
	}
	if bodies["rate-limiting"] != bodies["tollgate"] {
		t.Errorf("Kong's words differ:\n  rate-limiting: %s\n  tollgate:      %s", bodies["rate-limiting"], bodies["tollgate"])
	}
}
