//go:build kongreal

package kongreal

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/redistest"
	"github.com/tollgate/tollgate/internal/waitfor"
)

// The usage every answer of the model upstream reports.
const (
	modelPrompt, modelCompletion, modelTotal = 11, 19, 30
)

// startModel starts, for test t, an OpenAI-compatible chat completions
// endpoint: a JSON answer with its usage, or with "stream": true a
// server-sent-event stream of three chunks, each flushed on its own, then
// a usage chunk when the request asks for it
// (stream_options.include_usage, as OpenAI's API does), then the
// stream's end marker.
func startModel(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream        bool `json:"stream"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, modelPrompt, modelCompletion, modelTotal)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"a usage of words"},"finish_reason":"stop"}],"usage":%s}`, usage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i, word := range []string{"a ", "usage ", "of words"} {
			finish := "null"
			if i == 2 {
				finish = `"stop"`
			}
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", word, finish)
			w.(http.Flusher).Flush()
		}
		if req.StreamOptions.IncludeUsage {
			fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":%s}\n\n", usage)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1/chat/completions"
}

// chat posts a chat completion request through Kong's proxy as user and
// returns the status and the body.
func chat(t *testing.T, k *Kong, path, user, body string) (int, string) {
	t.Helper()
	status, got, _ := chatHeaders(t, k, path, user, body)
	return status, got
}

// chatHeaders is chat, with the answer's headers.
func chatHeaders(t *testing.T, k *Kong, path, user, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, k.ProxyURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	rd := bufio.NewReader(resp.Body)
	if _, err := io.Copy(&b, rd); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b.String(), resp.Header
}

// aiRoute adds to d a route /name to model through ai-proxy (provider
// openai, logging its statistics) with tollgate-response limiting each
// X-User header to 100 tokens an hour (fields add to its config), and
// tollgate-ai-usage when companion is set.
func aiRoute(d Declarative, name, model string, fields map[string]any, companion bool) {
	config := map[string]any{
		"limit_by": "header", "header_name": "X-User",
		// an hour's sliding log: no window boundary within a test
		"limits": []any{map[string]any{"count": 100, "window": "1h", "algorithm": "sliding_log"}},
	}
	maps.Copy(config, fields)
	plugins := []any{
		map[string]any{"name": "ai-proxy", "config": map[string]any{
			"route_type": "llm/v1/chat",
			"logging":    map[string]any{"log_statistics": true},
			"model":      map[string]any{"provider": "openai", "name": "gpt-4o", "options": map[string]any{"upstream_url": model}},
		}},
		map[string]any{"name": "tollgate-response", "config": config},
	}
	if companion {
		plugins = append(plugins, map[string]any{"name": "tollgate-ai-usage"})
	}
	d.AddService(map[string]any{"name": name, "url": "http://127.0.0.1:9", "routes": []any{map[string]any{
		"name": name, "paths": []string{"/" + name}, "plugins": plugins}}})
}

const (
	buffered     = `{"messages":[{"role":"user","content":"hi"}]}`
	streamed     = `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`
	streamedBare = `{"messages":[{"role":"user","content":"hi"}],"stream":true}`
)

// TestKongChargesAnAnswersTokens runs token budgets in real Kong 3.9.3
// behind its own AI Gateway (ai-proxy, provider openai, pointed at an
// OpenAI-compatible upstream): tollgate-response charges each answer the
// tokens it spent, as ai-proxy counted a buffered answer and as the
// stream itself reported a streamed one (tollgate-ai-usage, since Kong's
// own count of an OpenAI stream is an estimate), and an answer that
// reports no usage the charge's cost, said once in Kong's log.
func TestKongChargesAnAnswersTokens(t *testing.T) {
	model := startModel(t)
	socket := filepath.Join(t.TempDir(), "admin.sock")
	k := Start(t, Options{LuaPlugins: []string{"tollgate-ai-usage"}, Env: map[string][]string{"tollgate-response": {"TOLLGATE_ADMIN_SOCKET=" + socket}}})
	d := NewDeclarative("/probe-ai")
	route := func(name string, charge map[string]any, companion bool) {
		aiRoute(d, name, model, map[string]any{"charge": charge}, companion)
	}
	aiRoute(d, "total", model, map[string]any{"charge": map[string]any{"usage": "total_tokens"}, "headers": "ai",
		"limits": []any{map[string]any{"count": 100, "window": "1h", "algorithm": "sliding_log", "name": "openai"}}}, true)
	route("completion", map[string]any{"usage": "completion_tokens"}, true)
	route("unreported", map[string]any{"usage": "total_tokens", "cost": 20}, false)
	aiRoute(d, "priced", model, map[string]any{"charge": map[string]any{"usage": "cost", "input_cost": 1000, "output_cost": 2000},
		"limits": []any{map[string]any{"count": 100000, "window": "1h", "algorithm": "sliding_log"}}}, true)
	k.MustLoad(d)
	admin := newAdminSocket(t, socket)
	before := k.ErrorLog()
	scope := func(name string) string { return fmt.Sprintf("route=%s,service=", k.ID("routes", name)) }

	// run sends bodies as user on route, waiting after each answer until
	// its charge is in the store, and returns the statuses.
	run := func(t *testing.T, route, user string, each int64, bodies ...string) []int {
		var statuses []int
		var used int64
		for _, body := range bodies {
			status, got := chat(t, k, "/"+route, user, body)
			statuses = append(statuses, status)
			if status != 200 {
				continue
			}
			if strings.Contains(body, `"stream":true`) && !strings.Contains(got, "data: [DONE]") {
				t.Errorf("a streamed answer reached the client as %q", got)
			}
			used = min(used+each, 100) // the API shows an overdrawn limit as used up
			want := used
			waitfor.True(t, 10*time.Second, fmt.Sprintf("%d used on %s", want, route), func() bool { return admin.used(t, scope(route), user) >= want })
		}
		return statuses
	}
	five := func(body string) []string { return []string{body, body, body, body, body} }
	// 100 tokens an hour, 30 an answer: the 4th overdraws (120), the 5th
	// is refused.
	t.Run("buffered, total tokens as ai-proxy counted them", func(t *testing.T) {
		if s := run(t, "total", "buffered", modelTotal, five(buffered)...); fmt.Sprint(s) != "[200 200 200 200 429]" {
			t.Errorf("statuses %v, want four 200s then a 429", s)
		}
	})
	t.Run("streamed, total tokens as the stream reported them", func(t *testing.T) {
		if s := run(t, "total", "streamed", modelTotal, five(streamed)...); fmt.Sprint(s) != "[200 200 200 200 429]" {
			t.Errorf("statuses %v, want four 200s then a 429", s)
		}
	})
	// headers ai: the set Kong's AI rate limiting sends, named by the
	// limit's window and its name, the provider.
	t.Run("what a client sees", func(t *testing.T) {
		status, _, h := chatHeaders(t, k, "/total", "headers", buffered)
		if status != 200 || h.Get("X-AI-RateLimit-Limit-3600-openai") != "100" || h.Get("X-AI-RateLimit-Remaining-3600-openai") != "100" ||
			h.Get("X-AI-RateLimit-Reset") == "" || h.Get("X-RateLimit-Limit-Minute") != "" {
			t.Errorf("an admitted answer: %d %v; want X-AI-RateLimit-Limit-3600-openai 100, -Remaining- 100, -Reset", status, h)
		}
		// user "buffered" spent the hour's budget above
		status, body, h := chatHeaders(t, k, "/total", "buffered", buffered)
		if status != 429 || h.Get("X-AI-RateLimit-Remaining-3600-openai") != "0" || h.Get("X-AI-RateLimit-Retry-After-3600-openai") == "" ||
			h.Get("Retry-After") == "" || !strings.Contains(body, `"API rate limit exceeded for provider openai"`) {
			t.Errorf("a refused request: %d %q %v; want 429, the provider named, X-AI-RateLimit-Retry-After-3600-openai and Retry-After", status, body, h)
		}
	})
	// 19 completion tokens an answer: 6 answers are admitted (95 before the
	// 6th), the 7th refused.
	t.Run("streamed, completion tokens", func(t *testing.T) {
		bodies := append(five(streamed), streamed, streamed)
		if s := run(t, "completion", "streamed", modelCompletion, bodies...); fmt.Sprint(s) != "[200 200 200 200 200 200 429]" {
			t.Errorf("statuses %v, want six 200s then a 429", s)
		}
	})
	// usage cost: 11 prompt tokens at 1000 a million and 19 completion
	// tokens at 2000 a million cost 49,000 millionths an answer; a budget
	// of 100,000 admits three answers (98,000 before the third).
	t.Run("the cost of the tokens", func(t *testing.T) {
		var statuses []int
		var used int64
		for _, body := range []string{buffered, streamed, buffered, streamed} {
			status, _ := chat(t, k, "/priced", "priced", body)
			statuses = append(statuses, status)
			if status == 200 {
				used = min(used+49000, 100000)
				want := used
				waitfor.True(t, 10*time.Second, fmt.Sprintf("%d used", want), func() bool { return admin.used(t, scope("priced"), "priced") >= want })
			}
		}
		if fmt.Sprint(statuses) != "[200 200 200 429]" {
			t.Errorf("statuses %v, want three 200s then a 429", statuses)
		}
	})
	// Without tollgate-ai-usage a stream's usage is not seen (Kong's own
	// count of an OpenAI stream is an estimate): each answer is charged
	// the charge's cost, 20, and Kong's log says so once per plugin
	// instance (Kong starts one per worker), not once per answer.
	t.Run("a stream without tollgate-ai-usage is charged the cost", func(t *testing.T) {
		if s := run(t, "unreported", "streamed", 20, streamed, streamedBare, streamed, streamedBare, streamed, streamed); fmt.Sprint(s) != "[200 200 200 200 200 429]" {
			t.Errorf("statuses %v, want five 200s then a 429", s)
		}
		var warned []string
		waitfor.True(t, 10*time.Second, "Kong's log warns of the unreported usage", func() bool {
			warned = nil
			for _, l := range strings.Split(strings.TrimPrefix(k.ErrorLog(), before), "\n") {
				if strings.Contains(l, "[warn]") && strings.Contains(l, "reported no usage") {
					warned = append(warned, l)
				}
			}
			return len(warned) > 0
		})
		if len(warned) > 2 || !strings.Contains(warned[0], "tollgate-ai-usage") || !strings.Contains(warned[0], "cost 20") {
			t.Errorf("Kong's log after five answers without usage: %q, want one [warn] per Kong worker at most (2), naming tollgate-ai-usage and cost 20", warned)
		}
	})
	if errs := kongErrors(k, before); len(errs) > 0 {
		t.Errorf("Kong's log has %d errors:\n%s", len(errs), strings.Join(errs[:min(len(errs), 10)], "\n"))
	}
}

// TestKongTwoNodesShareATokenBudget: two Kong nodes behind one Redis hold
// one token budget exactly, answers buffered on one node and streamed on
// the other: 100 tokens an hour at 30 an answer admit four answers
// between them, and then each node refuses.
func TestKongTwoNodesShareATokenBudget(t *testing.T) {
	model := startModel(t)
	rds := redistest.StartT(t)
	socket := filepath.Join(t.TempDir(), "admin.sock")
	d := NewDeclarative("/probe-ai-fleet")
	aiRoute(d, "fleet", model, map[string]any{"charge": map[string]any{"usage": "total_tokens"}, "policy": "redis",
		"redis": map[string]any{"host": rds.KongRecord()["host"], "port": rds.KongRecord()["port"], "timeout": 500}}, true)
	nodes := []*Kong{
		Start(t, Options{LuaPlugins: []string{"tollgate-ai-usage"}, Env: map[string][]string{"tollgate-response": {"TOLLGATE_ADMIN_SOCKET=" + socket}}}),
		Start(t, Options{LuaPlugins: []string{"tollgate-ai-usage"}}),
	}
	for _, k := range nodes {
		k.MustLoad(d)
	}
	admin := newAdminSocket(t, socket) // node 0's, reading the one Redis
	scope := fmt.Sprintf("route=%s,service=", nodes[0].ID("routes", "fleet"))
	if other := fmt.Sprintf("route=%s,service=", nodes[1].ID("routes", "fleet")); other != scope {
		t.Fatalf("the nodes name the route %s and %s: their counters are not one", scope, other)
	}
	var statuses []int
	var used int64
	for i := 0; i < 6; i++ {
		k, body := nodes[i%2], buffered
		if i%2 == 1 {
			body = streamed
		}
		status, _ := chat(t, k, "/fleet", "shared", body)
		statuses = append(statuses, status)
		if status == 200 {
			used = min(used+modelTotal, 100)
			want := used
			waitfor.True(t, 10*time.Second, fmt.Sprintf("%d used after answer %d", want, i+1), func() bool { return admin.used(t, scope, "shared") >= want })
		}
	}
	if fmt.Sprint(statuses) != "[200 200 200 200 429 429]" {
		t.Errorf("statuses %v, want four 200s between the two nodes, then each refusing", statuses)
	}
}

// TestKongAIDocsExample loads the route docs/ai.md shows into real Kong as
// it is written, but for ai-proxy's upstream (the test's model) and its
// key, and sends it a chat: tollgate-response answers with the budget's
// X-AI-RateLimit-* headers and charges the answer's tokens.
func TestKongAIDocsExample(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "ai.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(page), "## Kong")
	_, block, _ := strings.Cut(after, "```yaml\n")
	block, _, _ = strings.Cut(block, "```")
	model := startModel(t)
	for old, new := range map[string]string{
		"model: {provider: openai, name: gpt-4o}": "model: {provider: openai, name: gpt-4o, options: {upstream_url: " + model + "}}",
		"Bearer <key>": "Bearer test-key",
	} {
		if !strings.Contains(block, old) {
			t.Fatalf("docs/ai.md's Kong example no longer has %q: update this test with it", old)
		}
		block = strings.ReplaceAll(block, old, new)
	}
	config := "_format_version: \"3.0\"\nservices:\n- name: chat\n  url: http://127.0.0.1:9\n  " + strings.ReplaceAll(strings.TrimSpace(block), "\n", "\n  ") + "\n"
	socket := filepath.Join(t.TempDir(), "admin.sock")
	k := Start(t, Options{Declarative: config, LuaPlugins: []string{"tollgate-ai-usage"}, Env: map[string][]string{"tollgate-response": {"TOLLGATE_ADMIN_SOCKET=" + socket}}})
	admin := newAdminSocket(t, socket)
	for i, body := range []string{buffered, streamed} {
		status, _, h := chatHeaders(t, k, "/chat", "", body)
		left := fmt.Sprint(100000 - modelTotal*i)
		if status != 200 || h.Get("X-AI-RateLimit-Limit-86400-openai") != "100000" || h.Get("X-AI-RateLimit-Remaining-86400-openai") != left {
			t.Fatalf("answer %d: %d %v; want 200, X-AI-RateLimit-Limit-86400-openai 100000 and %s remaining", i+1, status, h, left)
		}
		want := int64(modelTotal * (i + 1))
		// no consumer: keyed by the client's address, as Kong's rate-limiting falls back
		scope := fmt.Sprintf("route=%s,service=", k.ID("routes", "chat"))
		waitfor.True(t, 10*time.Second, fmt.Sprintf("%d tokens used", want), func() bool { return admin.used(t, scope, "127.0.0.1") >= want })
	}
}
