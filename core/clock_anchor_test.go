package core

import (
	"testing"
	"time"
)

// TestAnchorTakesTheClosestReadings: a wall reading taken while the
// process waited (a wide gap between the monotonic readings around it) is
// not the anchor when a later try reads both clocks close together.
func TestAnchorTakesTheClosestReadings(t *testing.T) {
	// Each try reads mono, wall, mono. The first try waits 300 ms between
	// its wall reading and the monotonic reading after it; the second does not.
	monos := []int64{1_000, 300_001_000, 300_002_000, 300_002_500}
	walls := []time.Time{time.Unix(100, 0), time.Unix(100, 300_001_500)}
	m, w := 0, 0
	mono := func() int64 { m++; return monos[m-1] }
	wall := func() time.Time { w++; return walls[w-1] }
	origin, nanos := anchor(mono, wall)
	if !origin.Equal(walls[1]) || nanos != 300_002_250 {
		t.Fatalf("anchor = %v at %d ns, want %v at 300002250 ns", origin, nanos, walls[1])
	}
	if m != 4 || w != 2 {
		t.Fatalf("anchor read the clocks %d and %d times, want 4 and 2 (it stops at a gap of 2 µs or less)", m, w)
	}
}
