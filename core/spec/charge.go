package spec

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/core/algo"
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
	// Cost is the units a charged response costs when no CostHeader is set
	// or it holds no usable value: default 1 without a CostHeader, 0 with
	// one (a response that reports nothing costs nothing).
	Cost *int64 `json:"cost,omitempty"`
}

// ResponseCost is a Charge checked and ready to price responses.
type ResponseCost struct {
	statuses         [][2]int // inclusive ranges
	header           string
	values           []string
	costHeader, name string
	cost             int64
}

// Compile checks c; errors name the field and value.
func (c *Charge) Compile() (*ResponseCost, error) {
	rc := &ResponseCost{header: http.CanonicalHeaderKey(strings.TrimSpace(c.Header)), values: c.Values,
		costHeader: http.CanonicalHeaderKey(strings.TrimSpace(c.CostHeader)), name: strings.TrimSpace(c.CostEntry)}
	for _, s := range c.Status {
		r, err := parseStatusRange(s)
		if err != nil {
			return nil, fmt.Errorf("charge status: %w", err)
		}
		rc.statuses = append(rc.statuses, r)
	}
	if len(c.Values) > 0 && rc.header == "" {
		return nil, fmt.Errorf("charge values: %q need the header they are values of", c.Values)
	}
	if rc.name != "" && rc.costHeader == "" {
		return nil, fmt.Errorf("charge cost_entry: %q needs the cost_header it is an entry of", rc.name)
	}
	if rc.costHeader == "" {
		rc.cost = 1
	}
	if c.Cost != nil {
		if err := CheckCost(*c.Cost); err != nil {
			return nil, fmt.Errorf("charge cost: %w", err)
		}
		rc.cost = *c.Cost
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

// Cost returns what a response of status with headers header costs, and
// false when it is not charged. A reported cost is clamped to
// algo.MaxCount; each limit takes at most its own algo.Limit.MaxCharge.
func (rc *ResponseCost) Cost(status int, header func(name string) string) (int64, bool) {
	if len(rc.statuses) > 0 {
		in := false
		for _, r := range rc.statuses {
			in = in || status >= r[0] && status <= r[1]
		}
		if !in {
			return 0, false
		}
	}
	if rc.header != "" {
		v := header(rc.header)
		if v == "" || len(rc.values) > 0 && !contains(rc.values, v) {
			return 0, false
		}
	}
	if rc.costHeader != "" {
		if n, ok := reportedCost(header(rc.costHeader), rc.name); ok {
			return n, true
		}
	}
	return rc.cost, true
}

func contains(list []string, v string) bool {
	for _, s := range list {
		if s == v {
			return true
		}
	}
	return false
}

// reportedCost reads a cost header's value: a whole number, or with name,
// name's entry in "a=1, b=2" (its last, when it has several). The lines of
// a repeated header come joined with commas, as one field: without name,
// a list of numbers ("100, 200") charges the largest of them, so no report
// makes a call cheaper than it says. A negative, fractional or garbled
// value is not usable (false; in a list, it is passed over); a number of
// any length too large to hold is algo.MaxCount, which takes a limit's
// whole count.
func reportedCost(v, name string) (int64, bool) {
	if name == "" {
		largest, found := int64(0), false
		for _, e := range strings.Split(v, ",") {
			if n, ok := wholeCost(e); ok && (!found || n > largest) {
				largest, found = n, true
			}
		}
		return largest, found
	}
	// The last entry of the name counts: each entry overwrites the one
	// before, as gateways that report usage this way read it.
	found := false
	entry := ""
	for _, e := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(e, "=")
		if ok && strings.TrimSpace(k) == name {
			entry, found = val, true
		}
	}
	if !found {
		return 0, false
	}
	return wholeCost(entry)
}

// wholeCost reads one reported cost: digits alone, around spaces.
func wholeCost(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > algo.MaxCount {
		return algo.MaxCount, true // only digits: too large to parse
	}
	return n, true
}
