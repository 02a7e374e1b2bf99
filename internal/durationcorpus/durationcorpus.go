// Package durationcorpus is the one corpus of windows every front door
// (Go, the Caddyfile, Caddy's JSON, Kong's schema and plugin) is tested
// against: each must take the same windows and refuse the others in the
// same words (algo.ParseWindow's).
package durationcorpus

import "time"

// Window is a window as written, and what it reads as (0: refused).
type Window struct {
	Text string
	Want time.Duration
}

// Windows are the corpus: what users write, right and wrong.
var Windows = []Window{
	{"1s", time.Second}, {"10s", 10 * time.Second}, {"250ms", 250 * time.Millisecond}, {"1m", time.Minute},
	{"1m30s", 90 * time.Second}, {"1h30m", 90 * time.Minute}, {"1.5m", 90 * time.Second}, {"1.5h", 90 * time.Minute},
	{"0.5s", 500 * time.Millisecond}, {"1h1m1s1ms1us", time.Hour + time.Minute + time.Second + time.Millisecond + time.Microsecond},
	{"1d", 24 * time.Hour}, {"1.5d", 36 * time.Hour}, {"7d", 7 * 24 * time.Hour}, {"1mo", 30*24*time.Hour + 1}, {"1y", 365*24*time.Hour + 1},
	{"100us", 100 * time.Microsecond}, {"1us", time.Microsecond}, {"0.001ms", time.Microsecond}, {"86400s", 24 * time.Hour},
	{"99999h", 99999 * time.Hour}, {"9999d", 9999 * 24 * time.Hour}, {"99999h99999h99999h9m", 299997*time.Hour + 9*time.Minute},
	{"999999m", 999999 * time.Minute}, {"99999999s", 99999999 * time.Second}, {"999999999ms", 999999999 * time.Millisecond}, {"999999999999us", 999999999999 * time.Microsecond}, {"007s", 7 * time.Second},
	// Refused.
	{"1m30", 0}, {"1h30", 0}, {"90", 0}, {"10x", 0}, {"", 0}, {"0s", 0}, {"0d", 0}, {"0.000s", 0}, {"-1s", 0}, {"+1s", 0},
	{"1.s", 0}, {".5s", 0}, {"1..5s", 0}, {"1.2.3s", 0}, {"1.0001s", 0}, {"1.5us", 0}, {"500ns", 0}, {"1µs", 0},
	{"1 s", 0}, {" 1s", 0}, {"1S", 0}, {"minute", 0}, {"1minute", 0}, {"1min", 0}, {"1sec", 0}, {"1hr", 0},
	{"2mo", 0}, {"1mo1d", 0}, {"11mo", 0}, {"2y", 0}, {"1y1d", 0}, {"1d12h", 0}, {"1h1d", 0}, {"1dd", 0}, {"d", 0}, {"s", 0},
	{"1mm", 0}, {"1hs", 0}, {"1ss", 0}, {"1sm", 0}, {"1us1", 0}, {"1u", 0}, {"1o", 0}, {"1m0", 0},
	{"100000h", 0}, {"10000d", 0}, {"9999999m", 0}, {"999999999s", 0}, {"9999999999ms", 0}, {"9999999999999us", 0},
	{"999999h999999h999999h", 0}, {"1h1h1h1h1h1h1h1h1h1h1h", 0}, {"1e3s", 0}, {"0x10s", 0}, {"Infs", 0}, {"NaNd", 0},
}

// Strings are every string of up to n bytes over alphabet, for checks that
// two readings of the grammar agree everywhere near it.
func Strings(alphabet string, n int) []string {
	out := []string{""}
	level := []string{""}
	for range n {
		var next []string
		for _, s := range level {
			for i := range len(alphabet) {
				next = append(next, s+alphabet[i:i+1])
			}
		}
		out = append(out, next...)
		level = next
	}
	return out
}
