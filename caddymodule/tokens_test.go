package caddymodule

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
)

// TestCaddyChargesAnAnswersTokens: a policy whose charge reads the
// tokens a language model's answer reports, behind reverse_proxy: a
// streamed answer reaches the client event by event (its first event
// before the upstream has written the rest: nothing held back), and is
// charged the total its last event reports once it ends; a JSON answer
// is charged its usage; an answer that reports none costs the charge's
// cost; the next request's headers show what is left.
func TestCaddyChargesAnAnswersTokens(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n")
			http.NewResponseController(w).Flush()
			select {
			case <-release: // the client read the first event
			case <-time.After(10 * time.Second):
			}
			_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":19,\"total_tokens\":30}}\n\ndata: [DONE]\n\n")
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"error":"no usage"}`)
		}
	}))
	defer upstream.Close()
	c := caddyproc.StartInProcess(t, fmt.Sprintf(`
	tollgate {
		policy tokens {
			key {http.request.header.X-Key}
			limit 100/1h
			charge {
				usage total_tokens
				cost 50
			}
		}
		headers xratelimit
	}
	reverse_proxy %s {
		flush_interval -1
	}`, upstream.URL))

	req, _ := http.NewRequest(http.MethodGet, c.URL+"/stream", nil)
	req.Header.Set("X-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := bufio.NewReader(resp.Body)
	first, err := body.ReadString('\n')
	if err != nil || !strings.Contains(first, `"Hel"`) {
		t.Fatalf("the stream's first event: %q, %v; want it before the upstream writes the rest", first, err)
	}
	close(release)
	rest, _ := io.ReadAll(body)
	resp.Body.Close()
	if !strings.Contains(string(rest), `"total_tokens":30`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the rest of the stream: %q", rest)
	}
	for _, tc := range []struct{ path, left string }{
		{"/json", "70"},  // 100 less the stream's 30
		{"/other", "58"}, // less the JSON answer's 12
		{"/json", "8"},   // less the answer without usage: the charge's cost, 50
	} {
		resp, _ := c.Get(tc.path, "X-Key", "k")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != tc.left {
			t.Errorf("%s: %d, %s remaining; want 200 and %s before its own answer is charged", tc.path, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), tc.left)
		}
	}
	if resp, _ := c.Get("/json", "X-Key", "k"); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("after 104 tokens of 100: %d, Retry-After %q; want 429 until the hour gives back", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}
