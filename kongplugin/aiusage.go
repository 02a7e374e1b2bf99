package kongplugin

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/Kong/go-pdk"

	"github.com/tollgate/tollgate/core/usage"
)

// streamUsageKey is the kong.ctx.shared field where the tollgate-ai-usage
// Lua plugin (kongplugin/lua) leaves the data lines of a streamed answer
// that carry a usage object, as the client received them.
const streamUsageKey = "tollgate_ai_usage"

// streamCounters are the providers whose streams Kong's ai-proxy counts
// from the provider's own figures (kong/llm/drivers/shared.lua,
// streaming_has_token_counts, Kong 3.9.3); for any other provider
// (openai, azure, mistral, ...) a stream's count in Kong's log is its
// estimate (normalize-request.lua, normalize-sse-chunk.lua), not usage.
var streamCounters = map[string]bool{"anthropic": true, "gemini": true, "cohere": true, "llama2": true, "bedrock": true}

// answerUsage is what a language model's answer spent, as the log phase
// can know it, and whether it reported anything:
//
//   - a stream's usage lines, as tollgate-ai-usage saw them go to the
//     client (read by core/usage as any SSE stream);
//   - otherwise Kong's ai-proxy's count (kong.log.serialize's
//     ai.<plugin>.usage, with logging.log_statistics on) of a buffered
//     answer, or of a stream whose provider Kong counts (streamCounters).
//
// stream reports an answer of Content-Type text/event-stream.
func answerUsage(kong *pdk.PDK, headers map[string][]string) (u usage.Usage, found, stream bool) {
	// A repeated Content-Type is read by its first line, as net/http's
	// Header.Get reads it for Caddy.
	ct, _, _ := strings.Cut(headerValues(headers, "Content-Type"), ",")
	stream = strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream")
	if stream {
		if lines, err := kong.Ctx.GetSharedString(streamUsageKey); err == nil && lines != "" {
			s := usage.NewScanner(ct)
			_, _ = s.Write([]byte(lines + "\n\n"))
			if u, found = s.Usage(); found {
				return u, true, true
			}
		}
	}
	serialized, err := kong.Log.Serialize()
	if err != nil {
		return usage.Usage{}, false, stream
	}
	u, found = kongAIUsage(serialized, stream)
	return u, found, stream
}

// kongAIUsage reads ai-proxy's count from a kong.log.serialize document:
// the first plugin under "ai" with a usage object (a stream's only when
// its provider is one Kong counts), read by core/usage as a JSON answer
// (whole, non-negative figures).
func kongAIUsage(serialized string, stream bool) (usage.Usage, bool) {
	var doc struct {
		AI map[string]struct {
			Usage json.RawMessage `json:"usage"`
			Meta  struct {
				Provider string `json:"provider_name"`
			} `json:"meta"`
		} `json:"ai"`
	}
	if json.Unmarshal([]byte(serialized), &doc) != nil {
		return usage.Usage{}, false
	}
	for _, p := range doc.AI {
		if len(p.Usage) == 0 || (stream && !streamCounters[p.Meta.Provider]) {
			continue
		}
		var s usage.Scanner // a JSON answer
		_, _ = s.Write([]byte(`{"usage":`))
		_, _ = s.Write(p.Usage)
		_, _ = s.Write([]byte(`}`))
		if u, ok := s.Usage(); ok {
			return u, true
		}
	}
	return usage.Usage{}, false
}

// unreportedUsage tells Kong's log, once per instance, that an answer
// charged by its tokens reported none: it is charged the charge's cost.
type unreportedUsage struct{ told atomic.Bool }

func (w *unreportedUsage) tell(kong *pdk.PDK, who string, stream bool, cost int64) {
	if w.told.Load() || w.told.Swap(true) {
		return
	}
	why := "enable ai-proxy's logging.log_statistics on the route"
	if stream {
		why = "enable tollgate-ai-usage on the route, and have clients ask for it (OpenAI: stream_options.include_usage)"
	}
	_ = kong.Log.Warn(who + "an answer charged by its tokens reported no usage (" + why + "); each such answer is charged cost " +
		strconv.FormatInt(cost, 10) + "; said once")
}
