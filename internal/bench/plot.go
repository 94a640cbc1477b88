package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Chart file names written by [Report.Plot].
const (
	ChartLatency    = "latency-vs-offered.png"
	ChartThroughput = "throughput-over-run.png"
	ChartAnswer     = "answer-time-over-run.png"
)

// Plot writes three PNG charts into dir: answer time percentiles (ms)
// against offered rate (trips/s) of the open loops; trips answered per
// second over the run;
// and answer time (p50 and p99 per second, ms) over the run.
func (rep *Report) Plot(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: plot: %w", err)
	}
	var files []string
	save := func(p *plot.Plot, name string) error {
		path := filepath.Join(dir, name)
		if err := p.Save(8*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return fmt.Errorf("bench: plot %s: %w", name, err)
		}
		files = append(files, path)
		return nil
	}

	// Latency percentiles against offered rate.
	type point struct{ x, p50, p95, p99 float64 }
	var pts []point
	for _, r := range rep.OpenLoop {
		pts = append(pts, point{r.OfferedPerS, r.Answer.P50, r.Answer.P95, r.Answer.P99})
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].x < pts[j].x })
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Answer time against offered rate, open loops (closed-loop max: %.1f trips/s)", rep.TripsPerS)
	p.X.Label.Text = "offered trips/s"
	p.Y.Label.Text = "answer time, ms"
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	lines := []any{}
	for _, s := range []struct {
		name string
		get  func(point) float64
	}{{"p50", func(q point) float64 { return q.p50 }}, {"p95", func(q point) float64 { return q.p95 }}, {"p99", func(q point) float64 { return q.p99 }}} {
		xy := make(plotter.XYs, len(pts))
		for i, q := range pts {
			xy[i] = plotter.XY{X: q.x, Y: s.get(q)}
		}
		lines = append(lines, s.name, xy)
	}
	if len(pts) > 0 {
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return nil, fmt.Errorf("bench: plot: %w", err)
		}
	}
	if err := save(p, ChartLatency); err != nil {
		return nil, err
	}

	// Throughput and answer time over the run, per second.
	samples := slices.Clone(rep.samples)
	sort.Slice(samples, func(i, j int) bool { return samples[i].t < samples[j].t })
	end := 0
	if len(samples) > 0 {
		end = int(math.Ceil(samples[len(samples)-1].t)) + 1
	}
	perSec := make([][]float64, end)
	for _, s := range samples {
		if i := int(s.t); i >= 0 && i < end {
			perSec[i] = append(perSec[i], s.ms)
		}
	}
	tput := make(plotter.XYs, 0, end)
	var p50, p99 plotter.XYs
	for i, v := range perSec {
		tput = append(tput, plotter.XY{X: float64(i), Y: float64(len(v))})
		if len(v) == 0 {
			continue
		}
		slices.Sort(v)
		p50 = append(p50, plotter.XY{X: float64(i), Y: v[min(len(v)-1, len(v)/2)]})
		p99 = append(p99, plotter.XY{X: float64(i), Y: v[min(len(v)-1, int(0.99*float64(len(v))))]})
	}
	p = plot.New()
	p.Title.Text = "Trips answered per second over the run (closed loops, then open loops)"
	p.X.Label.Text = "seconds since the first trip"
	p.Y.Label.Text = "trips answered in that second"
	p.Add(plotter.NewGrid())
	if len(tput) > 0 {
		l, err := plotter.NewLine(tput)
		if err != nil {
			return nil, fmt.Errorf("bench: plot: %w", err)
		}
		l.Color = color.RGBA{R: 30, G: 90, B: 200, A: 255}
		p.Add(l)
	}
	if err := save(p, ChartThroughput); err != nil {
		return nil, err
	}
	p = plot.New()
	p.Title.Text = "Answer time over the run, per second"
	p.X.Label.Text = "seconds since the first trip"
	p.Y.Label.Text = "answer time, ms"
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	if len(p50) > 0 {
		if err := plotutil.AddLines(p, "p50", p50, "p99", p99); err != nil {
			return nil, fmt.Errorf("bench: plot: %w", err)
		}
	}
	if err := save(p, ChartAnswer); err != nil {
		return nil, err
	}
	return files, nil
}
