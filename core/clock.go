package core

import (
	"time"
	_ "unsafe" // go:linkname, for the runtime's monotonic clock
)

// Clock tells the time in µs. Stores take one so tests can inject time.
type Clock interface {
	// NowMicros returns the current time in µs since the Unix epoch.
	NowMicros() int64
}

// MonotonicClock reads the process's monotonic clock, anchored once to the
// wall clock so windows align to the epoch, but never stepping with it
// (see MonotonicNow). A store may test for it to read MonotonicMicros
// without a call through the Clock interface.
type MonotonicClock struct{}

// NewMonotonicClock returns the Clock stores use by default.
func NewMonotonicClock() Clock { return MonotonicClock{} }

// NowMicros returns MonotonicMicros.
func (MonotonicClock) NowMicros() int64 { return MonotonicMicros() }

// MonotonicMicros returns the time in µs since the Unix epoch, from the
// monotonic clock (see MonotonicClock).
func MonotonicMicros() int64 {
	return clockOriginMicros + (nanotime()-clockOriginNanos)/1000
}

// ManualClock is a Clock that tests set by hand.
type ManualClock struct{ Micros int64 }

// NowMicros returns c.Micros.
func (c *ManualClock) NowMicros() int64 { return c.Micros }

// Advance moves c forward by d.
func (c *ManualClock) Advance(d time.Duration) { c.Micros += int64(d / time.Microsecond) }

// clockOrigin anchors the monotonic clock to the wall clock once; every
// later reading is the runtime's monotonic clock (runtime.nanotime) alone,
// read directly: about a quarter of what time.Now costs (it reads the wall
// clock too), and each decision reads it at least once. clockOriginNanos
// is the monotonic clock's reading at clockOrigin (ns).
var clockOrigin, clockOriginNanos = anchor(nanotime, time.Now)

// anchor reads the wall clock between two readings of the monotonic clock
// (ns), a few times, and returns the reading taken between the closest
// pair with their midpoint. A process descheduled between reading one
// clock and the other (a busy machine starting a gateway) would otherwise
// keep every later reading behind the wall clock by as long as it waited,
// and decide its windows that late for as long as it runs.
func anchor(mono func() int64, wall func() time.Time) (time.Time, int64) {
	var origin time.Time
	var originNanos, gap int64 = 0, -1
	for try := 0; try < 8 && (gap < 0 || gap > 2000); try++ {
		before := mono()
		w := wall()
		after := mono()
		if gap < 0 || after-before < gap {
			origin, originNanos, gap = w, before+(after-before)/2, after-before
		}
	}
	return origin, originNanos
}

// clockOriginMicros is clockOrigin's Unix time in µs.
var clockOriginMicros = clockOrigin.UnixMicro()

// nanotime is the runtime's monotonic clock in ns, what time.Since reads
// behind two calls. The runtime keeps it reachable by this name (Go issue
// 67401) for packages that read it this way.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// MonotonicNow returns the time since clockOrigin, from the monotonic clock.
func MonotonicNow() time.Duration { return time.Duration(nanotime() - clockOriginNanos) }

// MonotonicTime is time.Now from the monotonic clock alone (see
// MonotonicNow): a denial flood ages the sketch on every denial.
func MonotonicTime() time.Time { return clockOrigin.Add(MonotonicNow()) }
