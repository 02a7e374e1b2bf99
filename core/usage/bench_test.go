package usage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// streamMB is about a megabyte of an OpenAI chat completion stream: many
// small content deltas, then the chunk that carries usage.
var streamMB = func() []byte {
	var b strings.Builder
	delta := "data: {\"id\":\"chatcmpl-AbC123\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"gpt-4o-2024-08-06\"," +
		"\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tokens, \\\"quoted\\\" and plain\"},\"finish_reason\":null}],\"usage\":null}\n\n"
	for b.Len() < 1<<20 {
		b.WriteString(delta)
	}
	b.WriteString("data: {\"id\":\"chatcmpl-AbC123\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":19,\"total_tokens\":30}}\n\n")
	b.WriteString("data: [DONE]\n\n")
	return []byte(b.String())
}()

// jsonPerEvent is what reading usage costs without a scanner: each
// event's data decoded with encoding/json (the events split at blank
// lines, as they arrive whole here).
func jsonPerEvent(body []byte) (Usage, bool) {
	var u Usage
	found := false
	for _, event := range bytes.Split(body, []byte("\n\n")) {
		data, ok := bytes.CutPrefix(event, []byte("data: "))
		if !ok || data[0] != '{' {
			continue
		}
		var chunk struct {
			Usage *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
				Total      int64 `json:"total_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(data, &chunk) == nil && chunk.Usage != nil {
			u, found = Usage{chunk.Usage.Prompt, chunk.Usage.Completion, chunk.Usage.Total}, true
		}
	}
	return u, found
}

// BenchmarkVsEncodingJSON measures reading the usage of about 1 MB of
// stream, written in 4 KB pieces, with the Scanner and with encoding/json
// decoding each event (jsonPerEvent), in the same run: alternating rounds,
// the best of five for each. It prints the Scanner's CPU time per MB and
// `vs encoding-json sse-usage-1MB <factor>` (the decoder's time over the
// Scanner's: above 1, the Scanner costs less). make bench runs it.
func BenchmarkVsEncodingJSON(b *testing.B) {
	if b.N > 1 {
		return // measured once, at b.N == 1, by its own rounds
	}
	want := Usage{11, 19, 30}
	scan := func() {
		s := NewScanner("text/event-stream")
		for i := 0; i < len(streamMB); i += 4096 {
			_, _ = s.Write(streamMB[i:min(i+4096, len(streamMB))])
		}
		if u, _ := s.Usage(); u != want {
			b.Fatalf("scanner: %+v, want %+v", u, want)
		}
	}
	decode := func() {
		if u, _ := jsonPerEvent(streamMB); u != want {
			b.Fatalf("encoding/json: %+v, want %+v", u, want)
		}
	}
	best := [2]float64{math.MaxFloat64, math.MaxFloat64}
	for round := 0; round < 5; round++ {
		for i, run := range []func(){scan, decode} {
			began := time.Now()
			for range 10 {
				run()
			}
			best[i] = min(best[i], float64(time.Since(began).Nanoseconds())/10)
		}
	}
	mb := float64(len(streamMB)) / (1 << 20)
	fmt.Printf("scanner      %.2f ms per MB of stream\nencoding/json %.2f ms per MB of stream\n", best[0]/mb/1e6, best[1]/mb/1e6)
	fmt.Printf("vs encoding-json sse-usage-1MB %.2f\n", best[1]/best[0])
}
