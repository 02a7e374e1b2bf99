// Package benchkeys gives benchmarks the keys of many clients in two
// orders: the one a store first sees them in and the one it is then asked
// in, as a gateway's clients arrive in no order the store laid their
// state out in; and the floors the in-process benchmarks compare with
// (HeaderFloor, StateFloor).
package benchkeys

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// Orders returns n distinct keys ("k0" to "k<n-1>") in two fixed random
// orders: asked, the order a benchmark asks in, and firstSeen, the same
// keys in the order it shows them to the store first.
func Orders(n int) (asked, firstSeen []string) {
	rng := rand.New(rand.NewPCG(1, 2))
	permuted := func() []string {
		k := make([]string, n)
		for i, j := range rng.Perm(n) {
			k[i] = "k" + strconv.Itoa(j)
		}
		return k
	}
	asked = permuted()
	return asked, permuted()
}

// Set is one key count a benchmark measures: its name ("1k"), its keys in
// the order asked and in the order first seen (see Orders).
type Set struct {
	Name             string
	Asked, FirstSeen []string
}

// Sets are the in-process benchmarks' two key counts: 1,000 keys, whose
// states stay in the CPU's caches, and 100,000, where reaching a key's
// state misses them.
func Sets() []Set {
	few, fewFirst := Orders(1_000)
	many, manyFirst := Orders(100_000)
	return []Set{{"1k", few, fewFirst}, {"100k", many, manyFirst}}
}

// StateFloor is the least work a limiter that keeps state per key does per
// request, beyond what a stateless handler does: hash the key and write
// the one 64-byte line that holds the key's state, in a table of one line
// per key (a power of two at least 4/3 the keys, as full as the memory
// store's tables at most). It takes no lock, resolves no collision and
// runs no algorithm, so it is a floor, not a limiter: a benchmark's
// handler that calls Touch beside the headers shows what reaching 100,000
// keys' state costs any limiter in memory latency (the key's bytes and
// its state's line missing the CPU's caches), apart from the work of the
// limiter's pipeline. Not safe for concurrent use.
type StateFloor struct {
	seed  maphash.Seed
	mask  uint64
	lines [][8]int64 // 64 bytes each
}

// NewStateFloor returns a StateFloor sized for keys distinct keys.
func NewStateFloor(keys int) *StateFloor {
	size := 1
	for size < keys+keys/3 {
		size *= 2
	}
	return &StateFloor{seed: maphash.MakeSeed(), mask: uint64(size - 1), lines: make([][8]int64, size)}
}

// Touch counts a request of key in the line its hash names.
func (f *StateFloor) Touch(key string) {
	f.lines[maphash.String(f.seed, key)&f.mask][0]++
}

// HeaderFloor is the five headers tollgate sends, in its default style, on
// a request allowed by one policy "p" of count per window seconds, with
// count-1 left: what a header floor, a handler that only sets them, writes,
// of the same sizes.
type HeaderFloor [][2]string

// NewHeaderFloor returns the HeaderFloor of a policy of count per window
// seconds.
func NewHeaderFloor(count, window int) HeaderFloor {
	c, left, w := strconv.Itoa(count), strconv.Itoa(count-1), strconv.Itoa(window)
	return HeaderFloor{
		{"RateLimit-Policy", `"p";q=` + c + ";w=" + w},
		{"RateLimit", `"p";r=` + left + ";t=" + w},
		{"X-RateLimit-Limit", c},
		{"X-RateLimit-Remaining", left},
		{"X-RateLimit-Reset", w},
	}
}

// Set sets f's headers in h, as the floor handler does on every request.
func (f HeaderFloor) Set(h http.Header) {
	for _, kv := range f {
		h.Set(kv[0], kv[1])
	}
}

// Interleaved measures contenders in rounds that alternate them, so that
// what drifts on a busy machine (another tenant's load, the collector's
// pace) falls on every contender alike: each round has serve(i, perRound)
// serve perRound requests with each contender i in turn, starting with a
// different one each round. It returns each contender's ns per request,
// by round: [contender][round].
func Interleaved(contenders, rounds, perRound int, serve func(i, n int)) [][]float64 {
	ns := make([][]float64, contenders)
	for i := range ns {
		ns[i] = make([]float64, rounds)
	}
	for r := range rounds {
		for k := range contenders {
			i := (r + k) % contenders
			began := time.Now()
			serve(i, perRound)
			ns[i][r] = float64(time.Since(began).Nanoseconds()) / float64(perRound)
		}
	}
	return ns
}

// The in-process floor comparisons' rounds (see Interleaved): how many,
// and the requests each contender serves in each.
const (
	FloorRounds        = 30
	FloorRoundRequests = 20_000
)

// PrintVsFloors prints an in-process floor comparison of one key set
// (name, such as "1k"): ns is Interleaved's of the header floor, the state
// floor and the contender, in that order, allocs their allocations per
// request. It prints the rounds' medians, then `vs header-floor
// <workload> <factor>` and `vs state-floor <workload> <factor>` with the
// median difference, its quartiles and the allocations above the floor;
// contender names the contender in the first line.
func PrintVsFloors(name, contender, workload string, ns [][]float64, allocs [3]float64) {
	fmt.Printf("%s keys, median of %d rounds: header floor %.0f ns/op %.1f allocs/op, state floor %.0f ns/op, %s %.0f ns/op %.1f allocs/op\n",
		name, len(ns[0]), Median(ns[0]), allocs[0], Median(ns[1]), contender, Median(ns[2]), allocs[2])
	for i, floor := range []string{"header-floor", "state-floor"} {
		g := GapOf(ns[i], ns[2])
		fmt.Printf("vs %s %s %.2f (tollgate %.0f ns above the floor, rounds' quartiles %.0f to %.0f; %.1f allocs)\n",
			floor, workload, g.Factor, g.Median, g.Q1, g.Q3, allocs[2]-allocs[i])
	}
}

// Gap compares a contender with a floor over the same rounds of
// Interleaved: the median of the rounds' differences (contender − floor,
// ns per request), their quartiles, and the median of the rounds' ratios
// floor ÷ contender (above 1: the contender costs less than the floor).
type Gap struct {
	Median, Q1, Q3 float64
	Factor         float64
}

// GapOf returns the Gap of contender over floor, both by round.
func GapOf(floor, contender []float64) Gap {
	diffs, ratios := make([]float64, len(floor)), make([]float64, len(floor))
	for r := range floor {
		diffs[r], ratios[r] = contender[r]-floor[r], floor[r]/contender[r]
	}
	slices.Sort(diffs)
	slices.Sort(ratios)
	return Gap{Median: quantile(diffs, 0.5), Q1: quantile(diffs, 0.25), Q3: quantile(diffs, 0.75), Factor: quantile(ratios, 0.5)}
}

// quantile returns the q quantile of sorted (the nearest rank).
func quantile(sorted []float64, q float64) float64 {
	return sorted[int(q*float64(len(sorted)-1)+0.5)]
}

// Median returns the median of values (unsorted; not changed).
func Median(values []float64) float64 {
	return quantile(slices.Sorted(slices.Values(values)), 0.5)
}
