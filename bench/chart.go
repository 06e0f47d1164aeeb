package main

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The sweep's chart: two panels side by side, p99 (x, log scale: the relay's tens of ms and
// Debezium's hundreds share it) against the broker's CPU per event (left) and the side's own CPU
// per event (right). A swept side is a line through its settings, each point labelled with its
// linger; a side at its own settings is one point. The default settings are ringed and labelled.

const (
	chartWidth  = 1000 * vg.Inch / 72
	chartHeight = 380 * vg.Inch / 72
)

var sideColours = map[string]color.NRGBA{
	sideRelay:       {31, 119, 180, 255},
	sideRelayEOS:    {214, 39, 40, 255},
	sideDbzTuned:    {44, 160, 44, 255},
	sideDbzEOS:      {148, 103, 189, 255},
	sidePoll:        {255, 127, 14, 255},
	sidePollStandby: {140, 86, 75, 255},
}

// writeSweepChart writes sweep.svg and sweep.png into dir and returns their paths.
func (r *Report) writeSweepChart(dir string) ([]string, error) {
	curves := r.curves()
	if len(curves) == 0 {
		return nil, errors.New("no steady-state results to draw")
	}
	broker, err := r.sweepPanel(curves, "broker CPU µs per event", func(c curvePoint) float64 { return c.broker.median })
	if err != nil {
		return nil, err
	}
	own, err := r.sweepPanel(curves, "side's own CPU µs per event", func(c curvePoint) float64 { return c.sideCPU.median })
	if err != nil {
		return nil, err
	}
	return writePlots(dir, "sweep", [][]*plot.Plot{{broker, own}}, chartWidth, chartHeight)
}

func writeFile(path string, w io.WriterTo) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if _, err := w.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("chart: write %s: %w", path, err)
	}
	return f.Close()
}

// sweepPanel is one panel: y of each curve point against its p99.
func (r *Report) sweepPanel(curves []curvePoint, yLabel string, y func(curvePoint) float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "p99 against " + yLabel + fmt.Sprintf(" (steady state, %d events/s; medians over the rounds)", r.Config.Rate)
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.X.Label.Text = "p99 latency, ms (log scale)"
	p.Y.Label.Text = yLabel
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = oneTwoFive{}
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Add(plotter.NewGrid())

	var sides []string
	bySide := map[string][]curvePoint{}
	for _, c := range curves {
		if c.rounds == 0 || c.p99.median <= 0 {
			continue // failed everywhere, or nothing to put on a log scale
		}
		if _, ok := bySide[c.side]; !ok {
			sides = append(sides, c.side)
		}
		bySide[c.side] = append(bySide[c.side], c)
	}
	var defaults plotter.XYs
	for _, side := range sides {
		cs := bySide[side]
		colour, ok := sideColours[side]
		if !ok {
			colour = color.NRGBA{127, 127, 127, 255}
		}
		xys := make(plotter.XYs, len(cs))
		labels := make([]string, len(cs))
		for i, c := range cs {
			xys[i] = plotter.XY{X: c.p99.median, Y: y(c)}
			if c.point != nil {
				labels[i] = fmtDuration(c.point.Linger)
				if side == sideRelayEOS {
					iv := c.point.Interval
					if iv == 0 {
						iv = r.relayDefaults().interval
					}
					labels[i] += "/" + fmtDuration(iv)
				}
			}
			if c.isDef && c.point != nil {
				defaults = append(defaults, xys[i])
				labels[i] += " (default)"
			}
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("sweep chart: %s: %w", side, err)
		}
		line.Color, points.Color = colour, colour
		points.Shape = draw.CircleGlyph{}
		points.Radius = vg.Points(3)
		if len(xys) > 1 {
			p.Add(line)
		}
		p.Add(points)
		p.Legend.Add(label(side), line, points)
		if strings.Join(labels, "") != "" {
			l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
			if err != nil {
				return nil, fmt.Errorf("sweep chart: %s labels: %w", side, err)
			}
			for i := range l.TextStyle {
				l.TextStyle[i].Font.Size = vg.Points(7)
				l.TextStyle[i].Color = colour
			}
			l.Offset = vg.Point{X: vg.Points(4), Y: vg.Points(3)}
			p.Add(l)
		}
	}
	// Room around the points for their labels, and above them for the legend.
	p.X.Min, p.X.Max = p.X.Min/1.5, p.X.Max*1.5
	p.Y.Max *= 1.35
	if len(defaults) > 0 {
		ring, err := plotter.NewScatter(defaults)
		if err != nil {
			return nil, fmt.Errorf("sweep chart: the defaults' marks: %w", err)
		}
		ring.Shape = draw.RingGlyph{}
		ring.Radius = vg.Points(7)
		ring.Color = color.Black
		p.Add(ring)
		p.Legend.Add("the relay's defaults", ring)
	}
	return p, nil
}

// oneTwoFive labels a log axis at 1, 2 and 5 of every decade (plot.LogTicks labels only the
// powers of ten, and 10-100 ms is where the relay's settings lie).
type oneTwoFive struct{}

func (oneTwoFive) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for decade := math.Pow(10, math.Floor(math.Log10(lo))); decade <= hi; decade *= 10 {
		for _, m := range []float64{1, 2, 3, 4, 5, 6, 7, 8, 9} {
			v := m * decade
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'f', -1, 64)
			}
			out = append(out, t)
		}
	}
	return out
}
