package headers

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// FuzzHeaders: whatever the policy name and decision, rendered headers are
// valid HTTP field values and numbers are non-negative integers.
func FuzzHeaders(f *testing.F) {
	f.Add("api", int64(100), int64(60), int64(50), int64(30_000_000), int64(0), false, uint8(0))
	f.Add("we\"ird\\name\x00\xff", int64(1), int64(1), int64(-3), int64(-1), int64(2_500_000), true, uint8(1))
	f.Fuzz(func(t *testing.T, name string, count, windowS, remaining, resetUS, retryUS int64, denied bool, style uint8) {
		if name == "" || count < 1 || windowS < 1 || windowS > 1<<20 {
			return
		}
		p, err := core.NewPolicy(name, core.PolicyOptions{}, algo.Limit{Count: count, Window: time.Duration(windowS) * time.Second, Algorithm: algo.FixedWindow})
		if err != nil {
			return
		}
		d := core.Decision{Policy: p, N: 1, Allowed: !denied, Quota: count, Remaining: remaining, Reset: algo.FromMicros(resetUS), RetryAfter: algo.FromMicros(retryUS)}
		h := http.Header{}
		Write(h, &d, Options{Style: Style(style % 4), Jitter: 0.5})
		for k, vs := range h {
			for _, v := range vs {
				if strings.ContainsAny(v, "\r\n\x00") || !isASCII(v) {
					t.Fatalf("%s: invalid field value %q", k, v)
				}
				if k == XLimit || k == XRemaining || k == XReset || k == RetryAfter {
					if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
						t.Fatalf("%s: %q is not a non-negative integer", k, v)
					}
				}
			}
		}
		if denied && Style(style%4) != None && h.Get(RetryAfter) == "" {
			t.Fatal("denied without Retry-After")
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
