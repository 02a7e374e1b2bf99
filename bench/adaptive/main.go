// Command adaptive measures tollgate's adaptive controllers against model
// upstreams of known capacity C offered 3C, on a virtual clock: the policy,
// its controller and its decisions are tollgate's own code (core), judged
// every interval as in a gateway; only time and the upstream are modelled.
// It prints, for each scenario and limit (a rate, an in-flight count), the
// gradient controller (the default) beside today's AIMD, and one line
// `vs aimd <scenario>/<limit>-<figure> <factor>` per figure, factor > 1
// meaning gradient is better. Two scenarios run a fleet: two and three
// nodes sharing the limit and the adaptive state (as through Redis), each
// reading the shared factor half an interval after sending its signals.
// -svg draws docs/adaptive.svg from the same runs (make plots).
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"

	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
)

// controllers are the contenders: the default gradient controller
// untuned, and AIMD with its defaults and a latency target of twice the
// unloaded latency (AIMD watches latency only against a target a user sets).
func controllers() []adaptive.Options {
	return []adaptive.Options{
		{Controller: adaptive.ControllerGradient},
		{Controller: adaptive.ControllerAIMD, LatencyTarget: 2 * service},
	}
}

// outcome is one scenario, limit and controller over every seed.
type outcome struct {
	scenario scenario
	limit    limitKind
	options  adaptive.Options
	runs     []run
	figures  []figures
}

// measure runs every scenario, limit and controller once per seed.
func measure(seeds int) []outcome {
	var out []outcome
	for _, scn := range scenarios() {
		for _, o := range controllers() {
			oc := outcome{scenario: scn, limit: scn.limit, options: o}
			for seed := 1; seed <= seeds; seed++ {
				r := simulate(scn, o, uint64(seed))
				oc.runs = append(oc.runs, r)
				oc.figures = append(oc.figures, r.figures())
			}
			out = append(out, oc)
		}
	}
	return out
}

// spread returns the mean, least and greatest of v over the runs.
func spread(figs []figures, v func(figures) float64) (mean, lo, hi float64) {
	var all []float64
	for _, f := range figs {
		all = append(all, v(f))
	}
	for _, x := range all {
		mean += x
	}
	return mean / float64(len(all)), slices.Min(all), slices.Max(all)
}

var columns = []struct {
	name   string
	value  func(figures) float64
	format string
	// better is true when a larger value is better.
	better bool
}{
	{"goodput/C", func(f figures) float64 { return f.goodput }, "%.2f", true},
	{"failing", func(f figures) float64 { return f.failing }, "%.1f%%", false},
	{"p99/unloaded", func(f figures) float64 { return f.p99 }, "%.2f", false},
	{"settle s", func(f figures) float64 { return f.settle.Seconds() }, "%.2f", false},
	{"recovery s", func(f figures) float64 { return f.recovery.Seconds() }, "%.1f", false},
	{"lowest factor", func(f figures) float64 { return f.lowest }, "%.2f", true},
	{"critical served", func(f figures) float64 { return f.critical }, "%.2f", true},
	{"worst 4 s failing", func(f figures) float64 { return f.worst4s }, "%.1f%%", false},
}

func main() {
	seeds := flag.Int("seeds", 5, "runs (random arrivals) per scenario, limit and controller")
	svg := flag.String("svg", "", "also draw the first seed's traces to this SVG file")
	flag.Float64Var(&capacity, "capacity", capacity, "the model upstreams' capacity C, requests/s")
	algorithm := flag.String("algorithm", "gcra", "the rate limit's algorithm: gcra, token_bucket, sliding_counter, fixed_window, sliding_log")
	flag.Parse()
	var err error
	if rateAlgorithm, err = algo.ParseAlgorithm(*algorithm); err != nil {
		log.Fatal(err)
	}
	out := measure(*seeds)
	fmt.Printf("adaptive: model upstreams of C = %.0f requests/s (unloaded latency %s) offered %.0fC; rate limit %s; mean (least–greatest) over %d seeds\n",
		capacity, service, offeredTimes, rateAlgorithm, *seeds)
	fmt.Printf("%-14s %-10s %-9s", "scenario", "limit", "controller")
	for _, c := range columns {
		fmt.Printf(" %-22s", c.name)
	}
	fmt.Println()
	for _, oc := range out {
		fmt.Printf("%-14s %-10s %-9s", oc.scenario.name, oc.limit, oc.options.Controller)
		for _, c := range columns {
			if !applies(oc.scenario, c.name) {
				fmt.Printf(" %-22s", "—")
				continue
			}
			m, lo, hi := spread(oc.figures, c.value)
			scale := map[bool]float64{true: 100, false: 1}[strings.HasSuffix(c.name, "failing")]
			cell := fmt.Sprintf(c.format+" ("+c.format+"–"+c.format+")", m*scale, lo*scale, hi*scale)
			fmt.Printf(" %-22s", cell)
		}
		fmt.Println()
	}
	for i := 0; i+1 < len(out); i += 2 {
		grad, aimd := out[i], out[i+1]
		for _, c := range columns {
			if !applies(grad.scenario, c.name) {
				continue
			}
			g, _, _ := spread(grad.figures, c.value)
			a, _, _ := spread(aimd.figures, c.value)
			fmt.Printf("vs aimd %s/%s-%s %.2f\n", grad.scenario.name, grad.limit, columnSlug(c.name), ratio(g, a, c.better, c.name))
		}
	}
	// The reserve against none, each with the default controller.
	var with, without *outcome
	for i := range out {
		if out[i].options.Controller == adaptive.ControllerGradient {
			switch out[i].scenario.name {
			case "priority-reserve":
				with = &out[i]
			case "priority-none":
				without = &out[i]
			}
		}
	}
	if with != nil && without != nil {
		w, _, _ := spread(with.figures, func(f figures) float64 { return f.critical })
		n, _, _ := spread(without.figures, func(f figures) float64 { return f.critical })
		fmt.Printf("vs no-reserve priority/rate-critical-served %.2f\n", w/n)
	}
	if *svg != "" {
		if err := os.WriteFile(*svg, []byte(render(out)), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

// applies says whether a column means something for a scenario.
func applies(s scenario, column string) bool {
	switch column {
	case "p99/unloaded":
		// A paused gateway delays its clients' answers itself.
		return s.upstream == queueing && len(s.pauses) == 0
	case "recovery s":
		return s.recovery
	case "lowest factor":
		return len(s.pauses) > 0
	case "critical served":
		return s.critical > 0
	case "worst 4 s failing":
		return s.nodes > 1
	}
	return true
}

func columnSlug(name string) string {
	return map[string]string{"goodput/C": "goodput", "failing": "failing", "p99/unloaded": "p99", "settle s": "settle", "recovery s": "recovery",
		"lowest factor": "lowest-factor", "critical served": "critical-served", "worst 4 s failing": "worst-4s-failing"}[name]
}

// ratio is gradient's figure against AIMD's, > 1 when gradient is better.
// Shares and times are floored (0.1%, 50ms) so a zero does not divide.
func ratio(g, a float64, higherBetter bool, column string) float64 {
	if higherBetter {
		return g / a
	}
	floor := map[string]float64{"failing": 0.001, "worst 4 s failing": 0.001, "settle s": 0.05, "recovery s": 0.05}[column]
	return max(a, floor) / max(g, floor)
}
