package usage

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/tollgate/tollgate/core/algo"
)

// The answers below are in the shape each provider's API documents
// (OpenAI chat completions and their stream with stream_options
// include_usage; Anthropic messages and their stream; Gemini
// generateContent and streamGenerateContent?alt=sse), with contents that
// try to look like usage.

const openAIJSON = `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o",
 "choices":[{"index":0,"message":{"role":"assistant","content":"\"usage\": {\"total_tokens\": 999}","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"usage\":{\"prompt_tokens\":5000}}"}}]},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":11,"completion_tokens":19,"total_tokens":30,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`

const openAISSE = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"lo \\\"usage\\\"\"}}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":19,\"total_tokens\":30}}\n\n" +
	"data: [DONE]\n\n"

const anthropicJSON = `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{"usage":{"input_tokens":7000}}},{"type":"text","text":"hi"}],
 "model":"claude","stop_reason":"end_turn","usage":{"input_tokens":10,"cache_creation_input_tokens":2,"cache_read_input_tokens":3,"output_tokens":20}}`

const anthropicSSE = "event: message_start\n" +
	"data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
	"event: content_block_delta\n" +
	"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"{\\\"usage\\\":{\\\"output_tokens\\\":9000}}\"}}\n\n" +
	"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
	"event: message_delta\n" +
	"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

const geminiJSON = `{"candidates":[{"content":{"parts":[{"text":"hi"}],"role":"model"},"finishReason":"STOP"}],
 "usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":10,"thoughtsTokenCount":4,"totalTokenCount":19,"promptTokensDetails":[{"modality":"TEXT","tokenCount":5}]},"modelVersion":"gemini"}`

const geminiSSE = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"a\"}]}}],\"usageMetadata\":{\"promptTokenCount\":5,\"candidatesTokenCount\":1,\"totalTokenCount\":6}}\r\n\r\n" +
	"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"b\"}]}}],\"usageMetadata\":{\"promptTokenCount\":5,\"candidatesTokenCount\":7,\"totalTokenCount\":12}}\r\n\r\n"

// TestScannerReadsEachProvider: each provider's answer, buffered and
// streamed, gives the usage it reports (a stream's latest figures), and
// contents, tool arguments and tool inputs that look like usage count
// for nothing; whatever the sizes in which the body is written.
func TestScannerReadsEachProvider(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		want                    Usage
	}{
		{"openai json", "application/json", openAIJSON, Usage{11, 19, 30}},
		{"openai stream", "text/event-stream; charset=utf-8", openAISSE, Usage{11, 19, 30}},
		{"anthropic json", "application/json", anthropicJSON, Usage{15, 20, 35}},
		{"anthropic stream", "text/event-stream", anthropicSSE, Usage{25, 15, 40}},
		{"gemini json", "application/json; charset=UTF-8", geminiJSON, Usage{5, 14, 19}},
		{"gemini stream", "text/event-stream", geminiSSE, Usage{5, 7, 12}},
	} {
		for _, size := range []int{1, 2, 3, 7, 64, len(tc.body)} {
			s := NewScanner(tc.contentType)
			for i := 0; i < len(tc.body); i += size {
				_, _ = s.Write([]byte(tc.body[i:min(i+size, len(tc.body))]))
			}
			got, ok := s.Usage()
			if !ok || got != tc.want {
				t.Errorf("%s written %d bytes at a time: %+v %v, want %+v", tc.name, size, got, ok, tc.want)
			}
		}
	}
}

// TestScannerHostileBodies: a body without usage, with negative,
// fractional, huge or misplaced figures, not JSON, or cut before its
// usage reports nothing it did not say: never a negative count, never
// more than algo.MaxCount.
func TestScannerHostileBodies(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		want                    Usage
		found                   bool
	}{
		{"no usage", "application/json", `{"choices":[{"message":{"content":"hi"}}]}`, Usage{}, false},
		{"negative", "application/json", `{"usage":{"prompt_tokens":-5,"completion_tokens":7}}`, Usage{0, 7, 7}, true},
		{"fraction", "application/json", `{"usage":{"prompt_tokens":1.5,"completion_tokens":2e3,"total_tokens":4}}`, Usage{0, 0, 4}, true},
		{"huge", "application/json", `{"usage":{"prompt_tokens":` + strings.Repeat("9", 400) + `,"completion_tokens":1}}`, Usage{algo.MaxCount, 1, algo.MaxCount}, true},
		{"huge in two fields", "application/json", `{"usage":{"input_tokens":` + strings.Repeat("9", 30) + `,"cache_read_input_tokens":` + strings.Repeat("9", 30) + `}}`,
			Usage{algo.MaxCount, 0, algo.MaxCount}, true},
		{"usage too deep", "application/json", `{"a":{"b":{"usage":{"prompt_tokens":5}}}}`, Usage{}, false},
		{"usage in an array", "application/json", `[{"usage":{"prompt_tokens":5}}]`, Usage{}, false},
		{"usage not an object", "application/json", `{"usage":"prompt_tokens 5"}`, Usage{}, false},
		{"not json", "application/json", `<html>usage prompt_tokens: 5</html>`, Usage{}, false},
		{"broken before usage", "application/json", `{"choices":[}],"usage":{"prompt_tokens":5}}`, Usage{}, false},
		{"a long key", "application/json", `{"usage":{"` + strings.Repeat("k", 5000) + `prompt_tokens":5}}`, Usage{}, false},
		{"deep nesting", "application/json", strings.Repeat("[", 100_000) + `{"usage":{"prompt_tokens":5}}`, Usage{}, false},
		{"stream cut before usage", "text/event-stream", "data: {\"choices\":[{\"delta\":{\"content\":\"Hel", Usage{}, false},
		{"stream cut in usage", "text/event-stream", anthropicSSE[:strings.Index(anthropicSSE, "event: ping")], Usage{25, 1, 26}, true},
		{"a broken event, then usage", "text/event-stream", "data: {\"x\":]\n\ndata: {\"usage\":{\"prompt_tokens\":3}}\n\n", Usage{3, 0, 3}, true},
		{"usage in another field", "text/event-stream", "event: {\"usage\":{\"prompt_tokens\":3}}\nid: {\"usage\":{\"prompt_tokens\":3}}\n: {\"usage\":{\"prompt_tokens\":3}}\n\n", Usage{}, false},
		{"data split over two lines", "text/event-stream", "data: {\"usage\":\ndata: {\"prompt_tokens\":4}}\n\n", Usage{4, 0, 4}, true},
	} {
		s := NewScanner(tc.contentType)
		_, _ = s.Write([]byte(tc.body))
		got, found := s.Usage()
		if got != tc.want || found != tc.found {
			t.Errorf("%s: %+v %v, want %+v %v", tc.name, got, found, tc.want, tc.found)
		}
	}
}

// TestScannerHoldsAFixedSize: what a Scanner holds does not grow with
// the body (it keeps no byte of it): its size is a constant, and a
// megabyte of stream allocates nothing.
func TestScannerHoldsAFixedSize(t *testing.T) {
	if n := unsafe.Sizeof(Scanner{}); n > 512 {
		t.Errorf("a Scanner is %d bytes, want at most 512", n)
	}
	body := []byte(strings.Repeat(openAISSE, 1<<20/len(openAISSE)))
	s := NewScanner("text/event-stream")
	if allocs := testing.AllocsPerRun(3, func() { _, _ = s.Write(body) }); allocs != 0 {
		t.Errorf("scanning 1 MB of stream: %v allocations, want none", allocs)
	}
}

// FuzzScanner: any body, written in any pieces, neither panics nor
// reports a count outside [0, algo.MaxCount], and gives the same usage
// whether written whole or a byte at a time.
func FuzzScanner(f *testing.F) {
	for _, b := range []string{openAIJSON, openAISSE, anthropicJSON, anthropicSSE, geminiJSON, geminiSSE} {
		f.Add([]byte(b), true)
		f.Add([]byte(b), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, sse bool) {
		contentType := "application/json"
		if sse {
			contentType = "text/event-stream"
		}
		whole, bytewise := NewScanner(contentType), NewScanner(contentType)
		_, _ = whole.Write(body)
		for i := range body {
			_, _ = bytewise.Write(body[i : i+1])
		}
		u, found := whole.Usage()
		v, found2 := bytewise.Usage()
		if u != v || found != found2 {
			t.Fatalf("whole %+v %v, a byte at a time %+v %v", u, found, v, found2)
		}
		for _, n := range []int64{u.Prompt, u.Completion, u.Total} {
			if n < 0 || n > algo.MaxCount {
				t.Fatalf("usage %+v: a count outside [0, %d]", u, int64(algo.MaxCount))
			}
		}
		if u.Total < min(u.Prompt+u.Completion, algo.MaxCount) {
			t.Fatalf("usage %+v: total below prompt + completion", u)
		}
	})
}

// TestPricesCost: an answer's cost at a price list, in millionths of its
// currency, rounded up, and at most algo.MaxCount whatever the figures.
func TestPricesCost(t *testing.T) {
	for _, tc := range []struct {
		p    Prices
		u    Usage
		want int64
	}{
		{Prices{Prompt: 2.5, Completion: 10}, Usage{Prompt: 1000, Completion: 200, Total: 1200}, 4500},
		{Prices{Prompt: 0.15, Completion: 0.6}, Usage{Prompt: 11, Completion: 19, Total: 30}, 14}, // 1.65 + 11.4, rounded up
		{Prices{Completion: 10}, Usage{Prompt: 1e6, Completion: 0}, 0},
		{Prices{Prompt: MaxPrice, Completion: MaxPrice}, Usage{Prompt: algo.MaxCount, Completion: algo.MaxCount}, algo.MaxCount},
	} {
		if got := tc.p.Cost(tc.u); got != tc.want {
			t.Errorf("%+v at %+v: %d, want %d", tc.u, tc.p, got, tc.want)
		}
	}
	if f, err := ParseField("cost"); err != nil || f != Cost || f.String() != "cost" {
		t.Errorf("ParseField(cost) = %v, %v", f, err)
	}
}
