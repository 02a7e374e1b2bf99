package caddymodule_test

// These tests run the real xcaddy-built Caddy (bin/caddy) on loopback ports
// and send it real HTTP requests.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/internal/caddyproc"
	"github.com/tollgate/tollgate/internal/headercheck"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/testclock"
)

// expectHeaders checks resp's headers (see headercheck.Expect).
func expectHeaders(t *testing.T, label string, resp *http.Response, want map[string]string) {
	t.Helper()
	headercheck.Expect(t, label, resp.Header, want)
}

// midMinute is where the tests that pin the stores' clock start: half way
// through a minute (and a second), so no window turns while they run.
var midMinute = time.Date(2025, 6, 1, 12, 0, 30, 500_000_000, time.UTC)

func TestCaddyPerKeyLimitAndHeaders(t *testing.T) {
	testclock.New(t, midMinute).InProcess() // resets and retry-afters exact on any machine
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy per-key {
			key {http.request.header.X-Key}
			limit 3/1m sliding_log
		}
	}
	respond "ok {http.tollgate.remaining}"`)
	for i := 1; i <= 3; i++ {
		resp, body := c.Get("/", "X-Key", "alice")
		if resp.StatusCode != 200 || body != fmt.Sprintf("ok %d", 3-i) {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		expectHeaders(t, fmt.Sprint("request ", i), resp, map[string]string{
			"X-Ratelimit-Limit": "3", "X-Ratelimit-Remaining": strconv.Itoa(3 - i), "X-Ratelimit-Reset": "60",
			"Ratelimit-Policy": `"per-key";q=3;w=60`, "Ratelimit": fmt.Sprintf(`"per-key";r=%d;t=60`, 3-i),
			"Retry-After": "",
		})
	}
	resp, body := c.Get("/", "X-Key", "alice")
	if resp.StatusCode != http.StatusTooManyRequests || body != "rate limit exceeded\n" {
		t.Fatalf("4th request: %d %q, want 429 and the default body", resp.StatusCode, body)
	}
	expectHeaders(t, "denied", resp, map[string]string{
		"Retry-After": "60", "X-Ratelimit-Remaining": "0", "Content-Type": "text/plain; charset=utf-8",
		"Ratelimit": `"per-key";r=0;t=60`, "Content-Length": "20",
	})
	// Another key has its own quota; a request without the key header is
	// keyed by the client's address (empty_key client, the default): left
	// out, the key gets no client out of the limit.
	if resp, body := c.Get("/", "X-Key", "bob"); resp.StatusCode != 200 || body != "ok 2" {
		t.Fatalf("other key: %d %q", resp.StatusCode, body)
	}
	for i := 0; i < 5; i++ {
		resp, _ := c.Get("/")
		if want := map[bool]int{true: 200, false: 429}[i < 3]; resp.StatusCode != want || resp.Header.Get("X-Ratelimit-Limit") != "3" {
			t.Fatalf("keyless request %d: %d, X-Ratelimit-Limit %q; want %d and the limit of 3 (the client address's bucket)", i, resp.StatusCode, resp.Header.Get("X-Ratelimit-Limit"), want)
		}
	}

	metrics := c.Metrics()
	for _, want := range []string{
		`tollgate_decisions_total{limit="3/1m",plan="",policy="per-key",result="allowed"} 7`,
		`tollgate_decisions_total{limit="3/1m",plan="",policy="per-key",result="denied"} 3`,
		`tollgate_store_duration_seconds_count{policy="per-key"} 10`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(metrics, "alice") {
		t.Error("a request key appears in the metrics")
	}
}

func TestCaddyStackedLimits(t *testing.T) {
	clock := testclock.New(t, midMinute).InProcess()
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy stacked {
			key {http.request.header.X-Key}
			limit 2/1s sliding_log name second
			limit 5/1m sliding_log name minute
		}
	}
	respond ok`)
	allowed := 0
	get := func() *http.Response {
		resp, _ := c.Get("/", "X-Key", "k")
		if resp.StatusCode == 200 {
			allowed++
		}
		return resp
	}
	// Knock on the key until the minute's 5 are used, three times a second
	// more than the per-second limit lets through: denied requests must
	// consume nothing, in either limit.
	for second := 0; allowed < 5; second++ {
		for i := 0; i < 5; i++ {
			before := allowed
			resp := get()
			if allowed == before && allowed < 5 {
				expectHeaders(t, fmt.Sprintf("second %d, request %d: the per-second limit denies", second, i+1), resp, map[string]string{
					"X-Ratelimit-Limit": "2", "X-Ratelimit-Remaining": "0", "Retry-After": "1"})
			}
		}
		if want := min(2*(second+1), 5); allowed != want {
			t.Fatalf("second %d: %d allowed in all, want %d", second, allowed, want)
		}
		clock.Advance(1100 * time.Millisecond)
	}
	// 3.3 s after the first request: the minute's quota is spent until 60 s
	// after it.
	resp := get()
	expectHeaders(t, "after the minute's quota", resp, map[string]string{
		"X-Ratelimit-Limit": "5", "X-Ratelimit-Remaining": "0", "Retry-After": "57",
		"Ratelimit-Policy": `"second";q=2;w=1, "minute";q=5;w=60`,
	})
	if resp.StatusCode != http.StatusTooManyRequests || allowed != 5 {
		t.Fatalf("status %d with %d allowed, want 429 and exactly 5", resp.StatusCode, allowed)
	}
}

func TestCaddyStatusBodyHeaderStyles(t *testing.T) {
	testclock.New(t, midMinute).InProcess() // no window turns between its requests
	c := caddyproc.StartInProcess(t, `
	route /x* {
		tollgate {
			policy x {
				limit 1/1m fixed_window
			}
			status 503
			body "busy, come back later"
			headers xratelimit
		}
		respond ok
	}
	route /none* {
		tollgate {
			policy none {
				limit 1/1m fixed_window
			}
			headers none
		}
		respond ok
	}
	route /ietf* {
		tollgate {
			policy ietf {
				limit 1/1m fixed_window
			}
			headers ietf
		}
		respond ok
	}`)
	c.Get("/x")
	resp, body := c.Get("/x")
	if resp.StatusCode != 503 || body != "busy, come back later" {
		t.Fatalf("/x denied: %d %q", resp.StatusCode, body)
	}
	expectHeaders(t, "xratelimit", resp, map[string]string{"X-Ratelimit-Limit": "1", "Ratelimit-Policy": "", "Ratelimit": "", "Retry-After": "1..60"})
	c.Get("/none")
	resp, _ = c.Get("/none")
	expectHeaders(t, "none", resp, map[string]string{"X-Ratelimit-Limit": "", "Ratelimit": "", "Retry-After": ""})
	if resp.StatusCode != 429 {
		t.Fatalf("/none denied with %d", resp.StatusCode)
	}
	c.Get("/ietf")
	resp, _ = c.Get("/ietf")
	expectHeaders(t, "ietf", resp, map[string]string{"X-Ratelimit-Limit": "", "Ratelimit-Policy": `"ietf";q=1;w=60`, "Retry-After": "1..60"})
}

func TestCaddyShadowMatchersAndEmptyKey(t *testing.T) {
	testclock.New(t, midMinute).InProcess() // no window turns between its requests
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy api {
			match {
				path /api/*
			}
			key {http.request.header.X-Api-Key}
			empty_key shared
			limit 2/1m
		}
		policy watch {
			match {
				path /watch
			}
			limit 1/1m
			shadow
		}
		policy open {
			match {
				path /open
			}
			key {http.request.header.X-Api-Key}
			empty_key skip
			limit 1/1m
		}
	}
	respond "{http.tollgate.policy} denied={http.tollgate.denied}"`)
	// empty_key skip, said: keyless /open requests pass, unlimited.
	for i := 0; i < 3; i++ {
		if resp, _ := c.Get("/open"); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Limit") != "" {
			t.Fatalf("keyless /open request %d: %d, X-Ratelimit-Limit %q; want 200 with none (empty_key skip)", i+1, resp.StatusCode, resp.Header.Get("X-Ratelimit-Limit"))
		}
	}
	// Keyless /api requests share one bucket.
	c.Get("/api/a")
	c.Get("/api/b")
	if resp, _ := c.Get("/api/c"); resp.StatusCode != 429 {
		t.Fatalf("third keyless /api request: %d, want 429 (shared bucket)", resp.StatusCode)
	}
	if resp, _ := c.Get("/api/c", "X-Api-Key", "k1"); resp.StatusCode != 200 {
		t.Fatalf("keyed /api request: %d", resp.StatusCode)
	}
	// Paths no policy matches are not limited.
	for i := 0; i < 4; i++ {
		if resp, body := c.Get("/elsewhere"); resp.StatusCode != 200 || resp.Header.Get("Ratelimit") != "" {
			t.Fatalf("/elsewhere: %d %q", resp.StatusCode, body)
		}
	}
	// Shadow: always served, but the headers tell the truth.
	for i := 0; i < 3; i++ {
		resp, body := c.Get("/watch")
		if resp.StatusCode != 200 || body != "watch denied=false" {
			t.Fatalf("shadowed request %d: %d %q", i, resp.StatusCode, body)
		}
		if i > 0 && resp.Header.Get("X-Ratelimit-Remaining") != "0" {
			t.Fatalf("shadowed request %d: remaining %q, want 0", i, resp.Header.Get("X-Ratelimit-Remaining"))
		}
	}
	if m := c.Metrics(); !strings.Contains(m, `tollgate_decisions_total{limit="1/1m",plan="",policy="watch",result="shadowed"} 2`) {
		t.Error("metrics do not count the 2 shadowed requests")
	}
}

func TestCaddyHandleErrorsAndPlaceholders(t *testing.T) {
	testclock.New(t, midMinute).InProcess() // no window turns between its requests
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy p {
			limit 1/1m fixed_window
		}
		handle_errors
	}
	respond ok
	handle_errors {
		respond "limited by {http.tollgate.policy}, retry in {http.tollgate.retry_after}s" {err.status_code}
	}`)
	c.Get("/")
	resp, body := c.Get("/")
	if resp.StatusCode != 429 || !regexp.MustCompile(`^limited by p, retry in \d+s$`).MatchString(body) {
		t.Fatalf("denied through handle_errors: %d %q", resp.StatusCode, body)
	}
	expectHeaders(t, "handle_errors", resp, map[string]string{"Retry-After": "1..60", "X-Ratelimit-Limit": "1"})
}

// TestCaddyShapingDelays sends a burst at a leaky bucket: requests are held,
// not refused, released no faster than the rate, never held past max_delay,
// and those beyond the queue are refused.
func TestCaddyShapingDelays(t *testing.T) {
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy shaped {
			limit 10/1s leaky_bucket max_delay 500ms
		}
	}
	respond ok`)
	const n = 12
	took := make([]time.Duration, n)
	status := make([]int, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			resp, _ := c.Get("/")
			took[i], status[i] = time.Since(start), resp.StatusCode
		}(i)
	}
	wg.Wait()
	var served []time.Duration
	refused := 0
	for i := range took {
		switch status[i] {
		case 200:
			served = append(served, took[i])
		case 429:
			refused++
		default:
			t.Fatalf("status %d", status[i])
		}
	}
	sort.Slice(served, func(i, j int) bool { return served[i] < served[j] })
	// 10/s is one every 100ms; max_delay 500ms holds 5 behind the first.
	if len(served) != 6 || refused != n-6 {
		t.Fatalf("served %d, refused %d; want 6 and %d", len(served), refused, n-6)
	}
	last := served[len(served)-1]
	if last < 450*time.Millisecond || last > 800*time.Millisecond {
		t.Errorf("last shaped request answered after %s, want about 500ms (never past max_delay plus slack)", last)
	}
	for i := 1; i < len(served); i++ {
		if gap := served[i] - served[0]; gap < time.Duration(i)*100*time.Millisecond-30*time.Millisecond {
			t.Errorf("request %d released %s after the first: faster than 10/s", i, gap)
		}
	}
	t.Logf("released at %v", served)
	if m := c.Metrics(); !strings.Contains(m, `tollgate_decisions_total{limit="10/1s",plan="",policy="shaped",result="delayed"} 5`) {
		t.Error("metrics do not count 5 delayed requests")
	}
}

// TestCaddyReloadKeepsCounters reloads through the admin API: the same
// policy keeps its counters; a refused config leaves the old one running.
func TestCaddyReloadKeepsCounters(t *testing.T) {
	// Every response names the config that answered it in X-Config, the
	// 429s too (header runs before tollgate).
	site := func(version string, count int) string {
		return fmt.Sprintf(`
	header X-Config %s
	tollgate {
		policy p {
			limit %d/1m sliding_log
		}
	}
	respond %q`, version, count, version)
	}
	c := caddyproc.StartInProcess(t, site("v1", 3))
	c.Get("/")
	c.Get("/")
	if code, body := c.Load(site("v2", 3)); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	// v1 and v2 share one 3/1m counter with 2 spent: the 3rd request
	// passes, whichever of them takes it.
	resp, strays := getFromConfig(t, c, "v2")
	switch allowed := countAllowed(strays); {
	case allowed == 0 && (resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Remaining") != "0"):
		t.Fatalf("after reload: %d remaining %q; want the 3rd and last request of the old counter", resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining"))
	case allowed == 1 && resp.StatusCode != 429:
		t.Fatalf("after reload, the replaced config took the 3rd request and the new one then allowed a 4th: %d", resp.StatusCode)
	case allowed > 1:
		t.Fatalf("after reload, the replaced config allowed %d more requests, want at most 1", allowed)
	}
	if resp, _ := c.Get("/"); resp.StatusCode != 429 {
		t.Fatalf("after reload the quota should be spent: %d", resp.StatusCode)
	}
	code, body := c.Load(site("v3", 0))
	if code == 200 || !strings.Contains(body, `count`) {
		t.Fatalf("bad config: %d %s; want a refusal naming count", code, body)
	}
	if resp, _ := c.Get("/"); resp.StatusCode != 429 || resp.Header.Get("X-Config") != "v2" {
		t.Fatalf("after a refused reload: %d from config %q; want the old config, still limiting", resp.StatusCode, resp.Header.Get("X-Config"))
	}
	// A raised limit keeps what was used (as Kong's counters do): 3 of 5
	// spent, so one more passes with 1 left. The replaced 3/1m config
	// can only deny.
	if code, body := c.Load(site("v4", 5)); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	resp, strays = getFromConfig(t, c, "v4")
	if n := countAllowed(strays); n != 0 {
		t.Fatalf("the replaced 3/1m config allowed %d requests over its spent quota", n)
	}
	if resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Remaining") != "1" {
		t.Fatalf("raised limit: %d remaining %q, want the 3 used kept under 5/1m (1 left)", resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining"))
	}
	// Another window is another counter, which no request to the replaced
	// config touches.
	if code, body := c.Load(strings.Replace(site("v5", 5), "/1m", "/1h", 1)); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	if resp, _ := getFromConfig(t, c, "v5"); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Remaining") != "4" {
		t.Fatalf("new window: %d remaining %q, want a fresh 5/1h", resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining"))
	}
	// Adding a limit keeps the others' usage: Kong keys each period on its
	// own (kong/plugins/rate-limiting/policies/init.lua), and so does
	// tollgate on every store.
	if code, body := c.Load(strings.Replace(site("v6", 5), "limit 5/1m sliding_log", "limit 5/1h sliding_log\n\t\t\tlimit 100/1d", 1)); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	resp, strays = getFromConfig(t, c, "v6")
	used := 1 + countAllowed(strays) + 1 // v5's request, the replaced config's, this one
	if want := strconv.Itoa(5 - used); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Remaining") != want {
		t.Fatalf("a limit added: %d remaining %q, want the 5/1h's %d used kept (%s left)", resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining"), used, want)
	}
}

// getFromConfig sends GET / until a response carries X-Config: version,
// and returns it with the responses of other configs before it.
func getFromConfig(t *testing.T, c *caddyproc.Caddy, version string) (*http.Response, []*http.Response) {
	t.Helper()
	return getFromNewConfig(t, c, "config "+version, func(r *http.Response) bool { return r.Header.Get("X-Config") == version })
}

// getFromNewConfig sends GET / (with header) until fromNew says a response
// came from the config just loaded, named what, and returns it with the
// responses before it. For a moment after /load returns, the replaced
// config's server can still take a new connection (Caddy binds with
// SO_REUSEPORT): seen once in CI.
func getFromNewConfig(t *testing.T, c *caddyproc.Caddy, what string, fromNew func(*http.Response) bool, header ...string) (*http.Response, []*http.Response) {
	t.Helper()
	return getPathFromNewConfig(t, c, "/", what, fromNew, header...)
}

// getPathFromNewConfig is getFromNewConfig for GET path.
func getPathFromNewConfig(t *testing.T, c *caddyproc.Caddy, path, what string, fromNew func(*http.Response) bool, header ...string) (*http.Response, []*http.Response) {
	t.Helper()
	var strays []*http.Response
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		resp, _ := c.Get(path, header...)
		if fromNew(resp) {
			if len(strays) > 0 {
				t.Logf("%d request(s) answered by the replaced config before %s", len(strays), what)
			}
			return resp, strays
		}
		strays = append(strays, resp)
		http.DefaultClient.CloseIdleConnections()
	}
	t.Fatalf("no response from %s in 10 s (%d from others)", what, len(strays))
	return nil, nil
}

func countAllowed(responses []*http.Response) int {
	n := 0
	for _, r := range responses {
		if r.StatusCode == 200 {
			n++
		}
	}
	return n
}

// TestCaddyClientIPTrustedProxies: no client chooses its own key. An
// untrusted peer's X-Forwarded-For is ignored; behind a trusted proxy with
// trusted_proxies_strict the key is the rightmost address not in
// trusted_proxies, whatever the client prepends, however the proxies
// append or split the header, and an IPv4-mapped IPv6 form is the same
// key; without strict, a policy keyed on the client address is refused
// at load (POST /load and caddy validate), naming the policy and what to
// write, while a policy keyed otherwise loads.
func TestCaddyClientIPTrustedProxies(t *testing.T) {
	body := `
	tollgate {
		policy per-client {
			limit 3/1m
		}
	}
	respond "{client_ip}"`
	untrusted := caddyproc.Start(t, body)
	for i := 0; i < 3; i++ {
		untrusted.Get("/", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i))
	}
	if resp, ip := untrusted.Get("/", "X-Forwarded-For", "203.0.113.9"); resp.StatusCode != 429 {
		t.Fatalf("spoofed X-Forwarded-For from an untrusted peer changed the key: %d %q", resp.StatusCode, ip)
	}

	strict := caddyproc.StartGlobal(t, "\tservers {\n\t\ttrusted_proxies static 127.0.0.1/32 10.0.0.0/8\n\t\ttrusted_proxies_strict\n\t}", body)
	// The client is 198.51.100.7; 127.0.0.1 (the test) and 10.1.2.3 are
	// trusted proxies that appended what they saw. Each request prepends
	// or repeats entries the client wrote.
	forged := [][]string{
		{"X-Forwarded-For", "198.51.100.7"},
		{"X-Forwarded-For", "1.2.3.4, 198.51.100.7"},
		{"X-Forwarded-For", "5.6.7.8, 9.9.9.9, 198.51.100.7, 10.1.2.3"},
		{"X-Forwarded-For", "7.7.7.7", "X-Forwarded-For", "198.51.100.7"},
		{"X-Forwarded-For", "::ffff:198.51.100.7"},
		{"X-Forwarded-For", "garbage, 198.51.100.7:4711"},
	}
	var got []string
	for _, h := range forged {
		resp, ip := strict.Get("/", h...)
		got = append(got, fmt.Sprintf("%d %s", resp.StatusCode, ip))
	}
	want := []string{"200 198.51.100.7", "200 198.51.100.7", "200 198.51.100.7", "429 ", "429 ", "429 "}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("strict, request %d %v: %q, want %q (one client, one bucket of 3)", i+1, forged[i], got[i], want[i])
		}
	}
	if resp, ip := strict.Get("/", "X-Forwarded-For", "198.51.100.8"); resp.StatusCode != 200 || ip != "198.51.100.8" {
		t.Errorf("another client behind the same proxy: %d %q, want 200 (its own bucket)", resp.StatusCode, ip)
	}

	loose := caddyproc.StartGlobal(t, "\tservers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}", `
	tollgate {
		policy by-key {
			key {http.request.header.X-API-Key}
			limit 3/1m
		}
	}
	respond "ok"`)
	if resp, _ := loose.Get("/", "X-API-Key", "k"); resp.StatusCode != 200 {
		t.Fatalf("a policy keyed on a header behind trusted_proxies: %d, want it loaded and serving", resp.StatusCode)
	}
	status, answer := loose.Load(body)
	var refusal struct{ Error string }
	_ = json.Unmarshal([]byte(answer), &refusal)
	for _, want := range []string{`policy "per-client": keyed on the client address`, "leftmost X-Forwarded-For", "trusted_proxies_strict"} {
		if msg := refusal.Error; status == 200 || !strings.Contains(msg, want) {
			t.Errorf("POST /load of a client-address key behind trusted_proxies without strict: %d %q, want a refusal saying %q", status, msg, want)
		}
	}
	if resp, _ := loose.Get("/", "X-API-Key", "k"); resp.StatusCode != 200 {
		t.Errorf("after the refused load: %d, want the old config still serving", resp.StatusCode)
	}
	validateRefuses(t, loose, body, `policy \"per-client\": keyed on the client address`) // in a JSON log line
}

// validateRefuses runs `caddy validate` on c's Caddyfile with body, which
// must fail saying want; it returns the Caddyfile's path.
func validateRefuses(t *testing.T, c *caddyproc.Caddy, body, want string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(c.Caddyfile(body)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(caddyproc.Binary(t), "validate", "--config", file, "--adapter", "caddyfile").CombinedOutput()
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("caddy validate: %v %s, want a refusal saying %s", err, out, want)
	}
	return file
}

// TestTwoCaddiesShareRedis: two Caddy processes on one redis-server enforce
// one sliding-log limit: in no 1 s window (of Redis time) do they allow
// more than N together.
func TestTwoCaddiesShareRedis(t *testing.T) {
	srv := redistest.StartT(t)
	const n = 20
	body := fmt.Sprintf(`
	tollgate {
		store redis redis://%s
		policy shared {
			key all
			limit %d/1s sliding_log
		}
	}
	respond "{http.tollgate.decided_at}"`, srv.Addr, n)
	nodes := []*caddyproc.Caddy{caddyproc.Start(t, body), caddyproc.Start(t, body)}
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	var mu sync.Mutex
	var at []int64
	denied := 0
	var wg sync.WaitGroup
	for _, node := range nodes {
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(node *caddyproc.Caddy) {
				defer wg.Done()
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, node.URL+"/", nil)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					mu.Lock()
					if resp.StatusCode == 200 {
						us, err := strconv.ParseInt(string(b), 10, 64)
						if err != nil {
							t.Errorf("body %q is not a decision time", b)
						}
						at = append(at, us)
					} else {
						denied++
					}
					mu.Unlock()
				}
			}(node)
		}
	}
	wg.Wait()
	worst := mostInWindow(at, time.Second)
	t.Logf("allowed %d, denied %d; most allowed in any 1s window: %d (limit %d)", len(at), denied, worst, n)
	if worst > n {
		t.Fatalf("%d allowed within 1s across two Caddies, limit %d", worst, n)
	}
	if len(at) < 2*n || denied == 0 {
		t.Fatalf("allowed %d, denied %d: the load did not reach the limit", len(at), denied)
	}
}

// TestCaddyPlans: one route, three plans chosen by a map of the API key;
// each plan's requests get its limits exactly, the unlimited plan passes
// uncounted, an unmapped key takes the default plan, and a key moved from
// free to pro by a reload keeps what it used. Headers, a placeholder and
// the metrics name the plan in force.
func TestCaddyPlans(t *testing.T) {
	site := func(alice string) string {
		return `
	map {http.request.header.X-Key} {plan} {
		alice ` + alice + `
		bob   pro
		svc   internal
	}
	tollgate {
		policy api {
			key {http.request.header.X-Key}
			plan {plan}
			plans {
				free 2/1m
				pro 4/1m
				internal unlimited
			}
			default_plan free
		}
		headers ietf
	}
	respond "ok {http.tollgate.plan}"`
	}
	c := caddyproc.StartInProcess(t, site("free"))
	statuses := func(key string, n int) string {
		var got []string
		for i := 0; i < n; i++ {
			resp, _ := c.Get("/", "X-Key", key)
			got = append(got, strconv.Itoa(resp.StatusCode))
		}
		return strings.Join(got, " ")
	}
	for _, tc := range []struct {
		key  string
		n    int
		want string
	}{
		{"alice", 3, "200 200 429"},
		{"bob", 5, "200 200 200 200 429"},
		{"svc", 8, "200 200 200 200 200 200 200 200"},
		{"eve", 3, "200 200 429"}, // not in the map: the default plan
	} {
		if got := statuses(tc.key, tc.n); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.key, got, tc.want)
		}
	}
	resp, _ := c.Get("/", "X-Key", "bob")
	expectHeaders(t, "bob", resp, map[string]string{"Ratelimit-Policy": `"api-pro";q=4;w=60`})
	if !strings.HasPrefix(resp.Header.Get("Ratelimit"), `"api-pro";r=0;`) {
		t.Errorf("bob's RateLimit %q, want the pro plan's item", resp.Header.Get("Ratelimit"))
	}
	// The unlimited plan is not counted: no decision, so no headers and no
	// tollgate placeholders (as for a request no policy covers).
	if resp, _ := c.Get("/", "X-Key", "svc"); resp.StatusCode != 200 || resp.Header.Get("Ratelimit-Policy") != "" {
		t.Errorf("unlimited plan: %d, RateLimit-Policy %q; want no decision and no headers", resp.StatusCode, resp.Header.Get("Ratelimit-Policy"))
	}
	if resp, body := c.Get("/", "X-Key", "newcomer"); body != "ok free" || resp.StatusCode != 200 {
		t.Errorf("default plan: %d %q", resp.StatusCode, body)
	}
	m := c.Metrics()
	for _, want := range []string{
		`tollgate_decisions_total{limit="4/1m",plan="pro",policy="api",result="allowed"} 4`,
		`tollgate_decisions_total{limit="4/1m",plan="pro",policy="api",result="denied"} 2`,
		`tollgate_decisions_total{limit="2/1m",plan="free",policy="api",result="denied"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// alice upgrades: her 2 requests count against pro's 4.
	if code, body := c.Load(site("pro")); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	// For a moment after /load returns, the replaced config can still take
	// a connection (see getFromNewConfig); it can only deny alice, whose
	// free quota is spent. Her requests are counted as pro's answers them.
	onPro := func() string {
		resp, strays := getFromNewConfig(t, c, "the pro plan", func(r *http.Response) bool {
			return strings.HasPrefix(r.Header.Get("Ratelimit-Policy"), `"api-pro"`)
		}, "X-Key", "alice")
		for _, r := range strays {
			if r.StatusCode != 429 {
				t.Fatalf("the replaced config allowed alice over her spent free quota: %d", r.StatusCode)
			}
		}
		return strconv.Itoa(resp.StatusCode)
	}
	if got := onPro() + " " + onPro() + " " + onPro(); got != "200 200 429" {
		t.Errorf("alice on pro after 2 on free: %s, want 200 200 429 (usage kept)", got)
	}
}

// TestCaddyTopDeniedKeys: a real Caddy exports the keys each policy denied
// most as tollgate_top_denied{policy,key}: the 10 heaviest of 1,010 keys
// (of 100,010 in `make chaos`), hashed (core.KeyHash) unless the policy
// shows keys in clear, and no more than 10 series per policy.
func TestCaddyTopDeniedKeys(t *testing.T) {
	// Light keys are denied once each. Space-Saving with k counters keeps
	// every key denied more than N/k times (N denials in all), so with
	// 100,000 light keys the heavy ones need more than 100 each (k=1000);
	// their counts may then be overestimated by the admin API's error.
	lights, heavy := 1000, 11
	long := os.Getenv("TOLLGATE_CHAOS") == "long"
	if long {
		lights, heavy = 100_000, 300
	}
	testclock.New(t, midMinute).InProcess() // no window turns between its requests
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy api {
			match {
				path /api
			}
			key {http.request.header.X-Key}
			limit 1/1h fixed_window
		}
		policy internal {
			match {
				path /internal
			}
			key {http.request.header.X-Key}
			limit 1/1h fixed_window
			clear_keys
		}
	}
	respond "ok"`)
	began := time.Now()
	var wg sync.WaitGroup
	send := func(path, key string, n int) {
		defer wg.Done()
		for i := 0; i < n; i++ {
			c.Get(path, "X-Key", key)
		}
	}
	for i := 0; i < 10; i++ {
		wg.Add(2)
		go send("/api", "heavy-"+strconv.Itoa(i), heavy+1+i) // heavy+i denials
		go send("/internal", "team-"+strconv.Itoa(i), 3)
	}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < lights; i += 8 { // one denial each
				c.Get("/api", "X-Key", "light-"+strconv.Itoa(i))
				c.Get("/api", "X-Key", "light-"+strconv.Itoa(i))
			}
		}(g)
	}
	wg.Wait()
	if took := time.Since(began); took >= gate.TopDeniedPeriod {
		t.Fatalf("the denials took %v: the sketch halved its counts meanwhile, so they cannot be checked (about 14 s in make chaos)", took)
	}
	m := c.Metrics()
	series := regexp.MustCompile(`(?m)^tollgate_top_denied\{key="([^"]+)",policy="api"\} (\d+)$`).FindAllStringSubmatch(m, -1)
	if len(series) != 10 {
		t.Fatalf("%d top_denied series for policy api, want 10:\n%v", len(series), series)
	}
	got := map[string]string{}
	for _, s := range series {
		got[s[1]] = s[2]
	}
	_, top := adminCall(t, c, "GET", "/tollgate/top?policy=api")
	counted := map[string][2]float64{} // hash: denials, error
	for _, h := range top["top_denied"].([]any) {
		m := h.(map[string]any)
		counted[m["key"].(string)] = [2]float64{m["denials"].(float64), m["overcount"].(float64)}
	}
	for i := 0; i < 10; i++ {
		key, want := "heavy-"+strconv.Itoa(i), heavy+i
		if !long {
			if n := got[core.KeyHash(key)]; n != strconv.Itoa(want) {
				t.Errorf("%s (hash %s): %q denials shown, want %d", key, core.KeyHash(key), n, want)
			}
			continue
		}
		// Found, with its true count within the sketch's error bound.
		c, ok := counted[core.KeyHash(key)]
		if _, shown := got[core.KeyHash(key)]; !shown || !ok || c[0] < float64(want) || c[0]-c[1] > float64(want) {
			t.Errorf("%s (hash %s): shown %v, counted %v (denials, error); want %d within the error", key, core.KeyHash(key), shown, c, want)
		}
	}
	t.Logf("%d light keys: top of policy api %v", lights, got)
	if !strings.Contains(m, `tollgate_top_denied{key="team-3",policy="internal"} 2`) {
		t.Errorf("clear_keys policy: no series with its key in clear")
	}
	if strings.Contains(m, `key="heavy-`) {
		t.Error("policy api's keys appear in clear")
	}
}

// TestCaddyUnknownPlaceholdersRefused: a key placeholder no request can
// fill (no such name in Caddy's replacer, no map handler setting it) is
// refused at load, from a Caddyfile (caddy validate, POST /load) and from
// JSON (POST /load), naming the policy, the field and the placeholder;
// the running config keeps serving. A map destination loads, and keys
// per value; per-request placeholders (a header) load.
func TestCaddyUnknownPlaceholdersRefused(t *testing.T) {
	c := caddyproc.Start(t, `
	map {http.request.header.X-Tenant} {tenant} {
		a  tenant-a
		b  tenant-b
		default anon
	}
	tollgate {
		policy per-tenant {
			key {tenant}
			limit 1/1m
		}
	}
	respond "ok"`)
	for _, h := range [][]string{{"X-Tenant", "a"}, {"X-Tenant", "b"}} {
		if resp, _ := c.Get("/", h...); resp.StatusCode != 200 {
			t.Fatalf("tenant %s's first request: %d, want 200 (a map destination is a key)", h[1], resp.StatusCode)
		}
	}
	if resp, _ := c.Get("/", "X-Tenant", "a"); resp.StatusCode != 429 {
		t.Fatalf("tenant a's second request: %d, want 429", resp.StatusCode)
	}
	refused := `
	tollgate {
		policy typo {
			key {no_such_placeholder}
			limit 1/1m
		}
	}
	respond "ok"`
	want := "policy \"typo\" key: {no_such_placeholder} is not a placeholder a request fills"
	status, answer := c.Load(refused)
	var refusal struct{ Error string }
	_ = json.Unmarshal([]byte(answer), &refusal)
	if status == 200 || !strings.Contains(refusal.Error, want) {
		t.Errorf("POST /load of a Caddyfile keyed on {no_such_placeholder}: %d %q, want a refusal saying %q", status, refusal.Error, want)
	}
	if resp, _ := c.Get("/", "X-Tenant", "c"); resp.StatusCode != 200 {
		t.Errorf("after the refused load: %d, want the old config serving", resp.StatusCode)
	}
	file := validateRefuses(t, c, refused, `{no_such_placeholder} is not a placeholder a request fills`)
	// The same config as JSON, its key "{nope}".
	adapted, err := exec.Command(caddyproc.Binary(t), "adapt", "--config", file, "--adapter", "caddyfile").Output()
	if err != nil {
		t.Fatal(err)
	}
	config := strings.Replace(string(adapted), `"key":"{no_such_placeholder}"`, `"key":"{nope}"`, 1)
	if config == string(adapted) {
		t.Fatalf("the adapted config has no key to replace: %s", adapted)
	}
	resp, err := http.Post(c.AdminURL+"/load", "application/json", strings.NewReader(config))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	if resp.StatusCode == 200 || !strings.Contains(string(body), `{nope} is not a placeholder a request fills`) {
		t.Errorf("POST /load of JSON keyed on {nope}: %d %s, want the refusal", resp.StatusCode, body)
	}
}

// TestCaddyPlaceholdersWhereNoPolicyApplies: on a path no policy covers,
// the http.tollgate.* placeholders read empty, not as written.
func TestCaddyPlaceholdersWhereNoPolicyApplies(t *testing.T) {
	testclock.New(t, midMinute).InProcess() // no window turns between its requests
	c := caddyproc.StartInProcess(t, `
	tollgate {
		policy api {
			match {
				path /api/*
			}
			limit 5/1m
		}
	}
	respond "[{http.tollgate.remaining}|{http.tollgate.policy}|{http.tollgate.limit}]"`)
	if _, body := c.Get("/api/x"); body != "[4|api|5/1m]" {
		t.Errorf("a covered path: %q, want [4|api|5/1m]", body)
	}
	if _, body := c.Get("/elsewhere"); body != "[||]" {
		t.Errorf("a path no policy covers: %q, want [||]", body)
	}
}

// TestCaddyREADMEExample runs README's Caddyfile in a real Caddy: / is
// the per-client policy's (five in 10 s), /api/* the api policy's alone
// (a burst of 20 per API key).
func TestCaddyREADMEExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```\n:8080 \\{\n(.*?)\n\\}\n```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md: no Caddyfile block for :8080")
	}
	c := caddyproc.StartInProcess(t, string(m[1]))
	var root []int
	for i := 0; i < 7; i++ {
		resp, _ := c.Get("/")
		root = append(root, resp.StatusCode)
	}
	if fmt.Sprint(root) != "[200 200 200 200 200 429 429]" {
		t.Errorf("/: %v, want five 200s and 429s (per-client, 5/10s)", root)
	}
	admitted := 0
	for i := 0; i < 25; i++ {
		resp, _ := c.Get("/api/x", "X-API-Key", "k1")
		if resp.StatusCode == 200 {
			admitted++
		}
		if p := resp.Header.Get("RateLimit-Policy"); !strings.HasPrefix(p, `"api"`) {
			t.Fatalf("/api/x: RateLimit-Policy %q, want the api policy's alone", p)
		}
	}
	// A burst of 20 (and a token every 100 ms while the requests run).
	if admitted < 20 {
		t.Errorf("/api/x: %d of 25 admitted, want the api policy's burst of 20, not per-client's 5", admitted)
	}
	// Without the header a client is keyed by its address: 30 keyless
	// requests cannot all pass (they did while empty_key skip was the
	// default).
	keyless := 0
	for i := 0; i < 30; i++ {
		if resp, _ := c.Get("/api/x"); resp.StatusCode == 200 {
			keyless++
		}
	}
	if keyless > 25 {
		t.Errorf("/api/x without X-API-Key: %d of 30 admitted, want at most the burst of 20 and the refill", keyless)
	}
}
