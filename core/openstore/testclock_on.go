//go:build tollgate_testclock

package openstore

import (
	"os"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/core"
)

// TestClockBuilt says this binary's stores read TestClockFileEnv.
const TestClockBuilt = true

// testClock is the clock TestClockFileEnv names, in the integration tests'
// builds (-tags tollgate_testclock); nil when it is not set.
func testClock() core.Clock {
	if f := os.Getenv(TestClockFileEnv); f != "" {
		return fileClock(f)
	}
	return nil
}

// fileClock reads the time from a file: a Unix time in µs; 0 when the file
// cannot be read.
type fileClock string

func (f fileClock) NowMicros() int64 {
	b, _ := os.ReadFile(string(f))
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}
