// Package kongreal runs real Kong Gateway (3.9) for tests: DB-less, on free
// loopback ports, with tollgate's three plugin servers registered with the
// very kong.conf lines docs/kong.md shows, and talks to its Admin API.
//
// Kong is the `kong` on PATH (or /usr/local/bin/kong, with OpenResty's
// nginx beside it); `make kong-test` installs one when there is none. Kong
// is started as its own Docker image starts it: `kong prepare` writes the
// prefix, then nginx runs in the foreground as this process's child, so a
// test binary that dies takes Kong (and the plugin servers its workers
// started) with it.
package kongreal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/internal/pgtest"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/reporoot"
)

// T is what the package needs of a test: *testing.T and *testing.B
// are one, and so is a benchmark command's own (bench/kongcompare).
type T interface {
	pgtest.T // Helper, Fatal, Fatalf, Cleanup
	Logf(format string, args ...any)
	TempDir() string
	Failed() bool
}

// openrestyPaths are where Kong's packages and images put OpenResty's
// resty and nginx; kong's own launcher needs both on PATH.
var openrestyPaths = []string{"/usr/local/openresty/bin", "/usr/local/openresty/nginx/sbin"}

// Binary returns the kong command to run, or fails the test saying how to
// get one.
func Binary(t T) string {
	t.Helper()
	path := os.Getenv("PATH")
	for _, p := range openrestyPaths {
		if !strings.Contains(path, p) {
			path = path + ":" + p
		}
	}
	os.Setenv("PATH", path)
	k, err := exec.LookPath("kong")
	if err != nil {
		t.Fatal("no kong on PATH: run `make kong-test` (it installs Kong 3.9.3 when none is there) or install Kong 3.9")
	}
	out, err := exec.Command(k, "version").CombinedOutput()
	if err != nil || !bytes.HasPrefix(bytes.TrimSpace(out), []byte("3.9")) {
		t.Fatalf("%s version: %q %v: these tests are written against Kong 3.9", k, out, err)
	}
	return k
}

// Version is what `kong version` says of the Kong the tests run.
func Version(t T) string {
	out, err := exec.Command(Binary(t), "version").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// Commands are the plugin servers tollgate ships for Kong, by the name Kong
// knows each under (go-pdk names a plugin after its executable).
var Commands = []string{"tollgate", "tollgate-response", "tollgate-response-ratelimiting"}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// PluginDir builds the three plugin server commands once per test process
// (as a user builds them: `go build -o DIR ./kongplugin/cmd/...`, with the
// race detector when the tests have it) and returns the directory they are
// in.
func PluginDir(t T) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		binDir, buildErr = os.MkdirTemp("", "tollgate-kong-bin")
		if buildErr != nil {
			return
		}
		args := []string{"build", "-o", binDir + "/"}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./kongplugin/cmd/...")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./kongplugin/cmd/...: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// RemovePluginDir removes what PluginDir built; a test process calls it
// after its tests (TestMain), a program before it exits.
func RemovePluginDir() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// RepoRoot is the checkout's root (reporoot.Dir).
func RepoRoot() (string, error) { return reporoot.Dir() }

// DocPrefix and DocBinDir are the prefix and the install directory the
// kong.conf lines in docs/kong.md are written for; the tests put their own
// in their place and nothing else.
const (
	DocPrefix = "/usr/local/kong"
	DocBinDir = "/usr/local/bin"
)

var docLine = regexp.MustCompile(`^(plugins|pluginserver_[a-z_]+)\s*=\s*(.+)$`)

// Registration is the kong.conf lines that register tollgate's plugin
// servers, read from docs/kong.md's code blocks: every
// pluginserver_<name>_start_cmd and _query_cmd line as the page writes it,
// the union of its pluginserver_names lines, and a plugins line of bundled
// and those names. It fails the test when the page registers a name it
// gives no command for, or a command for a name it never registers.
func Registration(t T) []string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "kong.md"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	cmds := map[string]string{}
	var order []string
	inBlock := false
	sc := bufio.NewScanner(bytes.NewReader(page))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "```") {
			inBlock = !inBlock
			continue
		}
		m := docLine.FindStringSubmatch(line)
		if !inBlock || m == nil {
			continue
		}
		switch key, value := m[1], m[2]; {
		case key == "pluginserver_names":
			for _, n := range strings.Split(value, ",") {
				if n = strings.TrimSpace(n); !slices.Contains(names, n) {
					names = append(names, n)
				}
			}
		case key == "plugins":
		default:
			if prev, ok := cmds[key]; ok && prev != value {
				t.Fatalf("docs/kong.md: %s is written two ways: %q and %q", key, prev, value)
			}
			if _, ok := cmds[key]; !ok {
				order = append(order, key)
			}
			cmds[key] = value
		}
	}
	for _, n := range names {
		for _, suffix := range []string{"_start_cmd", "_query_cmd"} {
			key := "pluginserver_" + strings.ReplaceAll(n, "-", "_") + suffix
			if _, ok := cmds[key]; !ok {
				t.Fatalf("docs/kong.md registers %s in pluginserver_names but shows no %s line", n, key)
			}
		}
	}
	for _, key := range order {
		n := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(key, "pluginserver_"), "_start_cmd"), "_query_cmd")
		if !slices.Contains(names, strings.ReplaceAll(n, "_", "-")) {
			t.Fatalf("docs/kong.md shows %s for a plugin server no pluginserver_names line registers", key)
		}
	}
	for _, c := range Commands {
		if !slices.Contains(names, c) {
			t.Fatalf("docs/kong.md does not register the plugin server %s", c)
		}
	}
	lines := []string{"plugins = bundled," + strings.Join(names, ","), "pluginserver_names = " + strings.Join(names, ",")}
	for _, key := range order {
		lines = append(lines, key+" = "+cmds[key])
	}
	return lines
}

// Options shape one Kong.
type Options struct {
	// Declarative is the DB-less config Kong starts with (YAML or JSON);
	// empty starts with no entities.
	Declarative string
	// Workers is nginx_worker_processes (default 2, a node of this
	// machine's size).
	Workers int
	// Prefix is Kong's prefix (default: a new directory of the test's).
	Prefix string
	// Extra are further kong.conf lines.
	Extra []string
	// Servers registers more Go plugin servers beside tollgate's: a
	// command's path by the plugin name Kong knows it under (its file's
	// name), started with -kong-prefix and queried with -dump.
	Servers map[string]string
	// Env gives a plugin server environment variables ("NAME=value"),
	// by its command's name: its start_cmd runs it under /usr/bin/env, as
	// docs/kong.md shows for the operators' socket.
	Env map[string][]string
	// Postgres runs Kong in DB mode on it (kong migrations bootstrap
	// first); Declarative is then unused. nil: DB-less.
	Postgres *Postgres
	// ControlPlane makes the node a hybrid control plane (Extra gives its
	// cluster lines): Kong starts no plugin server there, it only queries
	// their schemas (-dump). DataPlane makes it a data plane, which serves
	// no Admin API: it is ready once its proxy listens.
	ControlPlane, DataPlane bool
	// LuaPlugins are Lua plugins of kongplugin/lua to enable beside the
	// plugin servers (lua_package_path names that tree).
	LuaPlugins []string
	// ServersDown is for a test of a plugin server that cannot start:
	// Start waits for the Admin API alone, not for the servers' sockets.
	ServersDown bool
}

// Kong is one running Kong node.
type Kong struct {
	// ProxyURL and AdminURL are the proxy's and the Admin API's base URLs;
	// H2URL is a proxy listener that speaks HTTP/2 without TLS (h2c, as
	// gRPC clients of a plaintext Kong do).
	ProxyURL, AdminURL, H2URL string
	// Prefix is Kong's prefix: logs/error.log, the plugin servers' sockets.
	Prefix    string
	conf      string
	extra     []string // the names of Options.Servers
	noServers bool     // a control plane, or servers that cannot start: none is waited for
	noAdmin   bool     // a data plane: no Admin API
	workers   int      // nginx_worker_processes
	cmd       *exec.Cmd
	done      chan struct{}
	t         T
}

// Start starts a Kong node DB-less with tollgate's plugin servers
// registered as docs/kong.md says, waits until its Admin API answers and
// every plugin server listens, and stops it (and them) when the test
// ends.
func Start(t T, opts Options) *Kong {
	t.Helper()
	kong := Binary(t)
	bin := PluginDir(t)
	ports, err := redistest.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prefix := opts.Prefix
	if prefix == "" {
		// Short: a Unix socket's path holds at most 107 bytes, and a test's
		// own directory is named after the test.
		if prefix, err = os.MkdirTemp("", "kong-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(prefix) })
	}
	if opts.Workers == 0 {
		opts.Workers = 2
	}
	k := &Kong{ProxyURL: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), AdminURL: fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		H2URL:  fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
		Prefix: prefix, conf: filepath.Join(dir, "kong.conf"), done: make(chan struct{}), t: t, noServers: opts.ControlPlane || opts.ServersDown, noAdmin: opts.DataPlane, workers: opts.Workers}
	declarative := filepath.Join(dir, "kong.yml")
	if opts.Declarative == "" {
		opts.Declarative = "_format_version: \"3.0\"\n"
	}
	if err := os.WriteFile(declarative, []byte(opts.Declarative), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := []string{"prefix = " + prefix, "database = off", "declarative_config = " + declarative}
	if opts.Postgres != nil {
		conf = append([]string{"prefix = " + prefix}, postgresConf(opts.Postgres)...)
	}
	conf = append(conf,
		"router_flavor = traditional",
		"nginx_user = root root",
		"nginx_daemon = off",
		"nginx_worker_processes = "+strconv.Itoa(opts.Workers),
		fmt.Sprintf("proxy_listen = 127.0.0.1:%d, 127.0.0.1:%d http2", ports[0], ports[2]),
		fmt.Sprintf("admin_listen = 127.0.0.1:%d", ports[1]),
		"status_listen = off",
		"admin_gui_listen = off",
		"anonymous_reports = off",
		"log_level = info",
	)
	for _, line := range Registration(t) {
		line = strings.ReplaceAll(line, DocBinDir+"/", bin+"/")
		line = strings.ReplaceAll(line, DocPrefix, prefix)
		for cmd, env := range opts.Env {
			start := "pluginserver_" + strings.ReplaceAll(cmd, "-", "_") + "_start_cmd = "
			if rest, ok := strings.CutPrefix(line, start); ok {
				line = start + "/usr/bin/env " + strings.Join(env, " ") + " " + rest
			}
		}
		if strings.HasPrefix(line, "plugins = ") && len(opts.LuaPlugins) > 0 {
			line += "," + strings.Join(opts.LuaPlugins, ",")
		}
		for name := range opts.Servers {
			for _, key := range []string{"plugins = ", "pluginserver_names = "} {
				if strings.HasPrefix(line, key) {
					line += "," + name
				}
			}
		}
		conf = append(conf, line)
	}
	for name, cmd := range opts.Servers {
		k.extra = append(k.extra, name)
		n := strings.ReplaceAll(name, "-", "_")
		conf = append(conf, "pluginserver_"+n+"_start_cmd = "+cmd+" -kong-prefix "+prefix, "pluginserver_"+n+"_query_cmd = "+cmd+" -dump")
	}
	if len(opts.LuaPlugins) > 0 {
		root, err := RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		conf = append(conf, "lua_package_path = "+filepath.Join(root, "kongplugin", "lua", "?.lua")+";;")
	}
	conf = append(conf, opts.Extra...)
	if err := os.WriteFile(k.conf, []byte(strings.Join(conf, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if opts.Postgres != nil {
		if out, err := exec.Command(kong, "migrations", "bootstrap", "-c", k.conf).CombinedOutput(); err != nil {
			t.Fatalf("kong migrations bootstrap: %v\n%s", err, out)
		}
	}
	if out, err := exec.Command(kong, "prepare", "-c", k.conf).CombinedOutput(); err != nil {
		t.Fatalf("kong prepare: %v\n%s", err, out)
	}
	k.cmd = exec.Command("nginx", "-p", prefix, "-c", "nginx.conf")
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	out, err := os.Create(filepath.Join(dir, "nginx.out"))
	if err != nil {
		t.Fatal(err)
	}
	k.cmd.Stdout, k.cmd.Stderr = out, out
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = k.cmd.Wait(); out.Close(); close(k.done) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Kong's error.log, its errors and the plugin servers' lines:\n%s", k.logTail(80))
		}
		k.Stop()
	})
	k.waitReady()
	return k
}

// waitReady waits until the Admin API answers and every plugin server's
// socket exists (go-pdk creates it by listening; the prefix is the test's
// own, so no earlier server left one): before that, Kong answers a
// plugin's routes with 500. It does not dial the sockets: a connection
// that ends without an event is a line in the plugin server's log.
func (k *Kong) waitReady() {
	k.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ready := true
		if k.noAdmin {
			if c, err := net.DialTimeout("tcp", strings.TrimPrefix(k.ProxyURL, "http://"), time.Second); err != nil {
				ready = false
			} else {
				c.Close()
			}
		} else if resp, err := http.Get(k.AdminURL + "/status"); err != nil {
			ready = false
		} else {
			resp.Body.Close()
		}
		for _, c := range append(slices.Clone(Commands), k.extra...) {
			if k.noServers {
				break
			}
			if fi, err := os.Stat(filepath.Join(k.Prefix, c+".socket")); err != nil || fi.Mode()&os.ModeSocket == 0 {
				ready = false
			}
		}
		if ready {
			return
		}
		select {
		case <-k.done:
			k.t.Fatalf("kong exited while starting:\n%s", k.ErrorLog())
		default:
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("kong not ready in 60 s:\n%s", k.ErrorLog())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends Kong as `kong stop` does (SIGTERM to nginx's master: its
// workers stop the plugin servers), and kills what is left after 15 s.
func (k *Kong) Stop() {
	select {
	case <-k.done:
		return
	default:
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.done
	}
	// A plugin server a dying worker did not reap is in nginx's group.
	_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
}

// Reload runs `kong reload` on this node's kong.conf and waits until the
// new workers have started their own plugin servers (Kong 3.9.3 starts a
// new one of each; the old ones end with the old workers).
func (k *Kong) Reload() {
	k.t.Helper()
	started := strings.Count(k.ErrorLog(), "[pluginserver] started, pid")
	if out, err := exec.Command(Binary(k.t), "reload", "-c", k.conf).CombinedOutput(); err != nil {
		k.t.Fatalf("kong reload: %v\n%s", err, out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for strings.Count(k.ErrorLog(), "[pluginserver] started, pid") < started+len(Commands) {
		if time.Now().After(deadline) {
			k.t.Fatalf("kong reload: the new plugin servers did not start in 60 s:\n%s", k.logTail(40))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The reload is done when the old workers have exited: until then one
	// may still be running its timers and its plugin servers.
	for {
		workers, _ := k.Processes(PluginDir(k.t))
		if len(workers) <= k.workers {
			break
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("kong reload: %d nginx workers 60 s after it, want the %d new ones alone", len(workers), k.workers)
		}
		time.Sleep(20 * time.Millisecond)
	}
	k.waitReady()
}

// ID is the id Kong gave the entity of kind ("routes", "services",
// "plugins") named name (a plugin: by its instance_name), from the Admin API.
func (k *Kong) ID(kind, name string) string {
	k.t.Helper()
	resp, err := http.Get(k.AdminURL + "/" + kind + "/" + name)
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.ID == "" {
		k.t.Fatalf("GET /%s/%s: %d %v", kind, name, resp.StatusCode, err)
	}
	return e.ID
}

// Admin sends method path with body (JSON-encoded; nil: none) to the
// Admin API and returns the status and the answer.
func (k *Kong) Admin(method, path string, body any) (int, []byte) {
	k.t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			k.t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, k.AdminURL+path, r)
	if err != nil {
		k.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// AdminWant is Admin for a call that must answer want: it fails the test
// otherwise, and returns the answer's JSON object.
func (k *Kong) AdminWant(want int, method, path string, body any) map[string]any {
	k.t.Helper()
	status, b := k.Admin(method, path, body)
	if status != want {
		k.t.Fatalf("%s %s: %d %s, want %d", method, path, status, b, want)
	}
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// AdminGet returns the Admin API's answer to GET path.
func (k *Kong) AdminGet(path string) []byte {
	k.t.Helper()
	resp, err := http.Get(k.AdminURL + path)
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		k.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return b
}

// ErrorLog is Kong's error.log so far (the plugin servers write there too).
func (k *Kong) ErrorLog() string {
	b, _ := os.ReadFile(filepath.Join(k.Prefix, "logs", "error.log"))
	return string(b)
}

// logTail is the last n lines of Kong's error.log at error level or
// above, or from a plugin server (Kong logs their output at info).
func (k *Kong) logTail(n int) string {
	var keep []string
	for _, line := range strings.Split(k.ErrorLog(), "\n") {
		if strings.Contains(line, "[error]") || strings.Contains(line, "[crit]") || strings.Contains(line, "[alert]") ||
			strings.Contains(line, "[emerg]") || strings.Contains(line, "pluginserver") || strings.Contains(line, "lua entry thread aborted") {
			keep = append(keep, line)
		}
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	return strings.Join(keep, "\n")
}

// LoadConfig posts a declarative config (a JSON-encodable value in
// Kong's declarative format) to the Admin API's /config, as DB-less Kong
// takes a new config, and returns the status and body Kong answered.
func (k *Kong) LoadConfig(config any) (int, []byte) {
	k.t.Helper()
	b, err := json.Marshal(config)
	if err != nil {
		k.t.Fatal(err)
	}
	resp, err := http.Post(k.AdminURL+"/config", "application/json", bytes.NewReader(b))
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// MustLoad is LoadConfig that fails the test unless Kong took the config,
// and then waits until every worker routes it (each worker rebuilds its
// router on its own, after the Admin API answered).
func (k *Kong) MustLoad(config Declarative) {
	k.t.Helper()
	status, body := k.LoadConfig(config)
	if status != http.StatusCreated && status != http.StatusOK {
		k.t.Fatalf("POST /config: %d %s", status, body)
	}
	probe := config.probePath()
	if probe == "" {
		return
	}
	// Each worker must route the new config. nginx hands each new
	// connection to either, unevenly: the probe route's answer names the
	// worker, and every worker must have answered it. A global plugin may
	// answer for it instead (a denial): then eight routed answers in a row
	// are taken as every worker's.
	deadline := time.Now().Add(30 * time.Second)
	workers := map[string]bool{}
	inARow, answeredByOther := 0, false
	for len(workers) < k.workers && !(answeredByOther && inARow >= 8) {
		req, _ := http.NewRequest(http.MethodGet, k.ProxyURL+probe, nil)
		req.Close = true
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound { // routed
				inARow++
				if w, ok := strings.CutPrefix(string(b), probeAnswer); ok && resp.StatusCode == http.StatusOK {
					workers[w] = true
				} else {
					answeredByOther = true
				}
				continue
			}
		}
		inARow = 0
		if time.Now().After(deadline) {
			k.t.Fatalf("the new config's probe route %s is not routed by each of Kong's %d workers in 30 s (routed by %d)", probe, k.workers, len(workers))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Declarative is a DB-less config in Kong's declarative format.
type Declarative map[string]any

// ProbeRoute is the route MustLoad adds to every config it loads, on a
// path of its own: a config is in force in a worker once this answers.
const probeService = "kongreal-probe"

// probeAnswer begins the probe route's body; the worker's number follows.
const probeAnswer = "probe worker "

func (d Declarative) probePath() string {
	p, _ := d["__probe"].(string)
	return p
}

// NewDeclarative is an empty declarative config whose probe route
// (a post-function on probePath, answering 200 and the worker's number)
// tells MustLoad when every worker has it.
func NewDeclarative(probePath string) Declarative {
	return Declarative{
		"_format_version": "3.0",
		"__probe":         probePath,
		"services": []any{map[string]any{
			"name": probeService, "url": "http://127.0.0.1:9",
			"routes": []any{map[string]any{"name": probeService, "paths": []string{probePath},
				"plugins": []any{map[string]any{"name": "post-function", "config": map[string]any{
					"access": []string{`return kong.response.exit(200, "` + probeAnswer + `" .. ngx.worker.id())`}}}}}},
		}},
	}
}

// AddService appends a service (a map in Kong's declarative format) to d.
func (d Declarative) AddService(s map[string]any) {
	d["services"] = append(d["services"].([]any), s)
}

// MarshalJSON leaves the probe path out of what Kong is sent.
func (d Declarative) MarshalJSON() ([]byte, error) {
	m := map[string]any{}
	for k, v := range d {
		if k != "__probe" {
			m[k] = v
		}
	}
	return json.Marshal(m)
}

// timerStats are Kong's timer counts (the Admin API's /timers, "sys"):
// how many timers have run, run now, and wait to run.
type timerStats struct {
	Runs, Running, Pending int
}

// Timers reads the Admin API's /timers of the worker that answers: with
// one worker (Options.Workers 1), the worker that proxies.
func (k *Kong) Timers() timerStats {
	k.t.Helper()
	resp, err := http.Get(k.AdminURL + "/timers")
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Stats struct {
			Sys timerStats `json:"sys"`
		} `json:"stats"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		k.t.Fatal(err)
	}
	return body.Stats.Sys
}

// TimersRan waits until a timer has run since before was read and no
// timer runs or waits beyond idle (the timers Kong always runs): what
// Kong's spec waits for with helpers.wait_timer before it reads a count
// a plugin updates in a timer. Meaningful with one worker only.
func (k *Kong) TimersRan(before timerStats, idle int) {
	k.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		now := k.Timers()
		if now.Runs > before.Runs && now.Running <= idle && now.Pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("Kong's timers not settled in 10 s: %+v (before %+v, idle %d running)", now, before, idle)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Processes returns the pids of Kong's nginx workers and of the plugin
// servers they started from bin (for the CPU they spend).
func (k *Kong) Processes(bin string) (workers, plugins []int) {
	entries, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	exe := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(fields) > 1 {
			parent[pid], _ = strconv.Atoi(fields[1])
		}
		exe[pid], _ = os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
	}
	master := k.cmd.Process.Pid
	for pid, pp := range parent {
		if pp == master {
			workers = append(workers, pid)
		}
	}
	for pid, pp := range parent {
		if slices.Contains(workers, pp) && strings.HasPrefix(exe[pid], bin+"/") {
			plugins = append(plugins, pid)
		}
	}
	return workers, plugins
}
