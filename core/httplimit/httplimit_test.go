package httplimit

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/config"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/store/memory"
	"github.com/tollgate/tollgate/internal/waitfor"
)

func newServer(t *testing.T, cfg Config) *httptest.Server {
	t.Helper()
	mw, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func TestLimitsPerKeyWithHeadersAndBody(t *testing.T) {
	store := memory.MustNew(memory.Options{})
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 2, Window: time.Minute, Algorithm: algo.SlidingLog})
	srv := newServer(t, Config{
		Rules:   []Rule{{Limiter: core.NewLimiter(p, store), Key: Header("X-Api-Key")}},
		Headers: headers.Options{Style: headers.Both},
		Body:    "slow down\n",
	})
	alice := map[string]string{"X-Api-Key": "alice"}
	for i, wantRemaining := range []string{"1", "0"} {
		resp, body := get(t, srv.URL, alice)
		if resp.StatusCode != 200 || body != "ok" || resp.Header.Get("X-Ratelimit-Remaining") != wantRemaining {
			t.Fatalf("request %d: %d %q remaining %q", i, resp.StatusCode, body, resp.Header.Get("X-Ratelimit-Remaining"))
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != `"api";q=2;w=60` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
	}
	resp, body := get(t, srv.URL, alice)
	if resp.StatusCode != 429 || body != "slow down\n" || resp.Header.Get("Retry-After") != "60" {
		t.Fatalf("denial: %d %q Retry-After %q", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if got := resp.Header.Get("RateLimit"); got != `"api";r=0;t=60` {
		t.Fatalf("RateLimit %q", got)
	}
	// Another key has its own quota; a request without the header is keyed
	// by the client's address (gate.EmptyKeyClient, the default).
	if resp, _ := get(t, srv.URL, map[string]string{"X-Api-Key": "bob"}); resp.StatusCode != 200 {
		t.Fatalf("bob: %d", resp.StatusCode)
	}
	for i, want := range []int{200, 200, 429} {
		if resp, _ := get(t, srv.URL, nil); resp.StatusCode != want || resp.Header.Get("X-Ratelimit-Limit") != "2" {
			t.Fatalf("keyless %d: %d %v, want %d under the client address's quota", i+1, resp.StatusCode, resp.Header, want)
		}
	}
}

func TestShapingDelaysInsteadOfDenying(t *testing.T) {
	store := memory.MustNew(memory.Options{})
	p := core.MustPolicy("shape", core.PolicyOptions{}, algo.Limit{Count: 10, Window: time.Second, Algorithm: algo.LeakyBucket, MaxDelay: 300 * time.Millisecond})
	srv := newServer(t, Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store)}}})
	start := time.Now()
	for i := 0; i < 4; i++ {
		if resp, _ := get(t, srv.URL, nil); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	// Four requests at 10/s leave 100ms apart: the last after ≥ 300ms.
	if el := time.Since(start); el < 290*time.Millisecond {
		t.Fatalf("4 shaped requests took %v, want ≥ 300ms", el)
	}
}

func TestStackedRulesAndShadow(t *testing.T) {
	store := memory.MustNew(memory.Options{})
	shadow := core.MustPolicy("trial", core.PolicyOptions{Shadow: true}, algo.Limit{Count: 1, Window: time.Minute, Algorithm: algo.FixedWindow})
	real := core.MustPolicy("real", core.PolicyOptions{}, algo.Limit{Count: 3, Window: time.Minute, Algorithm: algo.FixedWindow})
	var shadowed int
	srv := newServer(t, Config{
		Rules: []Rule{{Limiter: core.NewLimiter(shadow, store)}, {Limiter: core.NewLimiter(real, store)}},
		OnDecision: func(r *http.Request, d *core.Decision) {
			if d.Shadowed {
				shadowed++
			}
		},
	})
	codes := []int{}
	for i := 0; i < 4; i++ {
		resp, _ := get(t, srv.URL, nil)
		codes = append(codes, resp.StatusCode)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 200 || codes[3] != 429 || shadowed != 3 {
		t.Fatalf("codes %v, shadowed %d", codes, shadowed)
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := New(Config{}); err == nil || err.Error() != "rules: need at least one" {
		t.Fatal(err)
	}
	p := core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Second})
	l := core.NewLimiter(p, memory.MustNew(memory.Options{}))
	if _, err := New(Config{Rules: []Rule{{Limiter: l}}, Status: 200}); err == nil || err.Error() != "status: 200 is not a 4xx or 5xx code" {
		t.Fatal(err)
	}
}

// TestInFlightSlotsGoBack: one slot in flight; a second request while the
// first runs is refused; the slot comes back when the handler returns, and
// also when it panics.
func TestInFlightSlotsGoBack(t *testing.T) {
	store := memory.MustNew(memory.Options{})
	p := core.MustPolicy("exports", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Minute, Algorithm: algo.InFlight})
	mw, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store)}}})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			entered <- struct{}{}
			<-release
		case "/panic":
			panic(http.ErrAbortHandler) // net/http's way to abort a response
		}
		_, _ = io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	done := make(chan int)
	go func() {
		resp, err := http.Get(srv.URL + "/slow")
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	<-entered
	if resp, _ := get(t, srv.URL+"/", nil); resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("while the slot is held: %d, Retry-After %q; want 429 and 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	close(release)
	if code := <-done; code != 200 {
		t.Fatalf("slow request: %d", code)
	}
	if resp, _ := get(t, srv.URL+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("after the slow request finished: %d, want the slot back", resp.StatusCode)
	}
	if _, err := http.Get(srv.URL + "/panic"); err == nil {
		t.Fatal("the aborted response arrived")
	}
	if resp, _ := get(t, srv.URL+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("after a handler panicked: %d, want the slot back", resp.StatusCode)
	}
}

// countingStore counts decisions per key (it adds to the memory store, the
// test's view of a waiting request polling).
type countingStore struct {
	*memory.Store
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingStore) Decide(ctx context.Context, p *core.Policy, key string, cost int64, d *core.Decision) error {
	c.mu.Lock()
	c.calls[key]++
	c.mu.Unlock()
	return c.Store.Decide(ctx, p, key, cost, d)
}

func (c *countingStore) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[key]
}

// TestInFlightWaitsForASlot: with max_delay, a request refused for want of
// a slot waits for one: it is served once the slot comes back, and refused
// (429) when none comes back within max_delay.
func TestInFlightWaitsForASlot(t *testing.T) {
	store := &countingStore{Store: memory.MustNew(memory.Options{}), calls: map[string]int{}}
	for _, tc := range []struct {
		maxDelay time.Duration
		release  bool
		want     int
	}{{time.Minute, true, 200}, {50 * time.Millisecond, false, 429}} {
		p := core.MustPolicy("exports", core.PolicyOptions{}, algo.Limit{Count: 1, Window: time.Minute, Algorithm: algo.InFlight, MaxDelay: tc.maxDelay})
		mw, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store), Key: func(r *http.Request) (string, bool) { return r.URL.Query().Get("k"), true }}}})
		if err != nil {
			t.Fatal(err)
		}
		entered, release := make(chan struct{}), make(chan struct{})
		srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				entered <- struct{}{}
				<-release
			}
		})))
		key := tc.maxDelay.String()
		go func() {
			if resp, err := http.Get(srv.URL + "/slow?k=" + key); err == nil {
				resp.Body.Close()
			}
		}()
		<-entered
		got := make(chan int)
		go func() {
			resp, err := http.Get(srv.URL + "/?k=" + key)
			if err != nil {
				got <- 0
				return
			}
			resp.Body.Close()
			got <- resp.StatusCode
		}()
		if tc.release {
			// Once the second request has asked again (it is waiting), the
			// first one's response finishes.
			waitfor.True(t, 10*time.Second, "the waiting request polls", func() bool { return store.count(key) >= 3 })
			close(release)
		}
		if code := <-got; code != tc.want {
			t.Errorf("max_delay %v, slot released %v: %d, want %d", tc.maxDelay, tc.release, code, tc.want)
		}
		if !tc.release {
			close(release)
		}
		srv.Close()
	}
}

// TestAdaptiveHearsUpstream checks that an adaptive rule hears the
// upstream's answers: failing answers make it cut its limit.
func TestAdaptiveHearsUpstream(t *testing.T) {
	a, err := adaptive.NewJudged(adaptive.Options{Controller: adaptive.ControllerAIMD, MinSamples: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p := core.MustPolicy("api", core.PolicyOptions{Adaptive: a}, algo.Limit{Count: 1000, Window: time.Minute, Algorithm: algo.FixedWindow})
	mw, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, memory.MustNew(memory.Options{}))}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})))
	defer srv.Close()
	for i := 0; i < 20; i++ {
		if resp, _ := get(t, srv.URL, nil); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	a.Judge()
	if f := a.Factor(); f >= 1 {
		t.Fatalf("factor %v after 20 failing answers, want below 1", f)
	}
}

// TestAdaptiveJudgesTimeToFirstByte: without a proxy's own measure, the
// latency an adaptive rule judges is the time to the response's first
// byte: a handler that answers its header at once and then takes 1 s over
// its body is judged fast (the body's time is the client's).
func TestAdaptiveJudgesTimeToFirstByte(t *testing.T) {
	a, err := adaptive.NewJudged(adaptive.Options{Controller: adaptive.ControllerAIMD, MinSamples: 5, LatencyTarget: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p := core.MustPolicy("api", core.PolicyOptions{Adaptive: a}, algo.Limit{Count: 1000, Window: time.Minute, Algorithm: algo.GCRA})
	mw, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, memory.MustNew(memory.Options{}))}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(time.Second)
		_, _ = io.WriteString(w, "late body")
	})))
	defer srv.Close()
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := http.Get(srv.URL); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	a.Judge()
	if q := a.LastQuantile(); q <= 0 || q >= 400*time.Millisecond || a.Factor() != 1 {
		t.Fatalf("judged %s, factor %v; want the time to the header (well under the body's 1 s) and the limit kept", q, a.Factor())
	}
}

// TestChargeAfterResponse: a rule charged after the response counts only
// the responses its charge prices (here 401s), and the charged response's
// headers already show what it left.
func TestChargeAfterResponse(t *testing.T) {
	mw, p := chargedMiddleware(t, "login", 2, config.Charge{Status: []string{"401"}})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("password") != "right" {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})))
	defer srv.Close()
	for i := 0; i < 5; i++ {
		if resp, _ := get(t, srv.URL+"/?password=right", nil); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "2" {
			t.Fatalf("success %d: %d, remaining %q; want 200 and 2 (not counted)", i+1, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
		}
	}
	for i := 1; i <= 2; i++ {
		if resp, _ := get(t, srv.URL+"/?password=wrong", nil); resp.StatusCode != 401 || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(2-i) {
			t.Fatalf("failure %d: %d, remaining %q; want 401 and %d", i, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), 2-i)
		}
	}
	if resp, _ := get(t, srv.URL+"/?password=right", nil); resp.StatusCode != 429 {
		t.Fatalf("after two failures: %d, want 429", resp.StatusCode)
	}
	// A policy charged after the response needs its charge.
	if _, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, memory.MustNew(memory.Options{}))}}}); err == nil {
		t.Fatal("a rule charged after the response without a Charge was accepted")
	}
}

// TestChargeReportedCost: a cost the upstream reports is charged when the
// response's status is written (a 200 included), so the response's own
// headers show it; the lines of a repeated cost header read as one field,
// however it is split; a number too large to hold takes the whole count.
func TestChargeReportedCost(t *testing.T) {
	mw, _ := chargedMiddleware(t, "tokens", 1000, config.Charge{CostHeader: "X-Usage", CostEntry: "total"})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, line := range r.URL.Query()["usage"] {
			w.Header().Add("X-Usage", line)
		}
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "completion")
	})))
	defer srv.Close()
	for _, tc := range []struct {
		query  string
		status int
		left   string // X-RateLimit-Remaining on this response, after its charge
	}{
		{"usage=total%3D150", 200, "850"},
		{"usage=total%3D10&usage=total%3D20", 200, "830"}, // two lines: the last entry, 20
		{"usage=total%3D10,%20total%3D20", 200, "810"},    // one line: the same
		{"usage=prompt%3D5&usage=total%3D" + strings.Repeat("9", 65), 200, "0"},
		{"usage=total%3D1", 429, "0"},
	} {
		resp, _ := get(t, srv.URL+"/?"+tc.query, nil)
		if resp.StatusCode != tc.status || resp.Header.Get("X-RateLimit-Remaining") != tc.left {
			t.Errorf("%s: %d, remaining %q; want %d and %s", tc.query, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), tc.status, tc.left)
		}
	}
}

// TestChargeTwoCostLines: an upstream that reports its cost on two lines
// of the header (100 and 200) is charged the larger, never nothing.
func TestChargeTwoCostLines(t *testing.T) {
	mw, _ := chargedMiddleware(t, "lines", 1000, config.Charge{CostHeader: "X-Usage"})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("X-Usage", "100")
		w.Header().Add("X-Usage", "200")
		w.WriteHeader(http.StatusOK)
	})))
	defer srv.Close()
	if resp, _ := get(t, srv.URL+"/", nil); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "800" {
		t.Errorf("X-Usage: 100 and X-Usage: 200: %d, remaining %q; want 200 and 800 (the larger charged)", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
}

// chargedMiddleware is middleware with one policy, name, of count an hour
// (a sliding log) charged after the response as charge says, with
// X-RateLimit headers, on a memory store.
func chargedMiddleware(t *testing.T, name string, count int64, charge config.Charge) (func(http.Handler) http.Handler, *core.Policy) {
	t.Helper()
	return chargedMiddlewareLogging(t, name, count, charge, nil)
}

// chargedMiddlewareLogging is chargedMiddleware logging to log.
func chargedMiddlewareLogging(t *testing.T, name string, count int64, charge config.Charge, log *slog.Logger) (func(http.Handler) http.Handler, *core.Policy) {
	t.Helper()
	l := algo.Limit{Count: count, Window: time.Hour, Algorithm: algo.SlidingLog, AfterResponse: true}
	p := core.MustPolicy(name, core.PolicyOptions{}, l)
	rc, err := charge.Compile()
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(Config{Rules: []Rule{{Limiter: core.NewLimiter(p, memory.MustNew(memory.Options{})), Charge: rc}},
		Headers: headers.Options{Style: headers.XRateLimit}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return mw, p
}

// TestNewRefusesARuleWithoutLimiter: a rule with no Limiter is an error
// naming the rule, not a panic.
func TestNewRefusesARuleWithoutLimiter(t *testing.T) {
	if _, err := New(Config{Rules: []Rule{{}}}); err == nil || !strings.Contains(err.Error(), "rules[0]: no Limiter") {
		t.Fatalf("a rule without a Limiter: %v, want an error naming rules[0]", err)
	}
}

// TestChargeAnAnswersTokens: the middleware charges a language model's
// answer the tokens its body reports (a stream's last usage event; a
// JSON answer's usage object), passing the stream on as it is written,
// and an answer without usage its charge's cost, said once in the log.
func TestChargeAnAnswersTokens(t *testing.T) {
	cost := int64(40)
	var logged bytes.Buffer
	mw, _ := chargedMiddlewareLogging(t, "llm", 100, config.Charge{Usage: "completion_tokens", Cost: &cost}, slog.New(slog.NewTextHandler(&logged, nil)))
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			for _, e := range []string{
				`{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}`,
				`{"type":"message_delta","usage":{"output_tokens":15}}`,
			} {
				_, _ = io.WriteString(w, "data: "+e+"\n\n")
				http.NewResponseController(w).Flush()
			}
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":10,"totalTokenCount":15}}`)
		default:
			_, _ = io.WriteString(w, "no usage here")
		}
	})))
	defer srv.Close()
	for _, tc := range []struct{ path, left string }{
		{"/stream", "100"}, // what is left before its own answer is charged
		{"/json", "85"},    // the stream's 15 completion tokens
		{"/other", "75"},   // the JSON answer's 10
		{"/json", "35"},    // the answer without usage: 40
		{"/other", "25"},   // the JSON answer's 10; a second answer without usage, not told again
	} {
		resp, _ := get(t, srv.URL+tc.path, nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != tc.left {
			t.Errorf("%s: %d, remaining %q; want 200 and %s", tc.path, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), tc.left)
		}
	}
	if n := strings.Count(logged.String(), "reported no usage"); n != 1 || !strings.Contains(logged.String(), "level=WARN") || !strings.Contains(logged.String(), "policies=[llm]") {
		t.Errorf("the log, after two answers without usage: %q; want one warning naming policy llm", logged.String())
	}
}
