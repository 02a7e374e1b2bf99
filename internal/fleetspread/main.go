// Command fleetspread summarises runs of the adaptive fleet tests (make
// adaptive-fleet): it reads `go test -v` output, prints each run's
// figures, and per fleet size the median and worst goodput and share
// failing, and how many runs missed the targets (goodput ≥ 0.9 C, ≤ 5%
// failing). A change to the controller is then judged against the spread
// of many runs, not one.
package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// figures matches the fleet tests' figures line.
var figures = regexp.MustCompile(`fleet of (\d+): .* goodput ([0-9.]+)C, ([0-9.]+)% failing, p99 (\S+)`)

type run struct{ goodput, failing float64 }

func main() {
	runs := map[int][]run{}
	failed := 0
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		line := sc.Text()
		if m := figures.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			g, _ := strconv.ParseFloat(m[2], 64)
			f, _ := strconv.ParseFloat(m[3], 64)
			runs[n] = append(runs[n], run{g, f})
			fmt.Printf("fleet of %d, run %d: goodput %.2fC, %.1f%% failing, p99 %s\n", n, len(runs[n]), g, f, m[4])
		}
		if strings.HasPrefix(line, "--- FAIL") {
			failed++
		}
	}
	var sizes []int
	for n := range runs {
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	for _, n := range sizes {
		var goodput, failing []float64
		missed := 0
		for _, r := range runs[n] {
			goodput, failing = append(goodput, r.goodput), append(failing, r.failing)
			if r.goodput < 0.9 || r.failing > 5 {
				missed++
			}
		}
		slices.Sort(goodput)
		slices.Sort(failing)
		fmt.Printf("fleet of %d, %d runs: goodput median %.2fC worst %.2fC; failing median %.1f%% worst %.1f%%; %d runs missed goodput ≥ 0.9C or ≤ 5%% failing\n",
			n, len(runs[n]), median(goodput), goodput[0], median(failing), failing[len(failing)-1], missed)
	}
	if len(sizes) == 0 {
		fmt.Println("no fleet figures found")
		os.Exit(1)
	}
	if failed > 0 {
		fmt.Printf("%d tests failed (their margins are the tests', wider than the targets above)\n", failed)
		os.Exit(1)
	}
}

// median of sorted values.
func median(v []float64) float64 {
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
