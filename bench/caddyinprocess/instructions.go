package main

import (
	"fmt"
	"strconv"

	"github.com/tollgate/tollgate/bench/internal/callgrind"
)

// With -instructions the contenders are measured in instructions, the
// figure that holds on every CPU and that a busy machine cannot move:
// `valgrind --tool=callgrind` counts what a child executes serving n and
// then 2n requests (after the same warming pass over every key), and the
// difference divided by n is one request's instructions, start-up and
// warm-up cancelled out. The children run on one thread with the collector
// off (GOGC=off), so the figures leave out the collector's work, which
// tollgate's six allocations fewer than the floor's would only lower, and
// memory latency, which a count of instructions does not see.

// instructionRequests is n: enough that the difference dwarfs callgrind's
// noise, few enough that 3n requests' garbage, never collected, fits.
const instructionRequests = 20_000

// instructionsOf runs contender c's child under callgrind serving n
// requests, the collector off, and returns the instructions it executed.
func instructionsOf(self, c string, n int) (int64, error) {
	return callgrind.Instructions([]string{"GOGC=off"}, self, "-child", c, "-n", strconv.Itoa(n))
}

// instructions prints each contender's instructions per request, what it
// executes above no limiter and above the header floor, and
//
//	vs header-floor instructions-100k-keys-allowed-<algorithm> <factor>
//	vs caddy-ratelimit instructions-100k-keys-allowed-<algorithm>-overhead <factor>
//
// (the floor's instructions ÷ tollgate's; caddy-ratelimit's excess over no
// limiter ÷ tollgate's: > 1, tollgate executes fewer).
func instructions(self string) error {
	per := map[string]float64{}
	fmt.Printf("%d keys asked in random order, all allowed; instructions per request under callgrind (%d and %d requests), one thread, collector off\n\n",
		keyCount, instructionRequests, 2*instructionRequests)
	for _, c := range contenders {
		one, err := instructionsOf(self, c, instructionRequests)
		if err != nil {
			return err
		}
		two, err := instructionsOf(self, c, 2*instructionRequests)
		if err != nil {
			return err
		}
		per[c] = float64(two-one) / instructionRequests
	}
	none, floor := per["no limiter"], per["header floor"]
	fmt.Printf("%-26s %18s %22s %24s\n", "contender", "instr/request", "over no limiter", "over the header floor")
	for _, c := range contenders {
		fmt.Printf("%-26s %18.0f %22.0f %24.0f\n", c, per[c], per[c]-none, per[c]-floor)
	}
	fmt.Println()
	for _, alg := range []string{"sliding_log", "sliding_counter"} {
		ours := per["tollgate "+alg]
		fmt.Printf("vs header-floor instructions-100k-keys-allowed-%s %.2f\n", alg, floor/ours)
		fmt.Printf("vs caddy-ratelimit instructions-100k-keys-allowed-%s-overhead %.2f\n", alg, (per["caddy-ratelimit"]-none)/(ours-none))
	}
	return nil
}
