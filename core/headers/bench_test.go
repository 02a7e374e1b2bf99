package headers

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
	"github.com/tollgate/tollgate/internal/benchkeys"
)

// BenchmarkWriteVsFloor measures what a Renderer's Write costs an allowed
// request of one policy "p" of 100,000 a minute in the default style (the
// five headers the gateways' in-process benchmarks send) against the
// header floor, the same five set with http.Header.Set
// (benchkeys.HeaderFloor), each into a header map cleared between
// requests as a recycled response's is: 30 rounds of 100,000 that
// alternate the two (benchkeys.Interleaved). It prints `vs header-floor
// headers-write <factor>` (the floor's ns ÷ Write's, the rounds' median:
// above 1, Write costs less) with the median difference and the
// allocations of each. make bench-core runs it.
func BenchmarkWriteVsFloor(b *testing.B) {
	if b.N > 1 {
		return // measured once, at b.N == 1, by its own rounds
	}
	p := core.MustPolicy("p", core.PolicyOptions{}, algo.Limit{Count: 100_000, Window: time.Minute, Algorithm: algo.SlidingCounter})
	d := core.Decision{Policy: p, N: 1, Allowed: true, Quota: 100_000, Remaining: 99_999, Reset: time.Minute}
	d.Results[0].Remaining = 99_999
	r := NewRenderer(Options{}, p)
	floor := benchkeys.NewHeaderFloor(100_000, 60)
	h := http.Header{}
	contenders := []func(){func() { floor.Set(h) }, func() { r.Write(h, &d) }}
	serve := func(i, n int) {
		for range n {
			clear(h)
			contenders[i]()
		}
	}
	ns := benchkeys.Interleaved(len(contenders), 30, 100_000, serve)
	allocs := [2]float64{}
	for i := range contenders {
		allocs[i] = testing.AllocsPerRun(1000, func() { serve(i, 1) })
	}
	g := benchkeys.GapOf(ns[0], ns[1])
	fmt.Printf("header floor %.0f ns %.0f allocs, Renderer.Write %.0f ns %.0f allocs (medians of 30 rounds)\n",
		benchkeys.Median(ns[0]), allocs[0], benchkeys.Median(ns[1]), allocs[1])
	fmt.Printf("vs header-floor headers-write %.2f (Write %.0f ns above the floor, rounds' quartiles %.0f to %.0f)\n", g.Factor, g.Median, g.Q1, g.Q3)
}
