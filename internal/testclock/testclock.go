// Package testclock sets the time that the stores of a test build read:
// binaries built with the tag tollgate_testclock (the plugin servers the
// Kong tests start, and make test's own test binaries) open every store on
// the clock in the file openstore.TestClockFileEnv names. A test moves
// that time instead of waiting for a window to pass, and its expected
// resets and retry-afters hold however slow the machine is.
package testclock

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core/openstore"
)

// Clock is a time that stands still until the test moves it, kept in a
// file of the test's temporary directory.
type Clock struct {
	t    testing.TB
	file string

	mu  sync.Mutex
	now time.Time
}

// New returns a clock standing at start.
func New(t testing.TB, start time.Time) *Clock {
	t.Helper()
	c := &Clock{t: t, file: filepath.Join(t.TempDir(), "now")}
	c.Set(start)
	return c
}

// Env is the environment entry that puts a process's stores on c: for a
// plugin server the test starts.
func (c *Clock) Env() string { return openstore.TestClockFileEnv + "=" + c.file }

// InProcess puts the stores this test process opens from now on until
// the test ends on c (a Caddy the test runs in process, a store it opens
// itself). It fails the test in a binary built without the tag
// tollgate_testclock, whose stores keep their own clocks. The test must not
// be parallel (t.Setenv).
func (c *Clock) InProcess() *Clock {
	c.t.Helper()
	if !openstore.TestClockBuilt {
		c.t.Fatal("testclock: this test binary's stores keep their own clocks: build it with -tags tollgate_testclock (make test does)")
	}
	c.t.Setenv(openstore.TestClockFileEnv, c.file)
	return c
}

// Now is c's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves c to tm (back, too).
func (c *Clock) Set(tm time.Time) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	// Written whole, then renamed: a store reading it never sees half a time.
	tmp := c.file + ".new"
	err := os.WriteFile(tmp, []byte(strconv.FormatInt(tm.UnixMicro(), 10)), 0o644)
	if err == nil {
		err = os.Rename(tmp, c.file)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	c.now = tm
}

// Advance moves c forward by d.
func (c *Clock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }
