// Package waitfor is for tests that wait for something to happen (a breaker
// to open, a window to pass): they poll a condition until a deadline rather
// than sleep a fixed time and hope.
package waitfor

import (
	"testing"
	"time"
)

// True polls cond every millisecond until it holds, and fails the test if
// it still does not after deadline. It returns how long it waited.
func True(t testing.TB, deadline time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return TrueEvery(t, deadline, time.Millisecond, what, cond)
}

// TrueEvery is True polling cond every period: for a condition that
// costs (it reads a whole load's samples), so that waiting does not load
// the machine under test.
func TrueEvery(t testing.TB, deadline, period time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(period)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > deadline {
			t.Fatalf("%s: not within %v", what, deadline)
		}
		<-tick.C
	}
	return time.Since(start)
}
