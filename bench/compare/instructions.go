package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/bench/internal/callgrind"
	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// Instruction counts are the figure of the comparison that holds on every
// CPU: `valgrind --tool=callgrind` counts the instructions a program
// executes, the same for the same binary and inputs whatever else the
// machine does. Each contender runs in a child process of this binary
// (-child) deciding n requests serially after warming its keys; the
// difference between a run of 2n and one of n decisions, divided by n, is
// its cost per decision, with start-up and warm-up cancelled out.

// childDecisions is n: enough that the difference dwarfs callgrind's noise.
const childDecisions = 200_000

// serialWorkloads are the workloads measured in instructions (one core:
// instructions are per decision, whatever the parallelism).
var serialWorkloads = []workload{{"serial-1key", 1, false}, {"serial-100k-keys", 100_000, false}}

// contenders lists tollgate's algorithms, the peers and the floor, by a
// name the child finds again.
func contenders() []limiter {
	var cs []limiter
	for _, a := range []algo.Algorithm{algo.TokenBucket, algo.FixedWindow, algo.GCRA, algo.SlidingCounter} {
		cs = append(cs, limiter{"tollgate", a, tollgate(a)})
	}
	cs = append(cs, limiter{stackedName, algo.TokenBucket, tollgateStacked})
	for _, p := range peers {
		cs = append(cs, limiter(p))
	}
	return append(cs, limiter{floorName, 0, floor})
}

func contenderID(c limiter) string { return c.name + "/" + c.algorithm.String() }

// runChild decides n requests of workload w with the contender named id,
// serially, after one warming pass over the keys.
func runChild(id, workloadName string, n int) {
	for _, w := range serialWorkloads {
		if w.name != workloadName {
			continue
		}
		for _, c := range contenders() {
			if contenderID(c) != id {
				continue
			}
			names := keyNames(w.keys)
			decide := c.make(w.keys)
			d := new(core.Decision)
			for _, k := range names {
				decide(k, d)
			}
			for i := 0; i < n; i++ {
				decide(names[i%len(names)], d)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "no contender %q in workload %q\n", id, workloadName)
	os.Exit(2)
}

// instructionsOf runs the child under callgrind, the collector off, and
// returns the instructions it executed.
func instructionsOf(id, workloadName string, n int) (int64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	return callgrind.Instructions([]string{"GOGC=off"}, self, "-child", id, "-workload", workloadName, "-n", strconv.Itoa(n))
}

// instructions prints each contender's instructions per decision and the
// `vs <peer> instructions-<workload> <factor>` lines (peer over tollgate
// with its closest algorithm; the floor over tollgate's token bucket).
func instructions(only string) {
	fmt.Printf("%-18s %-22s %-16s %14s\n", "workload", "limiter", "algorithm", "instr/decision")
	var lines []string
	for _, w := range serialWorkloads {
		if only != "" && w.name != only {
			continue
		}
		ours := map[algo.Algorithm]float64{}
		for _, c := range contenders() {
			id := contenderID(c)
			one, err := instructionsOf(id, w.name, childDecisions)
			check(err)
			two, err := instructionsOf(id, w.name, 2*childDecisions)
			check(err)
			per := float64(two-one) / childDecisions
			alg := c.algorithm.String()
			if c.name == floorName {
				alg = "-"
			}
			fmt.Printf("%-18s %-22s %-16s %14.0f\n", w.name, c.name, alg, per)
			switch {
			case c.name == "tollgate":
				ours[c.algorithm] = per
			case c.name == stackedName:
				// No peer stacks limits: its row is there to be compared
				// with tollgate's own earlier figures.
			case c.name == floorName:
				lines = append(lines, fmt.Sprintf("vs %s instructions-%s-token_bucket %.2f", floorName, w.name, per/ours[algo.TokenBucket]))
			default:
				lines = append(lines, fmt.Sprintf("vs %s instructions-%s %.2f", c.name, w.name, per/ours[c.algorithm]))
			}
		}
	}
	fmt.Println()
	fmt.Println(strings.Join(lines, "\n"))
}
