package kongplugin

import (
	"testing"

	"github.com/tollgate/tollgate/core/usage"
)

// TestKongAIUsage reads ai-proxy's count from kong.log.serialize documents
// as Kong 3.9.3 writes them (serialize-analytics.lua): a buffered answer's
// usage, a stream's only when its provider counts streams, and nothing
// from figures that are not counts.
func TestKongAIUsage(t *testing.T) {
	const openai = `{"ai":{"proxy":{"meta":{"provider_name":"openai"},"usage":{"prompt_tokens":11,"completion_tokens":19,"total_tokens":30,"cost":0}}},"request":{}}`
	const anthropic = `{"ai":{"proxy":{"meta":{"provider_name":"anthropic"},"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12}}}}`
	for _, c := range []struct {
		doc    string
		stream bool
		want   usage.Usage
		found  bool
	}{
		{openai, false, usage.Usage{Prompt: 11, Completion: 19, Total: 30}, true},
		{openai, true, usage.Usage{}, false}, // Kong's estimate of an OpenAI stream
		{anthropic, true, usage.Usage{Prompt: 7, Completion: 5, Total: 12}, true},
		{`{"request":{}}`, false, usage.Usage{}, false},                                                          // no ai-proxy, or log_statistics off
		{`{"ai":{"proxy":{"usage":{"prompt_tokens":-4,"completion_tokens":2.5}}}}`, false, usage.Usage{}, false}, // not counts
		{`{"ai":{"proxy":{"usage":{"prompt_tokens":3}}}}`, false, usage.Usage{Prompt: 3, Total: 3}, true},
		{`not json`, false, usage.Usage{}, false},
	} {
		u, found := kongAIUsage(c.doc, c.stream)
		if u != c.want || found != c.found {
			t.Errorf("kongAIUsage(%s, stream %v) = %+v, %v; want %+v, %v", c.doc, c.stream, u, found, c.want, c.found)
		}
	}
}
