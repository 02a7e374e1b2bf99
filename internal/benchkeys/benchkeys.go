// Package benchkeys gives benchmarks the keys of many clients in two
// orders: the one a store first sees them in and the one it is then asked
// in, as a gateway's clients arrive in no order the store laid their
// state out in.
package benchkeys

import (
	"math/rand/v2"
	"strconv"
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
