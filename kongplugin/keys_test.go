package kongplugin_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/admin"
	"github.com/tollgate/tollgate/internal/kongproc"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// keys runs the plugin binary's keys command and decodes its JSON answer
// (a list comes as "list"); it fails the test unless the command exits
// with want.
func keys(t *testing.T, want int, args ...string) (map[string]any, string) {
	t.Helper()
	cmd := exec.Command(kongproc.Binary(t), append([]string{"keys"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, _ := cmd.Output()
	if code := cmd.ProcessState.ExitCode(); code != want {
		t.Fatalf("tollgate keys %s: exit %d, want %d\n%s%s", strings.Join(args, " "), code, want, out, stderr.String())
	}
	var v any
	if want == 0 {
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("tollgate keys %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if m, ok := v.(map[string]any); ok {
		return m, stderr.String()
	}
	return map[string]any{"list": v}, stderr.String()
}

// used returns "<limit>:<used>/<count>" for each limit of a keys show answer.
func used(v map[string]any) string {
	var parts []string
	for _, l := range v["limits"].([]any) {
		m := l.(map[string]any)
		parts = append(parts, fmt.Sprintf("%v:%v/%v", m["limit"], m["used"], m["count"]))
	}
	return strings.Join(parts, " ")
}

// pluginFile writes the plugin entity as Kong's Admin API returns it (GET
// /plugins/{id}) for the config fields, attached to kongConfig's route and
// service, and returns its path.
func pluginFile(t *testing.T, fields map[string]any) string {
	config := kongConfig(fields)
	for _, attached := range []string{"route_id", "service_id", "consumer_id", "__plugin_id"} {
		delete(config, attached)
	}
	entity := map[string]any{"id": "plugin-1", "name": "tollgate", "config": config,
		"route": map[string]any{"id": "route-1"}, "service": map[string]any{"id": "service-1"}, "consumer": nil}
	b, err := json.Marshal(entity)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "plugin.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKongKeysCommand: an operator pastes the plugin as Kong's Admin API
// shows it and reads a key's usage from Redis (reading changes nothing),
// resets one limit, then resets the key while eight clients hammer it: the
// key gets exactly one fresh quota. The plugin server's opt-in admin socket
// shows the keys it denied most, hashed, and the sampled denial log stays
// bounded under the flood.
func TestKongKeysCommand(t *testing.T) {
	rs := redistest.StartT(t)
	socket := filepath.Join(t.TempDir(), "admin.sock")
	node := kongproc.StartEnv(t, admin.SocketEnv+"="+socket)
	fields := map[string]any{"minute": 5, "hour": 100, "algorithm": "sliding_log", "policy": "redis",
		"redis": rs.KongRecord(), "limit_by": "ip", "log_denials": 2}
	c := node.Dial()
	defer c.Close()
	id := start(t, c, fields)
	const ip = "203.0.113.7"
	for i := 0; i < 3; i++ {
		if res := access(t, c, id, kongproc.Request{ForwardedIP: ip}); res.Exited {
			t.Fatalf("request %d refused: %d", i+1, res.Status)
		}
	}
	plugin := pluginFile(t, fields)
	for i := 0; i < 2; i++ { // reading twice sees the same: reading changes nothing
		v, _ := keys(t, 0, "show", "--plugin", plugin, "--key", ip)
		if got := used(v); got != "minute:3/5 hour:3/100" || v["key"] != core.KeyHash(ip) || v["policy"] != "route=route-1,service=service-1" {
			t.Fatalf("keys show: %s key %v policy %v; want minute:3/5 hour:3/100, the key hashed, the route's scope", got, v["key"], v["policy"])
		}
	}
	keys(t, 0, "reset", "--plugin", plugin, "--key", ip, "--limit", "minute")
	if v, _ := keys(t, 0, "show", "--plugin", plugin, "--key", ip); used(v) != "minute:0/5 hour:3/100" {
		t.Fatalf("after resetting the minute: %s", used(v))
	}
	if _, stderr := keys(t, 2, "show", "--key", ip); !strings.Contains(stderr, "--plugin or --socket") {
		t.Fatalf("no source: %q", stderr)
	}
	if _, stderr := keys(t, 1, "reset", "--plugin", plugin, "--key", ip, "--limit", "week"); !strings.Contains(stderr, `limit "week": policy "tollgate" has minute, hour`) {
		t.Fatalf("an unknown limit: %q", stderr)
	}

	// Eight clients hammer the key; once it is refused, the operator resets
	// it. Exactly 5 are allowed before and 5 after.
	var allowed, refused atomic.Int64
	stop := hammer(node, id, 8, kongproc.Request{ForwardedIP: ip}, func(_ time.Time, res *kongproc.Result, err error) {
		switch {
		case err != nil:
			t.Error(err)
		case res.Exited:
			refused.Add(1)
		default:
			allowed.Add(1)
		}
	})
	waitfor.True(t, 20*time.Second, "the key refused", func() bool { return refused.Load() > 50 })
	before := allowed.Load()
	keys(t, 0, "reset", "--plugin", plugin, "--key", ip)
	// The server's deny cache asks Redis again within a second.
	waitfor.True(t, 20*time.Second, "the fresh quota used", func() bool { return allowed.Load() >= before+5 })
	settled := refused.Load()
	waitfor.True(t, 20*time.Second, "more refusals after the fresh quota", func() bool { return refused.Load() > settled+200 })
	stop()
	if before != 5 || allowed.Load() != 10 {
		t.Fatalf("allowed %d before the reset and %d in all; want exactly 5 and 10", before, allowed.Load())
	}

	// The plugin server's socket: the policies in force, the keys denied
	// most (hashed), and a key's usage as the server reads it.
	pols, _ := keys(t, 0, "policies", "--socket", socket)
	if s := fmt.Sprint(pols); !strings.Contains(s, "name:route=route-1,service=service-1") || !strings.Contains(s, "store:redis") {
		t.Fatalf("policies over the socket: %s", s)
	}
	top, _ := keys(t, 0, "top", "--socket", socket, "--policy", "route=route-1,service=service-1")
	heavy := top["top_denied"].([]any)
	if len(heavy) != 1 || heavy[0].(map[string]any)["key"] != core.KeyHash(ip) || heavy[0].(map[string]any)["denials"].(float64) < float64(refused.Load())/2 {
		t.Fatalf("top over the socket: %v; want %s with most of the %d denials", heavy, core.KeyHash(ip), refused.Load())
	}
	// After the reset of every limit, 5 were allowed.
	if v, _ := keys(t, 0, "show", "--socket", socket, "--policy", "route=route-1,service=service-1", "--key", ip); used(v) != "minute:5/5 hour:5/100" {
		t.Fatalf("over the socket: %s; want minute:5/5 hour:5/100", used(v))
	}

	// Each subcommand refuses what it does not use, and a missing --key,
	// as bad usage (exit 2), naming the flag.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"show", "--socket", socket}, "keys show: --key is required"},
		{[]string{"show", "--socket", socket, "--key", ip, "--limit", "minute"}, "keys show: --limit is not one of its flags"},
		{[]string{"reset", "--socket", socket, "--key", ip, "--plan", "free"}, "keys reset: --plan is not one of its flags"},
		{[]string{"policies", "--socket", socket, "--key", ip}, "keys policies: --key is not one of its flags"},
		// Said in words, without a Go value (it printed "(<nil>)").
		{[]string{"show", "--key", ip}, "keys show: give --plugin or --socket (--plugin FILE: the plugin's config as Kong stores it"},
		{[]string{"show", "--socket", socket, "--plugin", "x.json", "--key", ip}, "keys show: give --plugin or --socket, not both"},
		{[]string{"show", "--socket", socket, "stray"}, `keys show: "stray" is not a flag`},
	} {
		_, stderr := keys(t, 2, tc.args...)
		if !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "<nil>") {
			t.Errorf("keys %v: %q, want %q", tc.args, stderr, tc.want)
		}
	}

	// log_denials 2: a few lines a second, however many were refused.
	lines := strings.Count(node.Log(), "tollgate: rate limited")
	if lines == 0 || lines > 2*20 {
		t.Fatalf("%d denial lines for %d denials; want at most 2 a second", lines, refused.Load())
	}
	// Each names the instance as the keys command does.
	if named := strings.Count(node.Log(), `scope="route=route-1,service=service-1"`); named != lines {
		t.Errorf("%d of %d denial lines name the instance's scope as keys does:\n%s", named, lines, node.Log())
	}
	t.Logf("%d allowed, %d refused; %d denial lines logged", allowed.Load(), refused.Load(), lines)
}

// TestKongKeysLocalPolicy: policy local keeps counters in the plugin
// server's memory. The keys command says so when given the plugin, and
// reads and resets them through the opt-in admin socket.
func TestKongKeysLocalPolicy(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "admin.sock")
	node := kongproc.StartEnv(t, admin.SocketEnv+"="+socket)
	fields := map[string]any{"minute": 2, "limit_by": "header", "header_name": "X-Api-Key", "namespace": "team", "clear_keys": true}
	c := node.Dial()
	defer c.Close()
	id := start(t, c, fields)
	req := kongproc.Request{Headers: map[string][]string{"X-Api-Key": {"acme"}}}
	for i, want := range []bool{false, false, true} {
		if res := access(t, c, id, req); res.Exited != want {
			t.Fatalf("request %d: exited %v", i+1, res.Exited)
		}
	}
	if _, stderr := keys(t, 1, "show", "--plugin", pluginFile(t, fields), "--key", "acme"); !strings.Contains(stderr, "policy local keeps its counters in the plugin server's memory") {
		t.Fatalf("local policy from the plugin file: %q", stderr)
	}
	v, _ := keys(t, 0, "show", "--socket", socket, "--policy", "ns=team", "--key", "acme")
	if used(v) != "2/1m:2/2" && used(v) != "minute:2/2" || v["key"] != "acme" {
		t.Fatalf("over the socket: %s key %v; want 2 of 2 used, the key in clear", used(v), v["key"])
	}
	keys(t, 0, "reset", "--socket", socket, "--policy", "ns=team", "--key", "acme")
	if res := access(t, c, id, req); res.Exited {
		t.Fatalf("refused after the reset: %d", res.Status)
	}
	if _, stderr := keys(t, 1, "show", "--socket", socket, "--policy", "nope", "--key", "acme"); !strings.Contains(stderr, `policy "nope": not in force`) {
		t.Fatalf("unknown policy: %q", stderr)
	}
}

// TestKongKeysRefusesNonConfigs: a plugin file that holds no config (null,
// a list, a plugin entity whose config is null) is refused with the reason,
// exit 1, and never panics the command.
func TestKongKeysRefusesNonConfigs(t *testing.T) {
	for _, body := range []string{`null`, `[]`, `{"name": "tollgate", "config": null}`, `"minute"`} {
		path := filepath.Join(t.TempDir(), "plugin.json")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, stderr := keys(t, 1, "show", "--plugin", path, "--key", "k")
		if strings.Contains(stderr, "panic") || !strings.Contains(stderr, "not a plugin or its config") && !strings.Contains(stderr, "config: expected a record") {
			t.Errorf("plugin file %s: %q; want a refusal naming the config", body, stderr)
		}
	}
}
