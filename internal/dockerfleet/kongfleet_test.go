//go:build dockertest

package dockerfleet

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/waitfor"
)

const (
	kongBaseImage = "tollgate-kong-base:dockertest" // kongimage.sh: Kong 3.9.3 from ../shared/kong-real
	kongImage     = "tollgate-kong:dockertest"      // examples/kong/Dockerfile on it
)

// TestKongFleet runs examples/kong as its comments tell a user: the plugin
// server built with the line they give, the image of examples/kong/Dockerfile
// (on a Kong 3.9.3 image built here, see kongimage.sh), and
// `docker compose up --wait` on docker-compose.yml with kong.yml.example
// as it is. The one addition is an upstream answering for httpbin.org on
// the compose network (no Internet here). Through the published ports:
// Kong's Admin API lists tollgate; /search (local policy, 5 a second by
// X-API-Key) refuses the sixth request of a second; /orders (Redis policy)
// admits its burst of 20 and refuses the next, counted in the Redis
// container; a restarted Kong container counts on from Redis; `down`
// leaves nothing behind.
func TestKongFleet(t *testing.T) {
	buildImages(t)
	if out, err := runErr(nil, "docker", "image", "inspect", kongBaseImage); err != nil {
		t.Fatalf("%s is missing (internal/dockerfleet/kongimage.sh builds it; make docker-test runs that): %s", kongBaseImage, out)
	}
	run(t, []string{"CGO_ENABLED=0", "GOOS=linux"}, "go", "build", "-o", "examples/kong/tollgate", "./kongplugin/cmd/tollgate")
	run(t, nil, "docker", "build", "-q", "--build-arg", "KONG_IMAGE="+kongBaseImage, "-t", kongImage, "examples/kong")

	upstream := filepath.Join(t.TempDir(), "upstream.yml")
	writeFile(t, upstream, `services:
  upstream:
    image: `+caddyImage+`
    command: ["caddy", "respond", "--listen", ":80", "upstream"]
    networks:
      default:
        aliases: [httpbin.org]
`)
	project := fmt.Sprintf("tollgate-kong-%d", os.Getpid())
	env := []string{"REDIS_IMAGE=" + redisImage, "KONG_IMAGE=" + kongImage}
	compose := func(args ...string) string {
		t.Helper()
		return run(t, env, "docker", append([]string{"compose", "-p", project, "-f", "examples/kong/docker-compose.yml", "-f", upstream}, args...)...)
	}
	down := func() { compose("down", "--volumes", "--remove-orphans", "--timeout", "5") }
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(compose("logs", "--no-color", "--tail", "60"))
		}
		down()
	})
	began := time.Now()
	compose("up", "--detach", "--no-build", "--wait", "--wait-timeout", "180")
	t.Logf("Kong, Redis and the upstream up and healthy in %s", time.Since(began).Round(100*time.Millisecond))

	// Kong's Admin API: tollgate enabled, Kong 3.9.3. (GET / answers 500
	// on this Kong tree, which cannot serialise one of its fields.)
	var enabled struct {
		EnabledPlugins []string `json:"enabled_plugins"`
	}
	body, server := fetch(t, "http://127.0.0.1:8001/plugins/enabled")
	if err := json.Unmarshal([]byte(body), &enabled); err != nil {
		t.Fatalf("Kong's Admin API: %v\n%s", err, body)
	}
	if !slices.Contains(enabled.EnabledPlugins, "tollgate") || server != "kong/3.9.3" {
		t.Errorf("Kong's Admin API: Server %q, enabled plugins %v; want kong/3.9.3 with tollgate", server, enabled.EnabledPlugins)
	}

	// /search: second 5 by X-API-Key, policy local. A second's boundary
	// may fall inside a run of six, so run until a refusal (at most 60).
	var last *http.Response
	for i := 0; i < 60; i++ {
		last = send(t, "http://127.0.0.1:8000/search", "k1")
		if last.StatusCode == http.StatusTooManyRequests {
			break
		}
		if last.StatusCode != http.StatusOK {
			t.Fatalf("/search: %s, want 200 from the upstream or 429", last.Status)
		}
	}
	if last.StatusCode != http.StatusTooManyRequests || last.Header.Get("X-Ratelimit-Limit-Second") != "5" {
		t.Errorf("/search: last answer %s with X-RateLimit-Limit-Second %q, want 429 from the 5-a-second limit",
			last.Status, last.Header.Get("X-Ratelimit-Limit-Second"))
	}
	if other := send(t, "http://127.0.0.1:8000/search", "k2"); other.StatusCode != http.StatusOK {
		t.Errorf("/search with another key: %s, want 200 (its own count)", other.Status)
	}

	// /orders: a token bucket of burst 20 (20 per 10 s) on Redis.
	var statuses []int
	for i := 0; i < 40 && (len(statuses) == 0 || statuses[len(statuses)-1] != http.StatusTooManyRequests); i++ {
		statuses = append(statuses, send(t, "http://127.0.0.1:8000/orders", "").StatusCode)
	}
	n := len(statuses)
	if n < 21 || statuses[n-1] != http.StatusTooManyRequests || strings.Count(fmt.Sprint(statuses[:20]), "200") != 20 {
		t.Errorf("/orders: statuses %v, want the burst of 20 admitted, then a 429", statuses)
	}
	if keys := compose("exec", "-T", "redis", "redis-cli", "--scan", "--pattern", "tollgate:*"); strings.TrimSpace(keys) == "" {
		t.Errorf("no tollgate key in the Redis container after /orders (policy redis)")
	}

	// A restarted Kong (new plugin servers, no local state) counts on
	// from Redis: the hour's remaining goes on from the 20-odd admitted
	// before, where a fresh count would say 3599.
	began = time.Now()
	compose("restart", "--timeout", "5", "kong")
	compose("up", "--detach", "--no-build", "--wait", "--wait-timeout", "120", "kong")
	var remaining string
	waitfor.True(t, 60*time.Second, "Kong proxies /orders after its restart", func() bool {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://127.0.0.1:8000/orders")
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		remaining = resp.Header.Get("X-Ratelimit-Remaining-Hour")
		return resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests
	})
	if left, err := strconv.Atoi(remaining); err != nil || left > 3600-15 {
		t.Errorf("after Kong's restart: X-RateLimit-Remaining-Hour %q, want the hour's count in Redis to go on (at most 3585 left after 20-odd admitted)", remaining)
	} else {
		t.Logf("Kong restarted in %s; the hour's count went on from Redis: %d left", time.Since(began).Round(100*time.Millisecond), left)
	}

	down()
	for _, kind := range []string{"ps -a", "network ls", "volume ls"} {
		args := append(strings.Fields(kind), "-q", "--filter", "label=com.docker.compose.project="+project)
		if left := strings.TrimSpace(run(t, nil, "docker", args...)); left != "" {
			t.Errorf("docker %s after down: %s", kind, left)
		}
	}
}

// send sends one GET with the X-API-Key (when not empty), reading the body.
func send(t *testing.T, url, apiKey string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if apiKey != "" {
		req.Header.Set("X-API-Key", apiKey)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// fetch answers a GET's body and Server header, failing t unless it is a 200.
func fetch(t *testing.T, url string) (body, server string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	return string(b), resp.Header.Get("Server")
}
