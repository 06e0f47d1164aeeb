package main

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The charts a run draws into Config.ChartDir, under stable names so docs/benchmarks.md can embed
// them (make bench-docs writes them to docs/bench): drains.{svg,png}, the drain rate per side;
// latency.{svg,png}, the steady state's latency distribution per side; sweep.{svg,png}, the
// sweep's curves (chart.go), when a sweep ran.

// latencyCurve are the percentiles SteadyResult.Curve holds and the latency chart draws.
var latencyCurve = []float64{50, 75, 90, 95, 98, 99, 99.5, 99.8, 99.9}

// writeCharts draws every chart the report has data for into dir and returns their paths; a chart
// that fails does not keep the others from being drawn.
func (r *Report) writeCharts(dir string) ([]string, error) {
	var paths []string
	var errs []error
	add := func(p []string, err error) {
		paths = append(paths, p...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if d, err := r.drainPlot(); err != nil {
		errs = append(errs, err)
	} else if d != nil {
		add(writePlots(dir, "drains", [][]*plot.Plot{{d}}, 900*vg.Inch/72, vg.Length(120+28*r.drainBars())*vg.Inch/72))
	}
	if l, err := r.latencyPlot(); err != nil {
		errs = append(errs, err)
	} else if l != nil {
		add(writePlots(dir, "latency", [][]*plot.Plot{{l}}, 800*vg.Inch/72, 420*vg.Inch/72))
	}
	if len(r.Config.Sweep) > 0 {
		add(r.writeSweepChart(dir))
	}
	return paths, errors.Join(errs...)
}

// writePlots draws plots (rows of columns) into <dir>/<name>.svg and .png.
func writePlots(dir, name string, plots [][]*plot.Plot, w, h vg.Length) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%s chart: %w", name, err)
	}
	var paths []string
	for _, f := range []struct {
		ext    string
		canvas interface {
			vg.CanvasSizer
			io.WriterTo
		}
	}{
		{".svg", vgsvg.New(w, h)},
		{".png", vgimg.PngCanvas{Canvas: vgimg.New(w, h)}},
	} {
		tiles := draw.Tiles{Rows: len(plots), Cols: len(plots[0]), PadX: vg.Points(24), PadY: vg.Points(12),
			PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(12)}
		cs := plot.Align(plots, tiles, draw.New(f.canvas))
		for i, row := range plots {
			for j, p := range row {
				p.Draw(cs[i][j])
			}
		}
		path := filepath.Join(dir, name+f.ext)
		if err := writeFile(path, f.canvas); err != nil {
			return paths, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// drainBar is one bar of the drain chart: a side's median drain rate over its rounds.
type drainBar struct {
	side     string
	label    string
	rate     spread
	partial  bool
	messages bool
}

// drainBarsOf returns the drains' bars in the order the sides ran, the message mode's last.
func (r *Report) drainBarsOf() []drainBar {
	var out []drainBar
	add := func(ds drains, messages bool) {
		var sides []string
		for _, d := range ds {
			if !slices.Contains(sides, d.Side) {
				sides = append(sides, d.Side)
			}
		}
		for _, side := range sides {
			var rates []float64
			partial := false
			for _, d := range ds {
				if d.Side == side && d.Err == nil && d.rate() > 0 {
					rates = append(rates, d.rate())
					partial = partial || d.Partial
				}
			}
			sp, ok := spreadOf(rates)
			if !ok {
				continue
			}
			out = append(out, drainBar{side: side, label: label(side), rate: sp, partial: partial, messages: messages})
		}
	}
	add(r.Drains, false)
	if r.Messages != nil {
		add(r.Messages.Drains, true)
	}
	return out
}

func (r *Report) drainBars() int { return len(r.drainBarsOf()) }

// drainPlot is the drain rate per side, horizontal bars (the sides' names are long) with the
// rounds' range as a line through each bar's end; nil when nothing drained.
func (r *Report) drainPlot() (*plot.Plot, error) {
	bars := r.drainBarsOf()
	if len(bars) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Drain of a backlog of %d events: events/s per side (median over the rounds, the line: their range)", r.Config.Events)
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.X.Label.Text = "events/s"
	p.X.Min = 0
	p.X.Tick.Marker = wholeTicks{}
	p.Add(plotter.NewGrid())
	names := make([]string, len(bars))
	var labels plotter.XYLabels
	top := 0.0
	for i, bar := range bars {
		y := float64(len(bars) - 1 - i) // the first side on top
		names[len(bars)-1-i] = bar.label
		b, err := plotter.NewBarChart(plotter.Values{bar.rate.median}, vg.Points(16))
		if err != nil {
			return nil, fmt.Errorf("drain chart: %s: %w", bar.side, err)
		}
		b.Horizontal, b.XMin = true, y
		b.Color = barColour(bar.side)
		b.LineStyle.Width = 0
		p.Add(b)
		if bar.rate.n > 1 {
			rng, err := plotter.NewLine(plotter.XYs{{X: bar.rate.min, Y: y}, {X: bar.rate.max, Y: y}})
			if err != nil {
				return nil, fmt.Errorf("drain chart: %s range: %w", bar.side, err)
			}
			rng.Width, rng.Color = vg.Points(1.5), color.Black
			p.Add(rng)
		}
		text := fmt.Sprintf("%.0f/s", bar.rate.median)
		if bar.partial {
			text += " (stopped before the end)"
		}
		labels.XYs = append(labels.XYs, plotter.XY{X: max(bar.rate.median, bar.rate.max), Y: y})
		labels.Labels = append(labels.Labels, text)
		top = max(top, bar.rate.max)
	}
	l, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, fmt.Errorf("drain chart labels: %w", err)
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(8)
		l.TextStyle[i].YAlign = draw.YCenter
	}
	l.Offset = vg.Point{X: vg.Points(4)}
	p.Add(l)
	p.NominalY(names...)
	p.X.Max = top * 1.25 // room for the labels
	return p, nil
}

// wholeTicks are plot.DefaultTicks labelled as whole numbers (25000, not 25000.00).
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', -1, 64)
		}
	}
	return ts
}

// barColour is side's colour in the charts; the sides without one of their own are grey, the
// message mode's a lighter shade of its table counterpart's.
func barColour(side string) color.NRGBA {
	switch side {
	case sideMsgRelay:
		return color.NRGBA{120, 170, 210, 255}
	case sideMsgCeiling, sideCeiling:
		return color.NRGBA{150, 150, 150, 255}
	}
	if c, ok := sideColours[side]; ok {
		return c
	}
	return color.NRGBA{110, 110, 110, 255}
}

// latencyLine is a steady side's latency at each percentile of latencyCurve: the median over its
// rounds at the default settings, ms.
type latencyLine struct {
	side string
	ms   []float64
}

func (r *Report) latencyLines() []latencyLine {
	var sides []string
	for _, s := range r.Steady {
		if s.Err == nil && len(s.Curve) == len(latencyCurve) && r.atDefault(&s) && !slices.Contains(sides, s.Side) {
			sides = append(sides, s.Side)
		}
	}
	var out []latencyLine
	for _, side := range sides {
		line := latencyLine{side: side, ms: make([]float64, len(latencyCurve))}
		for i := range latencyCurve {
			var v []float64
			for _, s := range r.Steady {
				if s.Side == side && s.Err == nil && len(s.Curve) == len(latencyCurve) && r.atDefault(&s) {
					v = append(v, msf(s.Curve[i]))
				}
			}
			sp, _ := spreadOf(v)
			line.ms[i] = sp.median
		}
		out = append(out, line)
	}
	return out
}

// latencyPlot is the steady state's latency distribution per side at its default settings:
// latency (log scale) against the percentile, on a scale where each nine is one step (p90, p99,
// p99.9); nil when no steady state ran.
func (r *Report) latencyPlot() (*plot.Plot, error) {
	lines := r.latencyLines()
	if len(lines) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Steady state, %d events/s: commit-to-consumer latency by percentile (default settings, medians over the rounds)", r.Config.Rate)
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "latency, ms (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = oneTwoFive{}
	p.X.Tick.Marker = percentileTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Add(plotter.NewGrid())
	for _, line := range lines {
		xys := make(plotter.XYs, 0, len(latencyCurve))
		for i, pc := range latencyCurve {
			if line.ms[i] > 0 { // nothing to put on a log scale
				xys = append(xys, plotter.XY{X: nines(pc), Y: line.ms[i]})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("latency chart: %s: %w", line.side, err)
		}
		c := barColour(line.side)
		l.Color, pts.Color = c, c
		l.Width = vg.Points(1.5)
		pts.Shape, pts.Radius = draw.CircleGlyph{}, vg.Points(2.5)
		p.Add(l, pts)
		p.Legend.Add(label(line.side), l, pts)
	}
	p.X.Min, p.X.Max = nines(latencyCurve[0])-0.1, nines(latencyCurve[len(latencyCurve)-1])+0.1
	p.Y.Min, p.Y.Max = p.Y.Min/1.3, p.Y.Max*2 // room above the curves for the legend
	return p, nil
}

// nines maps a percentile to its number of nines: p90 is 1, p99 2, p99.9 3.
func nines(percentile float64) float64 { return -math.Log10(1 - percentile/100) }

// percentileTicks labels the latency chart's x axis at latencyCurve's percentiles.
type percentileTicks struct{}

func (percentileTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, pc := range latencyCurve {
		if x := nines(pc); x >= lo && x <= hi {
			out = append(out, plot.Tick{Value: x, Label: "p" + strconv.FormatFloat(pc, 'f', -1, 64)})
		}
	}
	return out
}
