package gate

import (
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/core/usage"
)

// ResponseCost prices the responses of a policy whose limits are charged
// after the response (algo.Limit.AfterResponse): which responses are
// charged, and how many units each. The config package builds it from a
// policy's charge, checked.
type ResponseCost struct {
	// Statuses are the inclusive ranges of statuses charged; none charges
	// every status.
	Statuses [][2]int
	// Header, in canonical form, charges only responses that carry it
	// when set: with one of Values, or with any value when Values is empty.
	Header string
	Values []string
	// CostHeader, in canonical form, is the response header a charged
	// response's cost is read from: a whole number, or with CostEntry, a
	// list of name=value entries of which CostEntry's is taken.
	CostHeader, CostEntry string
	// Usage, when not usage.None, charges the tokens the response's body
	// reports it spent (a language model's answer, read by a
	// usage.Scanner as it streams): the charge waits for the body's end.
	// usage.Cost charges their cost at Prices.
	Usage  usage.Field
	Prices usage.Prices
	// Fixed is the units (at least 0) a charged response costs when
	// CostHeader is unset or holds no usable value, or its body reports
	// no usage.
	Fixed int64
}

// BodyCost returns what a charged response whose body reported u (found
// false: nothing) costs under Usage.
func (rc *ResponseCost) BodyCost(u usage.Usage, found bool) int64 {
	if !found {
		return rc.Fixed
	}
	if rc.Usage == usage.Cost {
		return rc.Prices.Cost(u)
	}
	return u.Of(rc.Usage)
}

// Cost returns what a response of status with headers header costs, and
// false when it is not charged. A reported cost is clamped to
// algo.MaxCount; each limit takes at most its own algo.Limit.MaxCharge.
func (rc *ResponseCost) Cost(status int, header func(name string) string) (int64, bool) {
	if len(rc.Statuses) > 0 {
		in := false
		for _, r := range rc.Statuses {
			in = in || status >= r[0] && status <= r[1]
		}
		if !in {
			return 0, false
		}
	}
	if rc.Header != "" {
		v := header(rc.Header)
		if v == "" || len(rc.Values) > 0 && !contains(rc.Values, v) {
			return 0, false
		}
	}
	if rc.CostHeader != "" {
		if n, ok := reportedCost(header(rc.CostHeader), rc.CostEntry); ok {
			return n, true
		}
	}
	return rc.Fixed, true
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
