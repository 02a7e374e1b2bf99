// Package headercheck checks response headers in tests.
package headercheck

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Expect checks h against want: an exact value, "a..b" for an integer in
// [a, b], or "" for an absent header. label names the response in errors.
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
}
