package config

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/core/gate"
	"github.com/tollgate/tollgate/core/usage"
)

// Charge is what a response costs a policy whose limits are charged after
// the response (algo.Limit.AfterResponse): which responses are charged,
// and how many units each.
type Charge struct {
	// Status lists the statuses charged: codes ("401"), classes ("4xx", or
	// a single digit "4") and ranges ("500-599"); empty charges every status.
	Status []string `json:"status,omitempty"`
	// Header, when set, charges only responses that carry it: with one of
	// Values, or with any value when Values is empty.
	Header string   `json:"header,omitempty"`
	Values []string `json:"values,omitempty"`
	// CostHeader is the response header a charged response's cost is read
	// from: a whole number, or with CostEntry, a list of name=value
	// entries ("videos=2, images=4") of which CostEntry's is taken.
	CostHeader string `json:"cost_header,omitempty"`
	CostEntry  string `json:"cost_entry,omitempty"`
	// Usage, instead of CostHeader, charges the tokens the response's
	// body reports it spent, a language model's answer as OpenAI,
	// Anthropic and Gemini write it (JSON or a server-sent-event stream):
	// "total_tokens", "prompt_tokens" or "completion_tokens", or "cost":
	// what they cost at InputCost and OutputCost. The charge is taken
	// when the body ends.
	Usage string `json:"usage,omitempty"`
	// InputCost and OutputCost are what a million prompt and completion
	// tokens cost (a model's price list) for Usage "cost", which charges
	// millionths of that currency (usage.Prices.Cost).
	InputCost  *float64 `json:"input_cost,omitempty"`
	OutputCost *float64 `json:"output_cost,omitempty"`
	// Cost is the units a charged response costs when no CostHeader is set
	// or it holds no usable value, or its body reports no usage: default 1
	// without a CostHeader, 0 with one (a response that reports nothing
	// costs nothing).
	Cost *int64 `json:"cost,omitempty"`
}

// Compile checks c; errors name the field and value.
func (c *Charge) Compile() (*gate.ResponseCost, error) {
	rc := &gate.ResponseCost{Header: http.CanonicalHeaderKey(strings.TrimSpace(c.Header)), Values: c.Values,
		CostHeader: http.CanonicalHeaderKey(strings.TrimSpace(c.CostHeader)), CostEntry: strings.TrimSpace(c.CostEntry)}
	for _, s := range c.Status {
		r, err := parseStatusRange(s)
		if err != nil {
			return nil, at("status", fmt.Errorf("charge status: %w", err))
		}
		rc.Statuses = append(rc.Statuses, r)
	}
	if len(c.Values) > 0 && rc.Header == "" {
		return nil, at("values", fmt.Errorf("charge values: %q need the header they are values of", c.Values))
	}
	if c.Usage != "" {
		f, err := usage.ParseField(c.Usage)
		if err != nil {
			return nil, at("usage", fmt.Errorf("charge usage: %w", err))
		}
		if rc.CostHeader != "" {
			return nil, at("usage", fmt.Errorf("charge usage: %s and cost_header %q both say what a response costs; give one", c.Usage, rc.CostHeader))
		}
		rc.Usage = f
	}
	for _, price := range []struct {
		field string
		v     *float64
		to    *float64
	}{{"input_cost", c.InputCost, &rc.Prices.Prompt}, {"output_cost", c.OutputCost, &rc.Prices.Completion}} {
		if price.v == nil {
			continue
		}
		if rc.Usage != usage.Cost {
			return nil, at(price.field, fmt.Errorf("charge %s: %v prices usage cost; usage is %q", price.field, *price.v, c.Usage))
		}
		if !(*price.v >= 0 && *price.v <= usage.MaxPrice) {
			return nil, at(price.field, fmt.Errorf("charge %s: %v is not a price of a million tokens (0 to %v)", price.field, *price.v, usage.MaxPrice))
		}
		*price.to = *price.v
	}
	if rc.Usage == usage.Cost && rc.Prices == (usage.Prices{}) {
		return nil, at("usage", fmt.Errorf("charge usage: cost needs input_cost or output_cost, what a million tokens cost"))
	}
	if rc.CostEntry != "" && rc.CostHeader == "" {
		return nil, at("cost_entry", fmt.Errorf("charge cost_entry: %q needs the cost_header it is an entry of", rc.CostEntry))
	}
	if rc.CostHeader == "" {
		rc.Fixed = 1
	}
	if c.Cost != nil {
		if err := CheckCost(*c.Cost); err != nil {
			return nil, at("cost", fmt.Errorf("charge cost: %w", err))
		}
		rc.Fixed = *c.Cost
	}
	return rc, nil
}

// parseStatusRange reads "401", "4xx", "4" (a class as one digit, as some
// gateways write it) or "500-599".
func parseStatusRange(s string) ([2]int, error) {
	s = strings.TrimSpace(s)
	code := func(t string) (int, bool) {
		n, err := strconv.Atoi(t)
		return n, err == nil && n >= 100 && n <= 599 && len(t) == 3
	}
	if lo, hi, ok := strings.Cut(s, "-"); ok {
		a, okA := code(lo)
		b, okB := code(hi)
		if !okA || !okB || a > b {
			return [2]int{}, fmt.Errorf("%q: want a range of codes such as 500-599", s)
		}
		return [2]int{a, b}, nil
	}
	if len(s) == 3 && (s[1:] == "xx" || s[1:] == "XX") || len(s) == 1 {
		if d := s[0]; d >= '1' && d <= '5' {
			base := int(d-'0') * 100
			return [2]int{base, base + 99}, nil
		}
	}
	if n, ok := code(s); ok {
		return [2]int{n, n}, nil
	}
	return [2]int{}, fmt.Errorf("%q: want a status code (401), a class (4xx) or a range (500-599)", s)
}
