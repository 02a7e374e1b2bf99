//go:build dockertest

package dockerfleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// The images make docker-test builds here; the compose files name the
// public ones by default.
const (
	caddyImage  = "tollgate-caddy:dockertest"
	redisImage  = "tollgate-redis:dockertest"
	pluginImage = "tollgate-kong-plugin:dockertest"
)

var root string // the repository

func TestMain(m *testing.M) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "go env GOMOD:", err)
		os.Exit(2)
	}
	root = filepath.Dir(strings.TrimSpace(string(out)))
	os.Exit(m.Run())
}

// run runs a command in the repository, failing t with its output.
func run(t testing.TB, env []string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// runErr runs a command in the repository: its output and error.
func runErr(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

var (
	buildOnce sync.Once
	buildErr  string
)

// buildImages builds the three images once: Caddy with tollgate (a static
// xcaddy build, CGO_ENABLED=0), Redis from Debian's redis-server package
// (the binaries and the libraries they load), and the Kong plugin server
// (static), each on an empty base. busybox-static gives the Caddy image
// the wget its healthcheck runs, as the public Caddy image has.
func buildImages(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		bt := &recorder{TB: t}
		func() {
			defer func() { _ = recover() }()
			build(bt)
		}()
		buildErr = bt.failure
	})
	if buildErr != "" {
		t.Fatal(buildErr)
	}
}

// recorder keeps the first failure of a build shared by the tests.
type recorder struct {
	testing.TB
	failure string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failure = fmt.Sprintf(format, args...)
	panic(r.failure)
}

func (r *recorder) Fatal(args ...any) {
	r.failure = fmt.Sprint(args...)
	panic(r.failure)
}

func build(t testing.TB) {
	dir := filepath.Join(root, "bin", "docker")
	static := []string{"CGO_ENABLED=0"}
	began := time.Now()
	// README's own install commands, as written but for where they put
	// the binaries, statically (CGO_ENABLED=0) for the empty images.
	xcaddy := readmeCommand(t, "go tool xcaddy build ")
	xcaddy = strings.ReplaceAll(xcaddy, "$(pwd)", root)
	run(t, static, "sh", "-c", xcaddy+" --output "+filepath.Join(dir, "caddy", "usr", "bin", "caddy"))
	kong := readmeCommand(t, "CGO_ENABLED=0 go build -o /usr/local/bin/ ")
	bin := filepath.Join(dir, "kong-plugins")
	mkdir(t, bin)
	run(t, nil, "sh", "-c", strings.Replace(kong, "/usr/local/bin/", bin+"/", 1))
	for _, name := range []string{"tollgate", "tollgate-response", "tollgate-response-ratelimiting"} {
		version := strings.TrimSpace(run(t, nil, filepath.Join(bin, name), "version"))
		if !strings.Contains(version, core.Version) {
			t.Fatalf("%s version (built by README's command): %q, want %s", name, version, core.Version)
		}
	}
	copyFile(t, filepath.Join(bin, "tollgate"), filepath.Join(dir, "plugin", "usr", "local", "bin", "tollgate"))
	t.Logf("static builds (README's commands): %s", time.Since(began).Round(time.Second))

	// Caddy: its binary, busybox as wget, and the directories Caddy writes.
	for _, d := range []string{"config", "data", "srv", "tmp", "etc/caddy"} {
		mkdir(t, filepath.Join(dir, "caddy", d))
	}
	copyFile(t, "/bin/busybox", filepath.Join(dir, "caddy", "bin", "wget"))
	writeFile(t, filepath.Join(dir, "caddy", "Dockerfile"), `FROM scratch
COPY . /
ENV PATH=/usr/bin:/bin XDG_CONFIG_HOME=/config XDG_DATA_HOME=/data HOME=/root
WORKDIR /srv
EXPOSE 8080 2019
CMD ["caddy", "run", "--config", "/etc/caddy/Caddyfile", "--adapter", "caddyfile"]
`)
	// Redis: Debian's binaries with every library ldd names, at their paths.
	rootfs := filepath.Join(dir, "redis")
	for _, bin := range []string{"/usr/bin/redis-server", "/usr/bin/redis-cli"} {
		real, err := filepath.EvalSymlinks(bin)
		if err != nil {
			t.Fatalf("%s (Debian's redis-server and redis-tools; make deps installs them): %v", bin, err)
		}
		copyFile(t, real, filepath.Join(rootfs, bin))
		for _, lib := range libraries(t, real) {
			copyFile(t, lib, filepath.Join(rootfs, lib))
		}
	}
	mkdir(t, filepath.Join(rootfs, "data"))
	writeFile(t, filepath.Join(rootfs, "Dockerfile"), `FROM scratch
COPY . /
ENV PATH=/usr/bin:/bin
WORKDIR /data
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
`)
	writeFile(t, filepath.Join(dir, "plugin", "Dockerfile"), "FROM scratch\nCOPY . /\nENTRYPOINT [\"/usr/local/bin/tollgate\"]\n")
	for image, context := range map[string]string{caddyImage: "caddy", redisImage: "redis", pluginImage: "plugin"} {
		run(t, nil, "docker", "build", "-q", "-t", image, filepath.Join(dir, context))
	}
}

// readmeCommand is README.md's shell line starting with prefix, without
// its trailing comment.
func readmeCommand(t testing.TB, prefix string) string {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix) {
			line, _, _ = strings.Cut(line, " #")
			return strings.TrimSpace(line)
		}
	}
	t.Fatalf("README.md has no line starting %q", prefix)
	return ""
}

// libraries lists the shared objects ldd says bin loads, the loader too.
func libraries(t testing.TB, bin string) []string {
	out := run(t, nil, "ldd", bin)
	var libs []string
	for _, m := range regexp.MustCompile(`(/[^\s]+\.so[^\s]*)`).FindAllString(out, -1) {
		if !slices.Contains(libs, m) {
			libs = append(libs, m)
		}
	}
	if len(libs) == 0 {
		t.Fatalf("ldd %s named no library:\n%s", bin, out)
	}
	return libs
}

func mkdir(t testing.TB, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, ".keep"), "") // COPY keeps a directory with a file in it
}

func writeFile(t testing.TB, path, body string) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t testing.TB, from, to string) {
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, info.Mode().Perm()|0o444); err != nil {
		t.Fatal(err)
	}
}

// fleet is the Caddy example's compose project, as a user runs it, with
// the images built here.
type fleet struct {
	t       *testing.T
	project string
	env     []string
}

func (f *fleet) compose(args ...string) string {
	f.t.Helper()
	return run(f.t, f.env, "docker", append([]string{"compose", "-p", f.project, "-f", "examples/caddy/docker-compose.yml"}, args...)...)
}

// get sends one request to a published port; 0 means no answer.
func get(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// exchange is one request of the trace: sent, answered, its status.
type exchange struct {
	sent, received time.Time
	status         int
}

// load sends requests to every node from each of conc goroutines until
// ctx ends, counting answers in progress.
func load(ctx context.Context, nodes []string, conc int, progress *atomic.Int64) []exchange {
	var mu sync.Mutex
	var trace []exchange
	var wg sync.WaitGroup
	for _, node := range nodes {
		for g := 0; g < conc; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					sent := time.Now()
					status := get(node)
					if ctx.Err() != nil && status == 0 {
						return
					}
					mu.Lock()
					trace = append(trace, exchange{sent, time.Now(), status})
					mu.Unlock()
					progress.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	return trace
}

// provenInWindow is the most allowed requests the client can prove were
// decided within one window: requests whose whole exchange (sent to
// answered) fits in one window were decided in it, whatever the latency.
func provenInWindow(trace []exchange, window time.Duration) int {
	var allowed []exchange
	for _, e := range trace {
		if e.status == http.StatusOK {
			allowed = append(allowed, e)
		}
	}
	sort.Slice(allowed, func(i, j int) bool { return allowed[i].sent.Before(allowed[j].sent) })
	most := 0
	for i, first := range allowed {
		n := 0
		for _, e := range allowed[i:] {
			if e.received.Sub(first.sent) < window {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

func count(trace []exchange) (allowed, denied, failed int) {
	for _, e := range trace {
		switch {
		case e.status == http.StatusOK:
			allowed++
		case e.status == http.StatusTooManyRequests:
			denied++
		default:
			failed++
		}
	}
	return allowed, denied, failed
}

// TestCaddyFleet brings up examples/caddy/docker-compose.yml (two Caddies
// with tollgate on one Redis) with the images built here and proves
// through the ports it publishes on 127.0.0.1: one exact limit across both
// containers; a restarted Caddy container still denies (the counters live
// in Redis); Redis killed under load gives no 5xx (on_error local), and
// once it is back the limit is shared again; `docker compose down` leaves
// no container, network or volume behind.
func TestCaddyFleet(t *testing.T) {
	buildImages(t)
	const n, window = 20, 30 * time.Second
	f := &fleet{t: t, project: fmt.Sprintf("tollgate-fleet-%d", os.Getpid()),
		env: []string{"REDIS_IMAGE=" + redisImage, "CADDY_IMAGE=" + caddyImage, fmt.Sprintf("TOLLGATE_LIMIT=%d/%s", n, window)}}
	down := func() { f.compose("down", "--volumes", "--remove-orphans", "--timeout", "5") }
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(run(t, f.env, "docker", "compose", "-p", f.project, "-f", "examples/caddy/docker-compose.yml", "logs", "--no-color", "--tail", "50"))
		}
		down()
	})
	began := time.Now()
	f.compose("up", "--detach", "--no-build", "--wait", "--wait-timeout", "120")
	t.Logf("fleet up and healthy in %s", time.Since(began).Round(100*time.Millisecond))
	nodes := []string{"http://127.0.0.1:8081/", "http://127.0.0.1:8082/"}

	// One exact limit across both containers.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	trace := load(ctx, nodes, 8, new(atomic.Int64))
	cancel()
	allowed, denied, failed := count(trace)
	worst := provenInWindow(trace, window)
	t.Logf("exact limit: %d requests, %d allowed, %d denied, %d failed; most allowed proven within one %s window: %d (limit %d)",
		len(trace), allowed, denied, failed, window, worst, n)
	if worst > n || allowed > n {
		t.Errorf("%d allowed (%d proven within one window) across two Caddies, limit %d", allowed, worst, n)
	}
	if allowed < n || denied == 0 || failed > 0 {
		t.Errorf("allowed %d, denied %d, failed %d: want the limit reached, denials and no failure", allowed, denied, failed)
	}

	// A restarted Caddy container keeps denying: the window's log is in Redis.
	began = time.Now()
	f.compose("restart", "--timeout", "5", "caddy1")
	waitfor.True(t, 60*time.Second, "caddy1 answers after its restart", func() bool { return get(nodes[0]) != 0 })
	if status := get(nodes[0]); status != http.StatusTooManyRequests {
		t.Errorf("caddy1 after a restart (%s): %d, want 429 from the counters in Redis", time.Since(began).Round(100*time.Millisecond), status)
	} else {
		t.Logf("caddy1 restarted in %s and still denies", time.Since(began).Round(100*time.Millisecond))
	}

	// Redis killed under load: on_error local keeps every answer a 200 or a
	// 429; started again (empty: no persistence), the limit is shared again.
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan []exchange)
	var answered atomic.Int64
	go func() { done <- load(ctx, nodes, 4, &answered) }()
	waitfor.True(t, 30*time.Second, "the load is under way", func() bool { return answered.Load() >= 50 })
	f.compose("kill", "redis")
	// 3 s of load with Redis dead, then stop.
	time.AfterFunc(3*time.Second, cancel)
	trace = <-done
	allowed, denied, failed = count(trace)
	t.Logf("Redis killed under load: %d requests, %d allowed, %d denied, %d failed", len(trace), allowed, denied, failed)
	if failed > 0 {
		t.Errorf("%d requests failed (5xx or no answer) with Redis killed and on_error local", failed)
	}
	f.compose("up", "--detach", "--no-build", "--wait", "--wait-timeout", "60", "redis")
	// Both nodes on Redis again (their breakers probe it): the fresh Redis
	// counts both nodes' requests in one log, so a second node's first
	// requests see the first node's.
	waitfor.True(t, 60*time.Second, "both nodes use the restarted Redis", func() bool {
		for _, node := range []string{"caddy1", "caddy2"} {
			out, err := exec.Command("docker", "compose", "-p", f.project, "-f", filepath.Join(root, "examples/caddy/docker-compose.yml"),
				"exec", "-T", node, "wget", "-q", "-O", "-", "http://127.0.0.1:2019/tollgate/policies").CombinedOutput()
			if err != nil || !breakerClosed(out) {
				return false
			}
		}
		return true
	})
	run(t, nil, "docker", "compose", "-p", f.project, "-f", "examples/caddy/docker-compose.yml", "exec", "-T", "redis", "redis-cli", "FLUSHALL")
	allowed = 0
	for i := 0; i < 2*n; i++ {
		if get(nodes[i%2]) == http.StatusOK {
			allowed++
		}
	}
	if allowed != n {
		t.Errorf("after Redis came back: %d of %d alternating requests allowed, want the shared %d", allowed, 2*n, n)
	}

	// down leaves nothing behind.
	down()
	for _, kind := range []string{"ps -a", "network ls", "volume ls"} {
		args := append(strings.Fields(kind), "-q", "--filter", "label=com.docker.compose.project="+f.project)
		if left := strings.TrimSpace(run(t, nil, "docker", args...)); left != "" {
			t.Errorf("docker %s after down: %s", kind, left)
		}
	}
}

// breakerClosed reads the admin API's policies answer: every policy is on
// Redis with its breaker closed (decisions go to Redis).
func breakerClosed(body []byte) bool {
	var policies []struct {
		Store       string `json:"store"`
		BreakerOpen *bool  `json:"breaker_open"`
	}
	if json.Unmarshal(body, &policies) != nil || len(policies) == 0 {
		return false
	}
	for _, p := range policies {
		if p.Store != "redis" || p.BreakerOpen == nil || *p.BreakerOpen {
			return false
		}
	}
	return true
}

// TestKongExample checks examples/kong beyond a run (TestKongFleet runs
// it): the compose file is valid for `docker compose`; the plugin server
// answers -dump inside a minimal container exactly as on the host; the
// Kong environment of the compose file and of the Dockerfile says what
// README's kong.conf lines say.
func TestKongExample(t *testing.T) {
	buildImages(t)
	var config struct {
		Services map[string]struct {
			Environment map[string]string
			Ports       []struct {
				HostIP string `json:"host_ip"`
			}
		}
	}
	out := run(t, nil, "docker", "compose", "-f", "examples/kong/docker-compose.yml", "config", "--format", "json")
	if err := json.Unmarshal([]byte(out), &config); err != nil {
		t.Fatalf("docker compose config: %v\n%s", err, out)
	}
	kong, ok := config.Services["kong"]
	if !ok {
		t.Fatalf("no kong service in examples/kong/docker-compose.yml")
	}
	for _, p := range kong.Ports {
		if p.HostIP != "127.0.0.1" {
			t.Errorf("kong publishes a port on %q, want 127.0.0.1", p.HostIP)
		}
	}

	host := run(t, nil, filepath.Join(root, "bin", "docker", "plugin", "usr", "local", "bin", "tollgate"), "-dump")
	inside := run(t, nil, "docker", "run", "--rm", pluginImage, "-dump")
	if host != inside {
		t.Errorf("-dump in a container differs from the host's:\nhost:   %s\ninside: %s", host, inside)
	}

	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "examples", "kong", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	lines := regexp.MustCompile(`(?m)^(plugins|pluginserver_\w+) = (.+)$`).FindAllStringSubmatch(string(readme), -1)
	if len(lines) < 4 {
		t.Fatalf("README's kong.conf lines: found %d", len(lines))
	}
	for _, l := range lines {
		name, want := "KONG_"+strings.ToUpper(l[1]), l[2]
		if got := kong.Environment[name]; got != want {
			t.Errorf("examples/kong/docker-compose.yml: %s = %q, README's kong.conf says %q", name, got, want)
		}
		if !regexp.MustCompile(`(?m)\b` + name + `=("` + regexp.QuoteMeta(want) + `"|` + regexp.QuoteMeta(want) + `)(\s|\\|$)`).Match(dockerfile) {
			t.Errorf("examples/kong/Dockerfile: no %s=%s as README's kong.conf says", name, want)
		}
	}
}
