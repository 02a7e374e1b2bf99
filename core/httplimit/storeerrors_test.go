package httplimit

import (
	"bytes"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/headers"
	"github.com/tollgate/tollgate/core/store/failover"
	"github.com/tollgate/tollgate/core/store/redis"
	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// logBuffer is a slog destination the test reads while requests write.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.buf.String()), "\n")
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

func redisStore(t *testing.T, addr string) *redis.Store {
	t.Helper()
	s, err := redis.New(redis.Options{Settings: redis.Settings{Addrs: []string{addr}, Timeout: algo.Duration(200 * time.Millisecond)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A raw Redis store that stops answering: requests pass the rule (the
// default), and the outage is said once in the log when it starts and once
// when Redis answers again, and handed to OnError on every request.
func TestStoreOutageIsLoggedOnceAndReported(t *testing.T) {
	server := redistest.StartT(t)
	store := redisStore(t, server.Addr)
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 100, Window: time.Minute})
	var logs logBuffer
	var reported atomic.Int64
	var reportedPolicy atomic.Value
	srv := newServer(t, Config{
		Rules:   []Rule{{Limiter: core.NewLimiter(p, store)}},
		Headers: headers.Options{Style: headers.Both},
		Logger:  logs.logger(),
		OnError: func(r *http.Request, policy string, err error) {
			reported.Add(1)
			reportedPolicy.Store(policy + ": " + err.Error())
		},
	})
	if resp, _ := get(t, srv.URL, nil); resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") == "" {
		t.Fatalf("before the outage: %d %v", resp.StatusCode, resp.Header)
	}
	server.Stop()
	for range 5 {
		resp, _ := get(t, srv.URL, nil)
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != "" {
			t.Fatalf("during the outage, by default: %d %v, want 200 without headers (the rule skipped)", resp.StatusCode, resp.Header)
		}
	}
	if n := reported.Load(); n != 5 {
		t.Errorf("OnError heard %d errors, want 5 (one per request)", n)
	}
	if got, _ := reportedPolicy.Load().(string); !strings.HasPrefix(got, "api: ") {
		t.Errorf("OnError's policy and error: %q", got)
	}
	lines := logs.lines()
	if len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") || !strings.Contains(lines[0], "policy=api") || !strings.Contains(lines[0], "store=redis.Store") ||
		!strings.Contains(lines[0], "pass unlimited") || !strings.Contains(lines[0], "error=") {
		t.Fatalf("log during the outage:\n%s\nwant one ERROR line naming the policy, the error and what requests get", strings.Join(lines, "\n"))
	}
	if err := server.Restart(); err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, 10*time.Second, "a decision by Redis again", func() bool {
		resp, _ := get(t, srv.URL, nil)
		return resp.Header.Get("RateLimit-Policy") != ""
	})
	lines = logs.lines()
	if len(lines) != 2 || !strings.Contains(lines[1], "level=INFO") || !strings.Contains(lines[1], "answering again") || !strings.Contains(lines[1], "policy=api") {
		t.Fatalf("log after the outage:\n%s\nwant the ERROR line and one INFO line", strings.Join(lines, "\n"))
	}
}

// With DenyOnError the log says requests are refused, not passed.
func TestStoreOutageWithDenyOnErrorSaysSo(t *testing.T) {
	server := redistest.StartT(t)
	store := redisStore(t, server.Addr)
	server.Stop()
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 100, Window: time.Minute})
	var logs logBuffer
	srv := newServer(t, Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store)}}, DenyOnError: true, Logger: logs.logger()})
	for range 3 {
		if resp, _ := get(t, srv.URL, nil); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("status %d, want 503", resp.StatusCode)
		}
	}
	if lines := logs.lines(); len(lines) != 1 || !strings.Contains(lines[0], "answered 503") {
		t.Fatalf("log:\n%s", strings.Join(lines, "\n"))
	}
}

// Redis behind failover.New with zero Options (on_error local, a memory
// store of its own): a dead Redis leaves the limit in force on this node,
// and the log says once that the failure policy decides.
func TestFailoverKeepsTheLimitAndSaysSo(t *testing.T) {
	server := redistest.StartT(t)
	shared := redisStore(t, server.Addr)
	store, err := failover.New(shared, failover.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	server.Stop()
	p := core.MustPolicy("api", core.PolicyOptions{}, algo.Limit{Count: 3, Window: time.Hour, Algorithm: algo.FixedWindow})
	var logs logBuffer
	var errs atomic.Int64
	srv := newServer(t, Config{Rules: []Rule{{Limiter: core.NewLimiter(p, store)}}, Logger: logs.logger(),
		OnError: func(*http.Request, string, error) { errs.Add(1) }})
	var got []int
	for range 5 {
		resp, _ := get(t, srv.URL, nil)
		got = append(got, resp.StatusCode)
	}
	if want := []int{200, 200, 200, 429, 429}; !slices.Equal(got, want) {
		t.Fatalf("statuses %v, want %v: the fallback keeps the limit", got, want)
	}
	if n := errs.Load(); n != 0 {
		t.Errorf("OnError heard %d errors: the failure policy decided every request", n)
	}
	if lines := logs.lines(); len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "failure policy decides") || !strings.Contains(lines[0], "store=failover.Store") {
		t.Fatalf("log:\n%s\nwant one WARN line", strings.Join(lines, "\n"))
	}
}
