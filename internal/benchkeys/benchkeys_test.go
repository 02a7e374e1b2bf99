package benchkeys

import "testing"

func TestGapOfTakesTheMedianOfTheRoundsDifferences(t *testing.T) {
	floor := []float64{100, 200, 100, 100, 300}
	contender := []float64{150, 200, 400, 125, 310}
	// Differences 50, 0, 300, 25, 10: sorted 0 10 25 50 300.
	g := GapOf(floor, contender)
	if g.Median != 25 || g.Q1 != 10 || g.Q3 != 50 {
		t.Errorf("GapOf = %+v, want median 25, quartiles 10 and 50", g)
	}
	// Ratios 0.67, 1, 0.25, 0.8, 0.97: median 0.8.
	if g.Factor != 0.8 {
		t.Errorf("factor %v, want 0.8", g.Factor)
	}
	if m := Median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("Median = %v, want 2", m)
	}
}

func TestInterleavedStartsEachRoundWithAnotherContender(t *testing.T) {
	var order []int
	ns := Interleaved(3, 3, 1, func(i, n int) { order = append(order, i) })
	want := []int{0, 1, 2, 1, 2, 0, 2, 0, 1}
	for k := range want {
		if order[k] != want[k] {
			t.Fatalf("served in order %v, want %v", order, want)
		}
	}
	if len(ns) != 3 || len(ns[0]) != 3 {
		t.Errorf("got %d contenders of %d rounds, want 3 of 3", len(ns), len(ns[0]))
	}
}
