// Command plots replays one bursty trace through every algorithm, at the
// same limit of 10 requests per second, and draws what each did with every
// request (allowed, delayed, denied) as one SVG: docs/algorithms.svg.
// `make plots` runs it.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/adaptive"
	"github.com/tollgate/tollgate/core/algo"
)

// span is the trace's length; the drawing's x axis.
const span = 14 * time.Second

// trace returns the arrival times: steady traffic under the limit, a burst
// straddling the window boundary at 4 s, sustained overload, one instant
// spike, then light traffic.
func trace() []time.Duration {
	var ts []time.Duration
	every := func(from, to time.Duration, rps int) {
		for t := from; t < to; t += time.Second / time.Duration(rps) {
			ts = append(ts, t)
		}
	}
	every(0, 3*time.Second, 5)
	every(3800*time.Millisecond, 4200*time.Millisecond, 50) // 20 around the boundary
	every(5*time.Second, 8*time.Second, 15)
	for i := 0; i < 25; i++ {
		ts = append(ts, 9*time.Second)
	}
	every(10*time.Second, span, 8)
	return ts
}

// outcome is what a limiter did with one request.
type outcome struct {
	at      time.Duration
	allowed bool
	delay   time.Duration
}

type panel struct {
	title    string
	outcomes []outcome
	// limits is the effective count over time (adaptive only).
	limits []point
}

type point struct {
	at    time.Duration
	count int64
}

func replay(p *core.Policy, ts []time.Duration, judge func(at time.Duration, o outcome)) []outcome {
	states := make([]algo.State, len(p.Limits()))
	const epoch = int64(1_700_000_000_000_000) // µs, on a second boundary
	var out []outcome
	var d core.Decision
	for _, t := range ts {
		p.StoreSide().Apply(states, epoch+t.Microseconds(), 1, &d)
		o := outcome{at: t, allowed: d.Allowed, delay: d.Delay}
		out = append(out, o)
		if judge != nil {
			judge(t, o)
		}
	}
	return out
}

func main() {
	outPath := flag.String("o", "docs/algorithms.svg", "output file")
	flag.Parse()
	ts := trace()
	limit := func(a algo.Algorithm, burst int64, maxDelay time.Duration) algo.Limit {
		return algo.Limit{Count: 10, Window: time.Second, Algorithm: a, Burst: burst, MaxDelay: maxDelay}
	}
	var panels []panel
	for _, c := range []struct {
		title string
		limit algo.Limit
	}{
		{"fixed_window 10/1s — note up to 20 within 0.4 s around the 4 s boundary", limit(algo.FixedWindow, 0, 0)},
		{"sliding_log 10/1s — exact: never more than 10 in any 1 s", limit(algo.SlidingLog, 0, 0)},
		{"sliding_counter 10/1s — weighted estimate of the sliding window", limit(algo.SlidingCounter, 0, 0)},
		{"token_bucket 10/1s, burst 10 — bursts up to 10, then the refill rate", limit(algo.TokenBucket, 10, 0)},
		{"gcra 10/1s, burst 1 — one request per 100 ms, evenly spaced", limit(algo.GCRA, 1, 0)},
		{"leaky_bucket 10/1s, max_delay 1s — excess delayed (orange line: the wait), not refused", limit(algo.LeakyBucket, 0, time.Second)},
	} {
		p := core.MustPolicy("plot", core.PolicyOptions{}, c.limit)
		panels = append(panels, panel{title: c.title, outcomes: replay(p, ts, nil)})
	}

	// Adaptive (the default controller): a sliding counter of 10/1s in
	// front of an upstream that handles 6 requests per second and fails
	// the rest; judged every 500 ms on the trace's clock.
	a, err := adaptive.NewJudged(adaptive.Options{Interval: 500 * time.Millisecond, MinSamples: 2, MinFactor: 0.2})
	if err != nil {
		log.Fatal(err)
	}
	p := core.MustPolicy("plot", core.PolicyOptions{Adaptive: a}, limit(algo.SlidingCounter, 0, 0))
	adaptive := panel{title: "adaptive sliding_counter 10/1s, upstream capacity 6/s — blue: the effective limit"}
	var served []time.Duration
	next := 500 * time.Millisecond
	adaptive.limits = append(adaptive.limits, point{0, p.Limits()[0].Count})
	judgeUntil := func(at time.Duration) {
		for at >= next {
			a.Judge()
			adaptive.limits = append(adaptive.limits, point{next, p.Limits()[0].Count})
			next += 500 * time.Millisecond
		}
	}
	adaptive.outcomes = replay(p, ts, func(at time.Duration, o outcome) {
		judgeUntil(at)
		if !o.allowed {
			a.Deny()
			return
		}
		a.Start()
		for len(served) > 0 && at-served[0] >= time.Second {
			served = served[1:]
		}
		status := 200
		if len(served) >= 6 {
			status = 503
		} else {
			served = append(served, at)
		}
		a.Observe(status, time.Millisecond)
	})
	judgeUntil(span)
	panels = append(panels, adaptive)

	if err := os.MkdirAll("docs", 0o755); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*outPath, []byte(render(panels, len(ts))), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("wrote %s: %d requests through %d algorithms\n", *outPath, len(ts), len(panels))
}

// Drawing geometry, in SVG units.
const (
	width   = 960
	left    = 20
	plotW   = width - 2*left
	panelH  = 96
	titleH  = 18
	rowGap  = 20
	headerH = 40
)

func x(t time.Duration) float64 { return left + float64(t)/float64(span)*plotW }

func render(panels []panel, n int) string {
	var b strings.Builder
	h := headerH + len(panels)*panelH + 30
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="14" font-weight="bold">The same %d requests through each algorithm, limit 10 per second</text>`+"\n", left, n)
	fmt.Fprintf(&b, `<text x="%d" y="34" fill="#444">rows: allowed (green), delayed (orange, line to its release), denied (red); x: seconds</text>`+"\n", left)
	for i, p := range panels {
		top := headerH + i*panelH
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", left, top+13, escape(p.title))
		rows := []float64{float64(top + titleH + 10), float64(top + titleH + 10 + rowGap), float64(top + titleH + 10 + 2*rowGap)}
		for s := time.Duration(0); s <= span; s += time.Second {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", x(s), rows[0]-8, x(s), rows[2]+8)
		}
		var allowed, delayed, denied int
		for _, o := range p.outcomes {
			switch {
			case !o.allowed:
				denied++
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#d62728" stroke-width="1.5"/>`+"\n", x(o.at), rows[2]-5, x(o.at), rows[2]+5)
			case o.delay > 0:
				delayed++
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ff7f0e" stroke-opacity="0.5"/>`+"\n", x(o.at), rows[1], x(o.at+o.delay), rows[1])
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.0f" r="2.5" fill="#ff7f0e"/>`+"\n", x(o.at+o.delay), rows[1])
			default:
				allowed++
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#2ca02c" stroke-width="1.5"/>`+"\n", x(o.at), rows[0]-5, x(o.at), rows[0]+5)
			}
		}
		if len(p.limits) > 0 {
			var pts []string
			for j, l := range p.limits {
				end := span
				if j+1 < len(p.limits) {
					end = p.limits[j+1].at
				}
				y := rows[2] + 8 - float64(l.count)/10*(rows[2]-rows[0]+16)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x(l.at), y, x(end), y))
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="#1f77b4" stroke-width="2"/>`+"\n", strings.Join(pts, " "))
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#444">allowed %d · delayed %d · denied %d</text>`+"\n", width-left, top+13, allowed, delayed, denied)
	}
	axis := headerH + len(panels)*panelH + 12
	for s := time.Duration(0); s <= span; s += time.Second {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%d</text>`+"\n", x(s), axis, int(s/time.Second))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
