package memory

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// BenchmarkDecide measures one decision per algorithm, serial and parallel,
// on 1 key and on 1M keys (all tracked before timing; the cap is raised so
// nothing is evicted). Counts are high enough that decisions stay allowed.
func BenchmarkDecide(b *testing.B) {
	for _, keys := range []int{1, 1_000_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = "10." + strconv.Itoa(i>>16) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
		}
		for _, a := range algo.Algorithms {
			// Limits that allow every request and keep every key alive.
			l := algo.Limit{Count: 1_000_000, Window: time.Hour, Algorithm: a}
			switch a {
			case algo.SlidingLog:
				if keys > 1 {
					l.Count = 16 // 8 bytes per request held, per key
				}
			case algo.TokenBucket, algo.GCRA:
				l.Window, l.Burst = time.Second, 2_000_000_000
			case algo.LeakyBucket:
				l.Window, l.MaxDelay, l.Burst = time.Second, time.Second, 2_000_000_000
			}
			p := core.MustPolicy("bench", core.PolicyOptions{}, l)
			s := MustNew(Options{MaxKeys: 2 * keys})
			var d core.Decision
			for _, k := range names {
				_ = s.Decide(context.Background(), p, k, 1, &d)
			}
			name := a.String() + "/keys=" + strconv.Itoa(keys)
			b.Run(name+"/serial", func(b *testing.B) {
				var d core.Decision
				ctx := context.Background()
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					_ = s.Decide(ctx, p, names[i%keys], 1, &d)
				}
			})
			b.Run(name+"/parallel", func(b *testing.B) {
				var next atomic.Int64
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					var d core.Decision
					ctx := context.Background()
					i := int(next.Add(7919))
					for pb.Next() {
						i++
						_ = s.Decide(ctx, p, names[i%keys], 1, &d)
					}
				})
			})
		}
	}
}

// BenchmarkDecideRandomOrder decides sliding_counter on 100k and 1M
// tracked keys taken in a random order, as a gateway's clients arrive,
// not in the order they were first seen (which lays their entries out for
// the cache's prefetcher); the key strings are read in sequence.
func BenchmarkDecideRandomOrder(b *testing.B) {
	for _, keys := range []int{100_000, 1_000_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = "10." + strconv.Itoa(i>>16) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
		}
		p := core.MustPolicy("bench", core.PolicyOptions{}, algo.Limit{Count: 1_000_000, Window: time.Hour, Algorithm: algo.SlidingCounter})
		s := MustNew(Options{MaxKeys: 2 * keys})
		var d core.Decision
		for _, k := range names {
			_ = s.Decide(context.Background(), p, k, 1, &d)
		}
		shuffled := make([]string, keys)
		for i, j := range rand.New(rand.NewPCG(1, 2)).Perm(keys) {
			shuffled[i] = strings.Clone(names[j])
		}
		b.Run("sliding_counter/keys="+strconv.Itoa(keys), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				_ = s.Decide(context.Background(), p, shuffled[i%keys], 1, &d)
			}
		})
	}
}
