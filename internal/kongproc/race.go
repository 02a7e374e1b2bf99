//go:build race

package kongproc

// raceEnabled reports that the tests run with the race detector.
const raceEnabled = true
