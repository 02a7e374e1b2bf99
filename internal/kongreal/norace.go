//go:build !race

package kongreal

// raceEnabled reports that the tests run with the race detector.
const raceEnabled = false
