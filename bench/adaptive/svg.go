package main

import (
	"fmt"
	"strings"
	"time"
)

// Drawing geometry, in px.
const (
	panelW  = 430
	panelH  = 120
	marginL = 40
	marginT = 58
	gapX    = 30
	gapY    = 34
	// smooth is the bucket the curves are averaged over.
	smooth = 250 * time.Millisecond
)

// series are the curves of one panel: name, colour, value per sample.
var series = []struct {
	name, colour string
	value        func(s sample) float64
}{
	{"capacity", "#7f7f7f", func(s sample) float64 { return s.capacity }},
	{"admitted", "#1f77b4", func(s sample) float64 { return float64(s.admitted) }},
	{"goodput", "#2ca02c", func(s sample) float64 { return float64(s.served) }},
	{"failing", "#d62728", func(s sample) float64 { return float64(s.failed) }},
}

// yMax is the top of every panel's y axis, requests/s.
func yMax() float64 { return 3.2 * capacity }

// render draws each outcome's first run: rows are scenario and limit,
// columns the controllers (gradient, then AIMD), as the table prints them.
func render(out []outcome) string {
	rows := len(out) / 2
	w := marginL + 2*panelW + gapX + 20
	h := marginT + rows*(panelH+gapY)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="14" font-weight="bold">Adaptive limits against model upstreams of capacity C = %.0f/s offered %.0fC (go run ./adaptive -svg, in bench/)</text>`+"\n", marginL, capacity, offeredTimes)
	x := marginL
	for _, s := range series {
		fmt.Fprintf(&b, `<line x1="%d" y1="32" x2="%d" y2="32" stroke="%s" stroke-width="2"/><text x="%d" y="36">%s/s</text>`+"\n", x, x+18, s.colour, x+22, s.name)
		x += 110
	}
	fmt.Fprintf(&b, `<text x="%d" y="50" fill="#444">left: gradient (default) · right: AIMD (latency target 2× unloaded) · y up to %.0f/s · x: seconds</text>`+"\n", marginL, yMax())
	for i, oc := range out {
		row, col := i/2, i%2
		left := marginL + col*(panelW+gapX)
		top := marginT + row*(panelH+gapY) + 14
		panel(&b, oc, left, top)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// panel draws one outcome's first run with its top-left corner at left, top.
func panel(b *strings.Builder, oc outcome, left, top int) {
	r := oc.runs[0]
	f := oc.figures[0]
	span := r.scenario.length
	px := func(t time.Duration) float64 { return float64(left) + float64(t)/float64(span)*panelW }
	py := func(v float64) float64 { return float64(top) + panelH - min(v, yMax())/yMax()*panelH }
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">%s · %s · %s</text>`+"\n", left, top-4, r.scenario.name, oc.limit, oc.options.Controller)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end" fill="#444">goodput %.2fC · failing %.1f%%</text>`+"\n", left+panelW, top-4, f.goodput, 100*f.failing)
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", left, top, panelW, panelH)
	for s := time.Duration(0); s <= span; s += 5 * time.Second {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/><text x="%.1f" y="%d" text-anchor="middle" fill="#666">%d</text>`+"\n",
			px(s), top, px(s), top+panelH, px(s), top+panelH+11, int(s/time.Second))
	}
	per := int(smooth / bucket)
	for _, s := range series {
		var pts []string
		for i := 0; i+per <= len(r.trace); i += per {
			var sum float64
			for _, smp := range r.trace[i : i+per] {
				sum += s.value(smp)
			}
			v := sum / float64(per)
			if s.name != "capacity" {
				v = sum / smooth.Seconds() // counts in the bucket → per second
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", px(time.Duration(i)*bucket), py(v), px(time.Duration(i+per)*bucket), py(v)))
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", strings.Join(pts, " "), s.colour)
	}
}
