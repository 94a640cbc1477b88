package reconciler

import (
	"fmt"
	"html/template"
	"strings"
	"time"
)

// Chart geometry, in SVG user units.
const (
	chartW     = 760
	chartPlotH = 90
	chartLeft  = 76
	chartRight = 12
	chartGap   = 34
)

// renderChart draws the last hour as an SVG, server-side (no script): on
// top the unfinished trips sampled every 15 s, below each settled trip's
// time from request to answer (a dot) with the p95 as a line. now is the
// right edge.
func renderChart(answers, unfinished []sample, now time.Time) template.HTML {
	var b strings.Builder
	h := 2*chartPlotH + chartGap + 44
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" id="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="unfinished trips and answer times over the last hour" font-family="system-ui,sans-serif" font-size="11">`,
		chartW, h, chartW, h)
	plotW := float64(chartW - chartLeft - chartRight)
	x := func(t time.Time) float64 {
		return chartLeft + plotW*(1-float64(now.Sub(t))/float64(chartWindow))
	}
	panel := func(top float64, title, unit string, maxV float64) func(v float64) float64 {
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`, chartLeft, top-6, template.HTMLEscapeString(title))
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="%.0f" height="%d" fill="#fafafa" stroke="#ccc"/>`, chartLeft, top, plotW, chartPlotH)
		for _, frac := range []float64{0, .5, 1} {
			y := top + chartPlotH*(1-frac)
			fmt.Fprintf(&b, `<line x1="%d" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#e3e3e3"/>`, chartLeft, chartLeft+plotW, y, y)
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s%s</text>`, chartLeft-4, y+4, trimNum(maxV*frac), unit)
		}
		return func(v float64) float64 { return top + chartPlotH*(1-min(v/maxV, 1)) }
	}

	// Unfinished trips.
	maxU := 1.0
	for _, s := range unfinished {
		maxU = max(maxU, s.v)
	}
	maxU = niceCeil(maxU)
	yU := panel(18, "unfinished trips", "", maxU)
	if len(unfinished) > 0 {
		var pts []string
		for _, s := range unfinished {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.at), yU(s.v)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#0b5cad" stroke-width="2" points="%s"/>`, strings.Join(pts, " "))
		for _, s := range unfinished {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="#0b5cad"/>`, x(s.at), yU(s.v))
		}
	} else {
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#777">no sample yet</text>`, chartLeft+8, 18+chartPlotH/2)
	}

	// Answer times, in ms.
	top := float64(18 + chartPlotH + chartGap)
	at := percentiles(answers)
	maxA := 10.0
	for _, s := range answers {
		maxA = max(maxA, s.v*1000)
	}
	maxA = niceCeil(min(maxA, max(float64(at.P99.Milliseconds())*1.5, 10)))
	yA := panel(top, fmt.Sprintf("time from request to final answer (%d trips; p50 %s, p95 %s, p99 %s)", at.N, at.P50, at.P95, at.P99), " ms", maxA)
	for _, s := range answers {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2" fill="#c75000" fill-opacity=".6"/>`, x(s.at), yA(s.v*1000))
	}
	if at.N > 0 {
		y := yA(float64(at.P95) / float64(time.Millisecond))
		fmt.Fprintf(&b, `<line x1="%d" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#c75000" stroke-dasharray="4 3"/><text x="%.0f" y="%.1f" text-anchor="end" fill="#c75000">p95</text>`,
			chartLeft, chartLeft+plotW, y, y, chartLeft+plotW-4, y-3)
	}

	// Time axis.
	base := top + chartPlotH
	for m := 60; m >= 0; m -= 10 {
		tx := x(now.Add(-time.Duration(m) * time.Minute))
		label := fmt.Sprintf("-%d min", m)
		if m == 0 {
			label = "now"
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`, tx, base+16, label)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built here from numbers and escaped text
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trimNum(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.1f", v)
}
