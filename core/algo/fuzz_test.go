package algo

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzStep drives every algorithm with arbitrary limits and request streams
// and checks what must hold whatever the input: no panic, sane verdicts, and
// a dropped request leaving no trace.
func FuzzStep(f *testing.F) {
	f.Add(uint8(1), int64(3), int64(1_000_000), int64(0), int64(0), []byte{0, 1, 10, 2, 200, 1, 0, 5})
	f.Add(uint8(2), int64(5), int64(500_000), int64(0), int64(0), []byte{1, 1, 1, 1, 255, 3, 0, 0, 7, 1})
	f.Add(uint8(3), int64(10), int64(1_000_000), int64(0), int64(0), []byte{9, 9, 9, 9, 9, 9})
	f.Add(uint8(4), int64(10), int64(1_000_000), int64(5), int64(0), []byte{0, 5, 0, 1, 100, 1})
	f.Add(uint8(5), int64(3), int64(1_000_000), int64(1), int64(0), []byte{0, 1, 0, 1, 33, 1})
	f.Add(uint8(6), int64(10), int64(1_000_000), int64(0), int64(250_000), []byte{0, 1, 0, 1, 0, 1, 0, 1})
	f.Fuzz(func(t *testing.T, alg uint8, count, windowUS, burst, maxDelayUS int64, ops []byte) {
		l := Limit{Count: count, Window: FromMicros(windowUS), Algorithm: Algorithm(alg%7 + 0), Burst: burst, MaxDelay: FromMicros(maxDelayUS)}
		if l.Algorithm == 0 || l.Normalize() != nil {
			return
		}
		if l.Algorithm == SlidingLog && l.Count > 10_000 {
			return // keep each input cheap
		}
		now := t0
		var s State
		for i := 0; i+1 < len(ops); i += 2 {
			now += int64(ops[i]) * windowUS / 64
			cost := int64(ops[i+1] % 4)
			next, r := Step(&l, s, now, cost)
			if r.Remaining < 0 || r.Reset < 0 || r.Delay < 0 || r.RetryAfter < 0 {
				t.Fatalf("negative field in %+v", r)
			}
			if !r.Allowed && r.RetryAfter <= 0 && cost > 0 {
				t.Fatalf("denied without RetryAfter: %+v", r)
			}
			if r.Allowed && r.Delay > l.MaxDelay && l.Algorithm == LeakyBucket {
				t.Fatalf("delay %v above max %v", r.Delay, l.MaxDelay)
			}
			if r.Allowed && ops[i]%3 == 0 {
				next, _ = Step(&l, Dropped(&l, s, next, cost), now, 0)
			}
			s = next
		}
	})
}

// FuzzParseRate: anything ParseRate accepts prints back to an equal rate.
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"600/1m", "100/10s", "5/second", "3600/hour", "1/1d", "7/1.5d", "10/1m30s", "0/1s", "1/", "x/1s", "1/0s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, w, err := ParseRate(s)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("error %q does not quote the input", err)
			}
			return
		}
		if n < 1 || w < time.Microsecond {
			t.Fatalf("accepted %q as %d/%v", s, n, w)
		}
		l := Limit{Count: n, Window: w}
		n2, w2, err := ParseRate(l.Rate())
		if err != nil || n2 != n || w2 != w {
			t.Fatalf("%q -> %q -> %d/%v, %v", s, l.Rate(), n2, w2, err)
		}
	})
}
