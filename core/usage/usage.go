// Package usage reads the tokens a large language model's answer reports
// it spent, from the answer's body as it streams to the client: a JSON
// answer's usage object (OpenAI's usage, Anthropic's usage, Gemini's
// usageMetadata), or in a server-sent-event stream the events that carry
// it. A Scanner sees each byte once, keeps none of the body and holds a
// fixed few hundred bytes whatever the body's size, so reading usage adds
// no latency and no memory to an answer.
package usage

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/core/algo"
)

// Usage is what an answer reports it spent, in tokens (each at least 0,
// at most algo.MaxCount).
type Usage struct {
	// Prompt counts the tokens read: OpenAI's prompt_tokens, Anthropic's
	// input_tokens with its cache_creation_input_tokens and
	// cache_read_input_tokens, Gemini's promptTokenCount.
	Prompt int64
	// Completion counts the tokens written: OpenAI's completion_tokens
	// (reasoning included), Anthropic's output_tokens, Gemini's
	// candidatesTokenCount with its thoughtsTokenCount.
	Completion int64
	// Total is the reported total (total_tokens, totalTokenCount), and
	// never less than Prompt + Completion (but at most algo.MaxCount).
	Total int64
}

// Scanner reads an answer's body as it is written (Write) and reports the
// usage it found (Usage). Its zero value reads a JSON body; NewScanner
// chooses by the answer's Content-Type. It is not safe for concurrent use.
type Scanner struct {
	sse   bool
	line  lineState
	field [5]byte // the start of an SSE line's field name
	nf    int
	json  jsonScanner
	found [fieldCount]bool
	value [fieldCount]int64
}

// NewScanner returns a Scanner for an answer of contentType: a
// server-sent-event stream (text/event-stream) or a JSON body (anything
// else).
func NewScanner(contentType string) *Scanner {
	s := &Scanner{}
	s.Reset(contentType)
	return s
}

// Reset makes s read a new answer of contentType, as NewScanner.
func (s *Scanner) Reset(contentType string) {
	mediaType, _, _ := strings.Cut(contentType, ";")
	*s = Scanner{sse: strings.EqualFold(strings.TrimSpace(mediaType), "text/event-stream")}
}

// Write reads p, the next bytes of the body. It never fails and keeps
// nothing of p.
func (s *Scanner) Write(p []byte) (int, error) {
	if !s.sse {
		s.json.scan(p, s)
		return len(p), nil
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '\n' || c == '\r' {
			if s.line == lineStart || s.line == lineAfterCR && c == '\r' {
				s.json = jsonScanner{} // a blank line ends the event
			}
			s.line, s.nf = lineStart, 0
			if c == '\r' {
				s.line = lineAfterCR
			}
			continue
		}
		switch s.line {
		case lineAfterCR, lineStart, lineField:
			if c == ':' {
				s.line = lineSkip
				if s.nf == 4 && string(s.field[:4]) == "data" {
					s.line = lineDataStart
				}
				continue
			}
			if s.nf < len(s.field) {
				s.field[s.nf] = c
			}
			s.nf++
			s.line = lineField
		case lineDataStart:
			s.line = lineData
			if c == ' ' {
				continue // the one space after the colon is not the data's
			}
			s.json.scan(p[i:i+1], s)
		case lineData:
			j := i
			for j < len(p) && p[j] != '\n' && p[j] != '\r' {
				j++
			}
			s.json.scan(p[i:j], s)
			i = j - 1
		}
	}
	return len(p), nil
}

// lineState is where an SSE line is.
type lineState uint8

const (
	lineStart     lineState = iota // nothing of the line read yet
	lineAfterCR                    // as lineStart, after a \r (a \n next ends nothing more)
	lineField                      // reading the field name
	lineDataStart                  // after "data:"
	lineData                       // in a data line's value: JSON
	lineSkip                       // in another field's line, or a comment
)

// Usage returns what the body reported so far, and whether it reported
// anything: for a stream, each figure as its latest event said it.
func (s *Scanner) Usage() (Usage, bool) {
	var u Usage
	reported := false
	for i := range s.found {
		reported = reported || s.found[i]
	}
	u.Prompt = clamp(s.value[inputTokens] + s.value[cacheCreation] + s.value[cacheRead] + s.value[promptTokens] + s.value[promptCount])
	u.Completion = clamp(s.value[completionTokens] + s.value[outputTokens] + s.value[candidatesCount] + s.value[thoughtsCount])
	u.Total = clamp(max(s.value[totalTokens]+s.value[totalCount], u.Prompt+u.Completion))
	return u, reported
}

func clamp(n int64) int64 { return min(max(n, 0), algo.MaxCount) }

// record records key's value n, read in a usage object, clamped to
// algo.MaxCount so that Usage's sums of several fields cannot overflow.
func (s *Scanner) record(key []byte, n int64) {
	for f, name := range fieldNames {
		if string(key) == name {
			s.found[f], s.value[f] = true, min(n, algo.MaxCount)
			return
		}
	}
}

// The usage fields read, by the name an answer gives them.
const (
	promptTokens = iota
	completionTokens
	totalTokens
	inputTokens
	outputTokens
	cacheCreation
	cacheRead
	promptCount
	candidatesCount
	thoughtsCount
	totalCount
	fieldCount
)

var fieldNames = [fieldCount]string{
	promptTokens: "prompt_tokens", completionTokens: "completion_tokens", totalTokens: "total_tokens",
	inputTokens: "input_tokens", outputTokens: "output_tokens",
	cacheCreation: "cache_creation_input_tokens", cacheRead: "cache_read_input_tokens",
	promptCount: "promptTokenCount", candidatesCount: "candidatesTokenCount", thoughtsCount: "thoughtsTokenCount",
	totalCount: "totalTokenCount",
}

// Field picks one figure of a Usage: what a token budget charges.
type Field uint8

const (
	// None charges no figure of a body's usage.
	None Field = iota
	// Total charges Usage.Total.
	Total
	// Prompt charges Usage.Prompt.
	Prompt
	// Completion charges Usage.Completion.
	Completion
	// Cost charges what the tokens cost at a price (Prices.Cost).
	Cost
)

var fieldWords = []string{None: "", Total: "total_tokens", Prompt: "prompt_tokens", Completion: "completion_tokens", Cost: "cost"}

// String returns the configuration name of f ("total_tokens", ...).
func (f Field) String() string {
	if int(f) < len(fieldWords) {
		return fieldWords[f]
	}
	return "Field(" + strconv.Itoa(int(f)) + ")"
}

// ParseField reads "total_tokens", "prompt_tokens", "completion_tokens"
// or "cost".
func ParseField(s string) (Field, error) {
	for f, w := range fieldWords {
		if w != "" && w == s {
			return Field(f), nil
		}
	}
	return None, fmt.Errorf("%q: want total_tokens, prompt_tokens, completion_tokens or cost", s)
}

// Prices are what a million tokens cost, read (Prompt) and written
// (Completion), in any currency: the figures a model's price list gives.
type Prices struct {
	Prompt, Completion float64
}

// MaxPrice is the most a million tokens may cost (Prices), a bound that
// keeps a typing slip (a price per token written per million) from
// going unseen.
const MaxPrice = 1e6

// Cost returns what u's tokens cost at p, in millionths of p's currency
// (tokens × price per million tokens), rounded up: a budget of 5 a day is
// a limit of 5,000,000 a day. It is at most algo.MaxCount.
func (p Prices) Cost(u Usage) int64 {
	c := math.Ceil(float64(u.Prompt)*p.Prompt + float64(u.Completion)*p.Completion)
	if !(c < algo.MaxCount) { // NaN too
		return algo.MaxCount
	}
	return max(int64(c), 0)
}

// Of returns u's figure f (0 for None, and for Cost, which Prices.Cost
// prices).
func (u Usage) Of(f Field) int64 {
	switch f {
	case Total:
		return u.Total
	case Prompt:
		return u.Prompt
	case Completion:
		return u.Completion
	}
	return 0
}
