package algo

import (
	"fmt"

	"github.com/tollgate/tollgate/core/internal/enum"
)

// Algorithm selects how a Limit counts requests.
type Algorithm uint8

// The algorithms. The zero value means "not set" and becomes DefaultAlgorithm.
const (
	// FixedWindow counts requests per window aligned to the Unix epoch. Cheapest;
	// allows up to 2×Count across a window boundary.
	FixedWindow Algorithm = iota + 1
	// SlidingLog remembers every request's time: exact, never more than Count in
	// any window of length Window, at 8 bytes per allowed request held.
	SlidingLog
	// SlidingCounter weights the previous fixed window's count by how much of it
	// still overlaps the sliding window (Cloudflare's estimate). O(1) memory,
	// small error.
	SlidingCounter
	// TokenBucket refills Count tokens per Window into a bucket of Burst tokens
	// (Burst defaults to Count).
	TokenBucket
	// GCRA is the leaky bucket as a meter (generic cell rate algorithm): requests
	// are spaced Window/Count apart, with Burst (default 1) allowed at once.
	GCRA
	// LeakyBucket is the leaky bucket as a shaper: a request over the rate is
	// delayed (Result.Delay) up to MaxDelay instead of rejected, and released no
	// faster than Count per Window.
	LeakyBucket
	// InFlight admits at most Count requests in flight at once. Each takes a
	// lease of Window that its gateway ends when the response is finished
	// (EndLease, Limiter.EndLease) and renews while the request runs; a
	// lease its gateway never ends (the node died) frees itself after Window.
	InFlight
	// Penalty is a penalty box, stacked under a policy's other limits: once
	// they have denied Count requests of a key within one Window (aligned
	// to the Unix epoch, as FixedWindow's), every request of the key is
	// refused for MaxDelay. It is not in Algorithms: it counts the others'
	// denials, not requests (see PenaltyLimit, Penalize).
	Penalty
)

// DefaultAlgorithm is used when a Limit leaves Algorithm unset.
const DefaultAlgorithm = SlidingCounter

var algorithmNames = []string{
	FixedWindow:    "fixed_window",
	SlidingLog:     "sliding_log",
	SlidingCounter: "sliding_counter",
	TokenBucket:    "token_bucket",
	GCRA:           "gcra",
	LeakyBucket:    "leaky_bucket",
	InFlight:       "in_flight",
	Penalty:        "penalty",
}

// Algorithms lists every algorithm, in declaration order.
var Algorithms = []Algorithm{FixedWindow, SlidingLog, SlidingCounter, TokenBucket, GCRA, LeakyBucket, InFlight}

// String returns the configuration name of a, such as "sliding_log".
func (a Algorithm) String() string { return enum.Name(algorithmNames, a, "Algorithm") }

// ParseAlgorithm returns the algorithm named s (as Algorithm.String prints it).
func ParseAlgorithm(s string) (Algorithm, error) {
	if a, ok := enum.Parse[Algorithm](algorithmNames, s); ok {
		return a, nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (want fixed_window, sliding_log, sliding_counter, token_bucket, gcra, leaky_bucket or in_flight)", s)
}
