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
