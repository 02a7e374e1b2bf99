//go:build kongreal

package kongreal

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// The tests of this file run Kong as operators do: at Kong's default
// log_level (notice), where a plugin server's own output (written at
// info) does not show.
var defaultLogLevel = append(slices.Clone(realIP), "log_level = notice")

// TestKongPanicCostsOneEvent: a panic in the plugin (planted by the tests'
// tollgate_testpanic build, plantedpanic_on.go) costs the request it
// happened in: a 500 as Kong answers a Lua plugin's error, one [error]
// line in Kong's log at its default level naming the plugin, the phase and
// the code that panicked, and nothing else: the same plugin-server process
// goes on, with its counters and its other instances.
func TestKongPanicCostsOneEvent(t *testing.T) {
	dir := t.TempDir()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"build", "-tags", "tollgate_testpanic", "-o", filepath.Join(dir, "tollgate-panicky")}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./kongplugin/cmd/tollgate")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the planted panic: %v\n%s", err, out)
	}
	up := StartUpstream(t)
	k := Start(t, Options{Extra: defaultLogLevel, Servers: map[string]string{"tollgate-panicky": filepath.Join(dir, "tollgate-panicky")}})
	d := NewDeclarative("/probe-panic")
	for _, route := range []struct {
		name   string
		config map[string]any
	}{
		{"panic", map[string]any{"minute": 100, "limit_by": "ip", "namespace": "planted-panic"}},
		{"calm", map[string]any{"minute": 3, "limit_by": "ip"}},
	} {
		d.AddService(map[string]any{"name": route.name, "url": up.URL, "routes": []any{map[string]any{
			"name": route.name, "paths": []string{"/" + route.name}, "plugins": []any{map[string]any{"name": "tollgate-panicky", "config": route.config}}}}})
	}
	k.MustLoad(d)
	notNearMinuteEnd(t, 15*time.Second)
	before := k.ErrorLog()
	calm := func(want string) {
		t.Helper()
		a := k.Get("/calm", "X-Forwarded-For: 198.51.100.70")
		if got := fmt.Sprintf("%d/%s", a.Status, a.Headers.Get("X-Ratelimit-Remaining-Minute")); got != want {
			t.Errorf("/calm: %s, want %s", got, want)
		}
	}
	calm("200/2")
	_, servers := k.Processes(dir)
	for i := 0; i < 3; i++ {
		a := k.Get("/panic", "X-Forwarded-For: 198.51.100.71")
		if a.Status != 500 || !strings.Contains(a.Body, "An unexpected error occurred") {
			t.Errorf("/panic request %d: %s, want Kong's 500", i+1, a)
		}
	}
	calm("200/1") // the same process, its count kept
	if _, now := k.Processes(dir); !slices.Equal(now, servers) {
		t.Errorf("plugin server processes %v after the panics, were %v", now, servers)
	}
	logged := strings.TrimPrefix(k.ErrorLog(), before)
	var panics []string
	for _, line := range strings.Split(logged, "\n") {
		if strings.Contains(line, "panic in the access phase") {
			panics = append(panics, line)
		}
	}
	if len(panics) == 0 || len(panics) > 2 || !strings.Contains(panics[0], "[error]") ||
		!strings.Contains(panics[0], "tollgate-panicky: panic in the access phase of instance") || !strings.Contains(panics[0], "plantedPanic") {
		t.Errorf("Kong's log at its default level has %d panic lines, want one or two (a line a second at most) at [error] naming the plugin, phase and code:\n%s", len(panics), logged)
	}
}

// TestKongRefusalSeenAtDefaultLevel: a window Kong's schema language can
// check is refused by Kong's Admin API, naming the field; one only the
// plugin server can refuse reaches Kong's log at [error] at its default
// log level, once per instance (a worker each), naming the plugin, its
// route and service, the field and the reason, and every request gets
// Kong's 500.
func TestKongRefusalSeenAtDefaultLevel(t *testing.T) {
	up := StartUpstream(t)
	k := Start(t, Options{Extra: defaultLogLevel})
	config := func(limit map[string]any) Declarative {
		d := NewDeclarative("/probe-refused")
		d.AddService(map[string]any{"name": "refused", "url": up.URL, "routes": []any{map[string]any{
			"name": "refused", "paths": []string{"/refused"}, "plugins": []any{map[string]any{"name": "tollgate",
				"config": map[string]any{"limits": []any{limit}}}}}}})
		return d
	}
	for _, window := range []string{"10x", "1m30"} {
		status, body := k.LoadConfig(config(map[string]any{"count": 5, "window": window}))
		if status != 400 || !strings.Contains(string(body), "not a duration ("+algo.DurationExamples+")") || !strings.Contains(string(body), "window") {
			t.Errorf("a window of %s at /config: %d %s, want 400 naming the field and the reason", window, status, body)
		}
	}
	// Each field right, together out of range: only Go can tell.
	k.MustLoad(config(map[string]any{"count": 1_000_000_000, "window": "1d", "algorithm": "token_bucket"}))
	before := k.ErrorLog()
	for i := 0; i < 6; i++ {
		if a := k.Get("/refused"); a.Status != 500 || !strings.Contains(a.Body, "An unexpected error occurred") {
			t.Errorf("request %d to the refused config: %s, want Kong's 500", i+1, a)
		}
	}
	logged := strings.TrimPrefix(k.ErrorLog(), before)
	var lines []string
	for _, line := range strings.Split(logged, "\n") {
		if strings.Contains(line, "config refused") {
			lines = append(lines, line)
		}
	}
	route := k.ID("routes", "refused")
	if len(lines) == 0 || len(lines) > 2 {
		t.Fatalf("%d refusal lines for 6 requests, want one per worker's instance:\n%s", len(lines), logged)
	}
	for _, line := range lines {
		for _, want := range []string{"[error]", "tollgate (route=" + route, "limits[0]: burst: 1000000000 with window 1d is too fine-grained"} {
			if !strings.Contains(line, want) {
				t.Errorf("refusal line lacks %q:\n%s", want, line)
			}
		}
	}
	if strings.Contains(logged, "starting instance") {
		t.Errorf("Kong logged a failed instance start:\n%s", logged)
	}

	// What Kong's plugin refuses with Lua and tollgate takes (periods out
	// of order) is told at [warn], also above the default level.
	d := NewDeclarative("/probe-order")
	d.AddService(map[string]any{"name": "order", "url": up.URL, "routes": []any{map[string]any{
		"name": "order", "paths": []string{"/order"}, "plugins": []any{map[string]any{"name": "tollgate",
			"config": map[string]any{"second": 20, "hour": 10}}}}}})
	k.MustLoad(d)
	before = k.ErrorLog()
	for i := 0; i < 4; i++ {
		if a := k.Get("/order"); a.Status != 200 {
			t.Errorf("request %d, periods out of order: %s, want it served", i+1, a)
		}
	}
	logged = strings.TrimPrefix(k.ErrorLog(), before)
	if !strings.Contains(logged, "[warn]") || !strings.Contains(logged, "The limit for hour(10.0) cannot be lower than the limit for second(20.0) in Kong's rate-limiting; tollgate enforces each period") {
		t.Errorf("periods out of order: Kong's log at its default level lacks the warning:\n%s", logged)
	}
}

// TestKongIdleKeysCostRedisNothing: tollgate on policy redis with
// sync_rate (eventual mode) in real Kong: 1,000 keys used once, then no
// traffic: Redis soon sees no command at all from the node (the unit test
// TestEventualIdleKeysCostNothing counts 10 to 100,000 keys exactly).
func TestKongIdleKeysCostRedisNothing(t *testing.T) {
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	k := Start(t, Options{Extra: defaultLogLevel})
	d := NewDeclarative("/probe-idle")
	d.AddService(map[string]any{"name": "idle", "url": up.URL, "routes": []any{map[string]any{
		"name": "idle", "paths": []string{"/idle"}, "plugins": []any{map[string]any{"name": "tollgate",
			"config": map[string]any{"hour": 100, "limit_by": "header", "header_name": "X-Key", "policy": "redis", "redis": rds.KongRecord(), "sync_rate": 1}}}}}})
	k.MustLoad(d)
	for i := 0; i < 1000; i++ {
		if a := k.Get("/idle", fmt.Sprintf("X-Key: k%d", i)); a.Status != 200 {
			t.Fatalf("key %d: %s", i, a)
		}
	}
	// Each sync of the keys used before it, then none. Before, each of the
	// 1,000 keys cost two commands a second until its hour ended.
	redisGoesIdle(t, rds)
}

// redisGoesIdle waits, 15 s at most, for a second in which rds processes
// nothing but the test's own INFO.
func redisGoesIdle(t *testing.T, rds *redistest.Server) {
	t.Helper()
	last, err := rds.CommandsProcessed()
	if err != nil {
		t.Fatal(err)
	}
	waitfor.TrueEvery(t, 15*time.Second, time.Second, "a second with no Redis command from Kong's node", func() bool {
		n, err := rds.CommandsProcessed()
		if err != nil {
			t.Fatal(err)
		}
		idle := n-last == 1
		last = n
		return idle
	})
}

// TestKongConfigChurn: Kong as a deploy pipeline runs it, a new config
// every few seconds. 1,000 config changes, each replacing tollgate's
// instances (its limit changes), with a request of a new key on each of
// two routes after each: the plugin servers' memory stays flat (each
// closed instance gave back what it held; 100 changes in, and 900 more,
// within 25%), and once the traffic stops Redis soon sees no command from
// the node, however many configs and keys came before.
func TestKongConfigChurn(t *testing.T) {
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	k := Start(t, Options{Extra: defaultLogLevel})
	bin := PluginDir(t)
	config := func(i int) Declarative {
		d := NewDeclarative(fmt.Sprintf("/probe-churn-%d", i))
		d.AddService(map[string]any{"name": "churn", "url": up.URL, "routes": []any{
			map[string]any{"name": "churn-redis", "paths": []string{"/churn-redis"}, "plugins": []any{map[string]any{"name": "tollgate",
				"config": map[string]any{"hour": 1000 + i, "limit_by": "header", "header_name": "X-Key", "policy": "redis", "redis": rds.KongRecord(), "sync_rate": 1}}}},
			map[string]any{"name": "churn-local", "paths": []string{"/churn-local"}, "plugins": []any{map[string]any{"name": "tollgate",
				"config": map[string]any{"minute": 1000 + i, "limit_by": "header", "header_name": "X-Key"}}}},
		}})
		return d
	}
	rss := func() int64 {
		_, servers := k.Processes(bin)
		var total int64
		for _, pid := range servers {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
					var kb int64
					fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kb)
					total += kb
				}
			}
		}
		return total
	}
	var warm int64
	const changes, warmUp = 1000, 100
	for i := 0; i < changes; i++ {
		k.MustLoad(config(i))
		for _, path := range []string{"/churn-redis", "/churn-local"} {
			if a := k.Get(path, fmt.Sprintf("X-Key: c%d", i)); a.Status != 200 {
				t.Fatalf("change %d, %s: %s", i, path, a)
			}
		}
		if i == warmUp {
			warm = rss()
		}
	}
	after := rss()
	t.Logf("plugin servers' RSS: %d kB after %d config changes, %d kB after %d", warm, warmUp, after, changes)
	if after > warm*5/4 {
		t.Errorf("plugin servers' RSS grew from %d to %d kB over %d more config changes, want within 25%%", warm, after, changes-warmUp)
	}
	redisGoesIdle(t, rds)
}

// TestKongDBMode: Kong on Postgres, as most operators run it: tollgate
// created, PATCHed and deleted through the Admin API (see
// adminAPILifecycle).
func TestKongDBMode(t *testing.T) {
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	k := Start(t, Options{Extra: defaultLogLevel, Postgres: StartPostgres(t)})
	adminAPILifecycle(t, k, k, up, rds)
}

// TestKongHybrid: a control plane on Postgres and a data plane, each
// with tollgate's plugin servers registered, certificates from `kong
// hybrid gen_cert`: tollgate configured on the control plane decides on
// the data plane (see adminAPILifecycle).
func TestKongHybrid(t *testing.T) {
	up := StartUpstream(t)
	rds := redistest.StartT(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cluster.crt"), filepath.Join(dir, "cluster.key")
	if out, err := exec.Command(Binary(t), "hybrid", "gen_cert", cert, key).CombinedOutput(); err != nil {
		t.Fatalf("kong hybrid gen_cert: %v\n%s", err, out)
	}
	ports, err := redistest.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	certs := []string{"cluster_cert = " + cert, "cluster_cert_key = " + key}
	cp := Start(t, Options{Postgres: StartPostgres(t), ControlPlane: true, Extra: append(append(slices.Clone(defaultLogLevel), certs...), "role = control_plane",
		fmt.Sprintf("cluster_listen = 127.0.0.1:%d", ports[0]), fmt.Sprintf("cluster_telemetry_listen = 127.0.0.1:%d", ports[1]))})
	dp := Start(t, Options{DataPlane: true, Extra: append(append(slices.Clone(defaultLogLevel), certs...), "role = data_plane", "lua_ssl_trusted_certificate = "+cert,
		fmt.Sprintf("cluster_control_plane = 127.0.0.1:%d", ports[0]), fmt.Sprintf("cluster_telemetry_endpoint = 127.0.0.1:%d", ports[1]))})
	adminAPILifecycle(t, cp, dp, up, rds)
}

// adminAPILifecycle configures tollgate through admin's Admin API and
// checks it on proxy's traffic: created (eventual mode on rds), it
// decides; a PATCH to a new limit replaces the instances and keeps the
// counters; deleted, it stops deciding, and its syncing stops costing
// Redis anything.
func adminAPILifecycle(t *testing.T, admin, proxy *Kong, up *Upstream, rds *redistest.Server) {
	t.Helper()
	call := admin.AdminWant
	call(201, "POST", "/services", map[string]any{"name": "managed", "url": up.URL})
	call(201, "POST", "/services/managed/routes", map[string]any{"name": "managed", "paths": []string{"/managed"}})
	probeWorkers(admin, "managed")
	plugin := call(201, "POST", "/routes/managed/plugins", map[string]any{"name": "tollgate", "config": map[string]any{
		"hour": 5, "limit_by": "header", "header_name": "X-Key", "policy": "redis", "redis": rds.KongRecord(), "sync_rate": 1}})
	id, _ := plugin["id"].(string)
	limitIs := func(want string) {
		t.Helper()
		everyWorker(t, proxy, "deciding with X-RateLimit-Limit-Hour "+want, "/managed", func() []string { return []string{"X-Key: probe"} },
			func(a Answer) bool { return a.Headers.Get("X-Ratelimit-Limit-Hour") == want })
	}
	limitIs("5")
	notNearEnd(t, time.Hour, 30*time.Second)
	remaining := func() string {
		a := proxy.GetOnce("/managed", "X-Key: a")
		return fmt.Sprintf("%d/%s", a.Status, a.Headers.Get("X-Ratelimit-Remaining-Hour"))
	}
	if got := fmt.Sprint(remaining(), " ", remaining()); got != "200/4 200/3" {
		t.Fatalf("two requests of key a: %s, want 200/4 200/3", got)
	}
	call(200, "PATCH", "/plugins/"+id, map[string]any{"config": map[string]any{"hour": 6}})
	limitIs("6")
	if got := remaining(); got != "200/3" {
		t.Errorf("after the PATCH to 6 an hour: %s, want 200/3 (the 2 used kept)", got)
	}
	call(204, "DELETE", "/plugins/"+id, nil)
	limitIs("")
	if a := proxy.GetOnce("/managed", "X-Key: a"); a.Status != 200 {
		t.Errorf("after the DELETE: %s, want the route served without a limit", a)
	}
	redisGoesIdle(t, rds)
}

// TestKongPluginServerCheckSeenAtDefaultLevel: Kong's workers run as
// nobody, who may neither create a socket in the prefix nor run the plugin
// servers' programs, so no plugin server can start. Kong's own log says
// only "terminated: exit 1" at its default level, the reason being at info;
// tollgate's query command (-dump, run by Kong's master as root at each
// start) writes what is wrong and the fix at [error] for each of the three
// plugin servers. With the fixes it names applied, the servers start, the
// checks are silent, and a route with tollgate is served.
func TestKongPluginServerCheckSeenAtDefaultLevel(t *testing.T) {
	prefix, err := os.MkdirTemp("", "kong-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(prefix) })
	if err := os.Chmod(prefix, 0o755); err != nil { // nobody may pass, not write
		t.Fatal(err)
	}
	bin := PluginDir(t) // a temporary directory: root's alone
	extra := append(slices.Clone(defaultLogLevel), "nginx_user = nobody nogroup")
	k := Start(t, Options{Prefix: prefix, Extra: extra, ServersDown: true})
	logged := k.ErrorLog()
	for _, cmd := range Commands {
		for _, want := range []string{
			"[error]", "[" + cmd + "] plugin server check: nobody may not create " + filepath.Join(prefix, cmd+".socket"),
			"fix: chgrp nogroup " + prefix + " && chmod g+ws " + prefix,
			"[" + cmd + "] plugin server check: pluginserver_" + strings.ReplaceAll(cmd, "-", "_") + "_start_cmd: nobody may not run " + filepath.Join(bin, cmd),
		} {
			if !strings.Contains(logged, want) {
				t.Errorf("Kong's log at its default level lacks %q:\n%s", want, logged)
			}
		}
	}
	k.Stop()
	if err := os.Truncate(filepath.Join(prefix, "logs", "error.log"), 0); err != nil { // the next start's lines alone
		t.Fatal(err)
	}

	// The fixes, as the lines give them (the programs' directory: chmod).
	if out, err := exec.Command("sh", "-c", "chgrp nogroup "+prefix+" && chmod g+ws "+prefix+" && chmod a+rx "+bin).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	up := StartUpstream(t)
	d := NewDeclarative("/probe-checked")
	d.AddService(map[string]any{"name": "checked", "url": up.URL, "routes": []any{map[string]any{
		"name": "checked", "paths": []string{"/checked"}, "plugins": []any{map[string]any{"name": "tollgate", "config": map[string]any{"minute": 5}}}}}})
	k = Start(t, Options{Prefix: prefix, Extra: extra})
	k.MustLoad(d)
	if a := k.Get("/checked"); a.Status != 200 || a.Headers.Get("X-RateLimit-Limit-Minute") != "5" {
		t.Errorf("after the fixes: %s, want served with tollgate's headers", a)
	}
	if logged := k.ErrorLog(); strings.Contains(logged, "plugin server check") {
		t.Errorf("the checks still complain after the fixes:\n%s", logged)
	}
}

// TestKongRefusalHealsAtDefaultLevel: Kong on Postgres, its workers as
// nobody, who may create the plugin servers' sockets in the prefix but
// not read the .kong_env Kong writes there (root's, 0640). A tollgate on
// policy cluster reads Kong's database settings from it, so its instance
// is refused, said at [error] with the reason. Once the file is readable,
// the instance starts by itself (no config change), says so at [notice],
// and counts in Kong's table.
func TestKongRefusalHealsAtDefaultLevel(t *testing.T) {
	prefix, err := os.MkdirTemp("", "kong-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(prefix) })
	if err := os.Chmod(prefix, 0o777); err != nil { // sockets yes; no setgid, so .kong_env stays root's
		t.Fatal(err)
	}
	if err := os.Chmod(PluginDir(t), 0o755); err != nil {
		t.Fatal(err)
	}
	up := StartUpstream(t)
	pg := StartPostgres(t)
	k := Start(t, Options{Prefix: prefix, Postgres: pg, Extra: append(slices.Clone(defaultLogLevel), "nginx_user = nobody nogroup")})
	k.AdminWant(201, "POST", "/services", map[string]any{"name": "heal", "url": up.URL})
	k.AdminWant(201, "POST", "/services/heal/routes", map[string]any{"name": "heal", "paths": []string{"/heal"}})
	probe := probeWorkers(k, "heal")
	k.AdminWant(201, "POST", "/routes/heal/plugins", map[string]any{"name": "tollgate",
		"config": map[string]any{"hour": 100, "limit_by": "ip", "policy": "cluster", "fault_tolerant": false}})
	// A worker rebuilds its plugins within worker_state_update_frequency
	// and serves the route without tollgate until then. The probe, changed
	// after tollgate was added, marks the answers of workers that rebuilt
	// since: those run tollgate, and must refuse.
	k.AdminWant(200, "PATCH", "/plugins/"+probe, map[string]any{"config": map[string]any{
		"header_filter": []string{probeWorker, `kong.response.set_header("X-Probe-Rebuilt", "yes")`}}})
	waitfor.True(t, 30*time.Second, "the refusal in Kong's log", func() bool {
		if a := k.GetOnce("/heal", probeClient()); a.Status != 500 && a.Status != 404 && a.Headers.Get("X-Probe-Rebuilt") != "" {
			t.Fatalf("while .kong_env is unreadable: %s, want Kong's 500", a)
		}
		return strings.Contains(k.ErrorLog(), "config refused, every request answered 500 until the cause is gone")
	})
	refused := k.ErrorLog()
	for _, want := range []string{"[error]", "policy: cluster: open " + filepath.Join(prefix, ".kong_env") + ": permission denied"} {
		if !strings.Contains(refused, want) {
			t.Errorf("Kong's log at its default level lacks %q:\n%s", want, refused)
		}
	}

	if err := os.Chmod(filepath.Join(prefix, ".kong_env"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each of Kong's workers has an instance of its own, which tries
	// again on its own, and either worker may take the next connection:
	// wait until each worker serves (each request from an address of its
	// own, so no quota runs out while they heal). The one whose instance
	// told the refusal told the return with its first served request.
	everyWorker(t, k, "tollgate serving once .kong_env is readable", "/heal", func() []string { return []string{probeClient()} },
		func(a Answer) bool { return a.Status == 200 && a.Headers.Get("X-RateLimit-Limit-Hour") == "100" })
	if !strings.Contains(k.ErrorLog(), "config in force again: what refused it is mended") {
		t.Errorf("Kong's log lacks the return of the instance that told the refusal:\n%s", k.ErrorLog())
	}
	for _, line := range strings.Split(k.ErrorLog(), "\n") {
		if strings.Contains(line, "config in force again") && !strings.Contains(line, "[notice]") {
			t.Errorf("the return is not at [notice]: %s", line)
		}
	}
}
