//go:build !tollgate_testclock

package openstore

import "github.com/tollgate/tollgate/core"

// testClock is nil: a production build's stores keep their own clocks
// (see TestClockFileEnv).
func testClock() core.Clock { return nil }
