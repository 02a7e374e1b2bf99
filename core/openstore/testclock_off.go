//go:build !tollgate_testclock

package openstore

import "github.com/tollgate/tollgate/core"

// TestClockBuilt says this binary's stores read TestClockFileEnv: a
// production build's never do.
const TestClockBuilt = false

// testClock is nil: a production build's stores keep their own clocks
// (see TestClockFileEnv).
func testClock() core.Clock { return nil }
