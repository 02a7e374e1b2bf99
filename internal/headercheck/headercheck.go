// Package headercheck checks response headers in tests: expected values,
// and the rate-limit fields' agreement with each other and with
// draft-ietf-httpapi-ratelimit-headers (-10's text, the newest reachable
// here, and -11's rules: r the available quota, at most q; t the time
// until quota returns; Retry-After not before t), read with an independent
// RFC 9651 Structured Fields parser (github.com/dunglas/httpsfv).
package headercheck

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"
)

// Expect checks h against want: an exact value, "a..b" for an integer in
// [a, b], or "" for an absent header. label names the response in errors.
// It then checks the rate-limit fields h carries with Consistent (jitter
// unknown).
func Expect(t testing.TB, label string, h http.Header, want map[string]string) {
	t.Helper()
	for name, w := range want {
		got := h.Get(name)
		if lo, hi, ok := strings.Cut(w, ".."); ok {
			n, err := strconv.Atoi(got)
			a, _ := strconv.Atoi(lo)
			b, _ := strconv.Atoi(hi)
			if err != nil || n < a || n > b {
				t.Errorf("%s: %s = %q, want an integer in [%s, %s]", label, name, got, lo, hi)
			}
			continue
		}
		if got != w {
			t.Errorf("%s: %s = %q, want %q", label, name, got, w)
		}
	}
	Consistent(t, label, h, -1)
}

// Consistent checks the rate-limit fields of one response:
//   - RateLimit-Policy is a List of Items, each a String name with Integer
//     parameters q >= 0 and w >= 1 and optionally the String qu;
//   - RateLimit is a List of one Item naming a policy item, with Integer r
//     in [0, q of that item] and t >= 0, and the same qu;
//   - X-RateLimit-Reset and X-RateLimit-Remaining equal t and r;
//   - Retry-After is an integer >= 1, never before t (or Kong's
//     RateLimit-Reset), and with jitter >= 0 never after t plus the jitter's
//     share (jitter < 0: unknown, no upper bound).
func Consistent(t testing.TB, label string, h http.Header, jitter float64) {
	t.Helper()
	type quota struct {
		q  int64
		qu string
	}
	policies := map[string]quota{}
	if v := h.Values("Ratelimit-Policy"); len(v) > 0 {
		list, err := httpsfv.UnmarshalList(v)
		if err != nil {
			t.Errorf("%s: RateLimit-Policy %q is not a Structured Fields List: %v", label, v, err)
			return
		}
		for _, m := range list {
			item, ok := m.(httpsfv.Item)
			name, isString := item.Value.(string)
			if !ok || !isString {
				t.Errorf("%s: RateLimit-Policy %q: member %v is not an Item with a String name", label, v, m)
				continue
			}
			q, okq := param[int64](item.Params, "q")
			w, okw := param[int64](item.Params, "w")
			qu, _ := param[string](item.Params, "qu")
			// An in-flight quota (qu="concurrent-requests") has no window.
			if !okq || q < 0 || (!okw || w < 1) && (qu != "concurrent-requests" || okw) {
				t.Errorf("%s: RateLimit-Policy item %q wants Integer q >= 0 and w >= 1: %q", label, name, v)
			}
			for _, p := range item.Params.Names() {
				if p != "q" && p != "w" && p != "qu" {
					t.Errorf("%s: RateLimit-Policy item %q: unexpected parameter %q", label, name, p)
				}
			}
			policies[name] = quota{q, qu}
		}
	}
	reset, remaining := int64(-1), int64(-1)
	if v := h.Values("Ratelimit"); len(v) > 0 {
		list, err := httpsfv.UnmarshalList(v)
		if err != nil || len(list) != 1 {
			t.Errorf("%s: RateLimit %q is not a Structured Fields List of one Item: %v", label, v, err)
			return
		}
		item, ok := list[0].(httpsfv.Item)
		name, _ := item.Value.(string)
		r, okr := param[int64](item.Params, "r")
		tt, okt := param[int64](item.Params, "t")
		qu, _ := param[string](item.Params, "qu")
		if !ok || !okr || !okt || r < 0 || tt < 0 {
			t.Errorf("%s: RateLimit %q wants a String name with Integer r >= 0 and t >= 0", label, v)
			return
		}
		if pol, known := policies[name]; len(policies) > 0 && !known {
			t.Errorf("%s: RateLimit names %q, which RateLimit-Policy %q does not", label, name, h.Values("Ratelimit-Policy"))
		} else if known && (r > pol.q || qu != pol.qu) {
			t.Errorf("%s: RateLimit %q: r=%d, qu=%q against the policy item's q=%d, qu=%q (r may not exceed q)", label, v, r, qu, pol.q, pol.qu)
		}
		reset, remaining = tt, r
	}
	if v := h.Get("X-Ratelimit-Reset"); v != "" && reset >= 0 && v != strconv.FormatInt(reset, 10) {
		t.Errorf("%s: X-RateLimit-Reset %s disagrees with RateLimit t=%d", label, v, reset)
	}
	if v := h.Get("X-Ratelimit-Remaining"); v != "" && remaining >= 0 && v != strconv.FormatInt(remaining, 10) {
		t.Errorf("%s: X-RateLimit-Remaining %s disagrees with RateLimit r=%d", label, v, remaining)
	}
	if reset < 0 {
		if v, err := strconv.ParseInt(h.Get("Ratelimit-Reset"), 10, 64); err == nil { // Kong's set
			reset = v
		}
	}
	if v := h.Get("Retry-After"); v != "" {
		ra, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil || ra < 1:
			t.Errorf("%s: Retry-After %q is not a whole number of seconds >= 1", label, v)
		case reset >= 0 && ra < reset:
			t.Errorf("%s: Retry-After %d is before the reset %d of the same response", label, ra, reset)
		case reset >= 0 && jitter >= 0 && ra > reset+int64(math.Ceil(jitter*float64(reset))):
			t.Errorf("%s: Retry-After %d is past the reset %d plus jitter %v", label, ra, reset, jitter)
		}
	}
	// A limit header and its remaining describe one limit: the remaining
	// is never above the limit (X-RateLimit-*, Kong's RateLimit-* and its
	// X-RateLimit-Limit-<Name> / X-RateLimit-Remaining-<Name> pairs).
	for name := range h {
		rest, ok := strings.CutPrefix(name, "X-Ratelimit-Limit")
		if !ok && name == "Ratelimit-Limit" {
			rest, ok = "", true
			name = "Ratelimit-Limit"
		}
		if !ok {
			continue
		}
		remainingName := "X-Ratelimit-Remaining" + rest
		if name == "Ratelimit-Limit" {
			remainingName = "Ratelimit-Remaining"
		}
		limit, err1 := strconv.ParseInt(h.Get(name), 10, 64)
		left, err2 := strconv.ParseInt(h.Get(remainingName), 10, 64)
		if err1 == nil && err2 == nil && left > limit {
			t.Errorf("%s: %s %d is above %s %d: the two describe different limits", label, remainingName, left, name, limit)
		}
	}
}

func param[T any](p *httpsfv.Params, name string) (T, bool) {
	var zero T
	if p == nil {
		return zero, false
	}
	v, ok := p.Get(name)
	if !ok {
		return zero, false
	}
	tv, ok := v.(T)
	return tv, ok
}
