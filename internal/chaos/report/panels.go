package report

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// Sizes in points. At 1,000 pt the panels are drawn 1,333 px wide at 96 dpi: a 1,400 px page
// shows them at their natural size.
const (
	panelWidth  = 1000 * vg.Inch / 72
	panelHeight = 190 * vg.Inch / 72
	laneHeight  = 18 * vg.Inch / 72 // one row of the fault and leadership panels
)

// palette is Tableau 20's saturated half, then its light half: ten kinds of fault get ten clearly
// different colours, and the full list (about twenty kinds) still gets one each.
var palette = []color.NRGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {148, 103, 189, 255},
	{140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}, {188, 189, 34, 255},
	{23, 190, 207, 255}, {214, 39, 40, 255},
	{174, 199, 232, 255}, {255, 187, 120, 255}, {152, 223, 138, 255}, {197, 176, 213, 255},
	{196, 156, 148, 255}, {247, 182, 210, 255}, {199, 199, 199, 255}, {219, 219, 141, 255},
	{158, 218, 229, 255}, {255, 152, 150, 255},
}

// lineColours are for the data lines (consumers, relays, slots): darker than the bands under them.
var lineColours = []color.NRGBA{
	{0, 0, 0, 255}, {31, 119, 180, 255}, {44, 160, 44, 255}, {148, 103, 189, 255},
	{255, 127, 14, 255}, {140, 86, 75, 255}, {23, 190, 207, 255}, {227, 119, 194, 255},
}

var violationColour = color.NRGBA{220, 0, 0, 255}

func withAlpha(c color.NRGBA, a uint8) color.NRGBA { c.A = a; return c }

// span of one fault in seconds since Start.
type faultSpan struct {
	from, to float64
	instant  bool // kill -9 and the like: drawn as a line, a band would be invisible
	kind     string
	colour   color.NRGBA
}

// overlay is everything drawn across every panel: the faults (under the data) or the violations
// (over it). It spans the whole height of the data area whatever the panel's y range.
type overlay struct {
	faults []faultSpan
	marks  []float64
}

func (o overlay) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	clampX := func(x vg.Length) vg.Length { return max(c.Min.X, min(c.Max.X, x)) }
	for _, f := range o.faults {
		if f.instant {
			x := trX(f.from)
			if c.ContainsX(x) {
				c.StrokeLine2(draw.LineStyle{Color: withAlpha(f.colour, 200), Width: vg.Points(1.2)}, x, c.Min.Y, x, c.Max.Y)
			}
			continue
		}
		x0, x1 := clampX(trX(f.from)), clampX(trX(f.to))
		if x1 <= x0 {
			continue
		}
		c.FillPolygon(withAlpha(f.colour, 56), []vg.Point{{X: x0, Y: c.Min.Y}, {X: x1, Y: c.Min.Y}, {X: x1, Y: c.Max.Y}, {X: x0, Y: c.Max.Y}})
	}
	for _, m := range o.marks {
		x := trX(m)
		if c.ContainsX(x) {
			c.StrokeLine2(draw.LineStyle{Color: violationColour, Width: vg.Points(1.5)}, x, c.Min.Y, x, c.Max.Y)
		}
	}
}

// lanes draws horizontal segments at integer y values: the fault lanes (one row per kind) and the
// leadership rows (one per relay).
type lanes struct{ segs []laneSeg }

type laneSeg struct {
	from, to, y float64
	style       draw.LineStyle
	tick        bool // an instantaneous fault: a short vertical tick at from
}

func (l lanes) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for _, s := range l.segs {
		y := trY(s.y)
		if s.tick {
			x := trX(s.from)
			if c.ContainsX(x) {
				h := laneHeight * 0.4
				c.StrokeLine2(s.style, x, y-h, x, y+h)
			}
			continue
		}
		x0, x1 := max(c.Min.X, trX(s.from)), min(c.Max.X, trX(s.to))
		if x1 <= x0 {
			continue
		}
		c.StrokeLine2(s.style, x0, y, x1, y)
	}
}

// panel is one chart of the page, with the name the HTML gives it.
type panel struct {
	id, title string
	plot      *plot.Plot
	height    vg.Length
}

// timeline is the shared layout of the panels: one x axis, faults under the data, violations over it.
type timeline struct {
	seconds float64
	under   overlay
	over    overlay
	kinds   []string // fault kinds, in colour order
}

func newTimeline(h *history.History, marks []Mark, seconds float64) *timeline {
	tl := &timeline{seconds: seconds}
	colour := map[string]color.NRGBA{}
	for _, f := range h.Faults {
		if _, ok := colour[f.Kind]; !ok {
			tl.kinds = append(tl.kinds, f.Kind)
			colour[f.Kind] = palette[0]
		}
	}
	slices.Sort(tl.kinds) // a kind keeps its colour between runs of different seeds
	for i, k := range tl.kinds {
		colour[k] = palette[i%len(palette)]
	}
	for _, f := range h.Faults {
		from, to := offset(h, f.Start), offset(h, f.End)
		if f.End.IsZero() {
			to = seconds // never healed before the run ended
		}
		tl.under.faults = append(tl.under.faults, faultSpan{
			from: from, to: to, instant: !f.End.IsZero() && !f.End.After(f.Start),
			kind: f.Kind, colour: colour[f.Kind],
		})
	}
	for _, m := range marks {
		tl.over.marks = append(tl.over.marks, offset(h, m.At))
	}
	return tl
}

// newPlot is a panel's plot with the shared x axis and the overlays; data goes between them.
func (tl *timeline) newPlot(title, ylabel string, data ...plot.Plotter) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.Y.Label.Text = ylabel
	p.X.Label.Text = "seconds since start"
	p.Add(plotter.NewGrid())
	p.Add(tl.under)
	p.Add(data...)
	p.Add(tl.over)
	// Fixed after Add, which widens the axes to the data: every panel covers the same seconds.
	p.X.Min, p.X.Max = 0, tl.seconds
	p.X.Tick.Marker = secondTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	// Sans for every text of the plot: set here rather than through plot.DefaultFont, a package
	// variable other users of gonum in the process would see change.
	for _, f := range []*font.Font{&p.Title.TextStyle.Font, &p.X.Label.TextStyle.Font, &p.Y.Label.TextStyle.Font,
		&p.X.Tick.Label.Font, &p.Y.Tick.Label.Font, &p.Legend.TextStyle.Font} {
		f.Variant = "Sans"
	}
	return p
}

// secondTicks labels the time axis every 10, 30, 60, ... seconds, whichever gives at most about
// twenty labels: plot.DefaultTicks labels a 10-minute run at 0, 300 and 600 only, too few to
// find a fault's second by.
type secondTicks struct{}

func (secondTicks) Ticks(lo, hi float64) []plot.Tick {
	steps := []float64{1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200}
	step := steps[len(steps)-1]
	for _, s := range steps {
		if (hi-lo)/s <= 20 {
			step = s
			break
		}
	}
	minor := step / 5
	if step >= 60 && int(step)%60 == 0 {
		minor = step / 4
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/minor) * minor; v <= hi; v += minor {
		t := plot.Tick{Value: v}
		if math.Abs(math.Remainder(v, step)) < minor/100 {
			t.Label = fmt.Sprintf("%.0f", v)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

func line(pts []point, colour color.Color, width float64) *plotter.Line {
	xys := make(plotter.XYs, len(pts))
	for i, p := range pts {
		xys[i].X, xys[i].Y = p.x, p.y
	}
	l := &plotter.Line{XYs: xys, LineStyle: plotter.DefaultLineStyle}
	l.LineStyle.Color = colour
	l.LineStyle.Width = vg.Points(width)
	return l
}

func binPoints(v []float64) []point {
	pts := make([]point, len(v))
	for i, y := range v {
		pts[i] = point{float64(i) + 0.5, y}
	}
	return pts
}

// yFrom0 starts a count's axis at zero, gives an empty panel a visible range, and leaves room at
// the top for the legend, which gonum draws inside the data area over whatever is there.
func yFrom0(p *plot.Plot, entries int) {
	const dataHeight = panelHeight - 45*vg.Inch/72 // the panel less its title and x axis
	legend := vg.Length(entries)*p.Legend.TextStyle.Font.Size*1.25 + vg.Points(8)
	p.Y.Min = 0
	p.Y.Max = max(p.Y.Max, 1) / (1 - float64(legend/dataHeight))
	p.Y.Tick.Marker = countTicks{}
}

// countTicks are plot.DefaultTicks without the trailing zeros it gives some ranges ("2500.00").
type countTicks struct{}

func (countTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			// Rounded first: a tick computed as 6 x 0.2 is 1.2000000000000002.
			ticks[i].Label = strconv.FormatFloat(math.Round(ticks[i].Value*1e6)/1e6, 'f', -1, 64)
		}
	}
	return ticks
}

// panels builds the charts of the page, top to bottom.
func panels(h *history.History, marks []Mark) []panel {
	seconds := span(h)
	bins := int(math.Ceil(seconds))
	tl := newTimeline(h, marks, seconds)
	s := perSecond(h, bins)
	ps := []panel{
		tl.faultPanel(),
		tl.throughputPanel(s),
		tl.lagPanel(h, bins),
		tl.duplicatesPanel(s),
		tl.leadershipPanel(h),
		tl.rssPanel(h, bins),
	}
	// The axis is the same on every panel: say what it is once, under the last.
	for _, p := range ps[:len(ps)-1] {
		p.plot.X.Label.Text = ""
	}
	return ps
}

// faultPanel is the schedule itself, one row per kind: the legend of the bands' colours below it.
func (tl *timeline) faultPanel() panel {
	var ls lanes
	row := map[string]float64{}
	for i, k := range tl.kinds {
		row[k] = float64(len(tl.kinds) - 1 - i) // the first kind on top
	}
	for _, f := range tl.under.faults {
		s := laneSeg{from: f.from, to: f.to, y: row[f.kind], tick: f.instant,
			style: draw.LineStyle{Color: f.colour, Width: laneHeight * 0.6}}
		if f.instant {
			s.style.Width = vg.Points(3)
		}
		ls.segs = append(ls.segs, s)
	}
	p := tl.newPlot("Faults", "", ls)
	rows := len(tl.kinds)
	if rows > 0 {
		p.NominalY(reversed(tl.kinds)...)
	} else {
		p.HideY()
	}
	p.Y.Min, p.Y.Max = -0.7, math.Max(float64(rows)-0.3, 0.3)
	return panel{id: "faults", title: "Faults", plot: p, height: 70 + laneHeight*vg.Length(max(rows, 1))}
}

// named is a line and its legend entry.
type named struct {
	name string
	line *plotter.Line
}

// linePlot is a panel of lines over the shared timeline, with a legend of the lines.
func (tl *timeline) linePlot(title, ylabel string, lines []named, extra ...plot.Plotter) *plot.Plot {
	data := make([]plot.Plotter, 0, len(lines)+len(extra))
	for _, l := range lines {
		data = append(data, l.line)
	}
	data = append(data, extra...)
	p := tl.newPlot(title, ylabel, data...)
	for _, l := range lines {
		p.Legend.Add(l.name, l.line)
	}
	return p
}

func (tl *timeline) throughputPanel(s *series) panel {
	lines := []named{{"written", line(binPoints(s.written), color.Black, 1.4)}}
	for i, c := range s.consumers {
		l := line(binPoints(s.delivered[c]), lineColours[(i+1)%len(lineColours)], 1)
		l.LineStyle.Dashes = dashes(i)
		lines = append(lines, named{"delivered to " + c, l})
	}
	p := tl.linePlot("Events per second: written (committed transactions) and delivered (first reads)", "events/s", lines)
	yFrom0(p, len(lines))
	return panel{id: "throughput", title: "Events per second", plot: p, height: panelHeight}
}

// dashes tells lines apart where colours alone would not (consumers drawn on top of each other
// when both see every event).
func dashes(i int) []vg.Length {
	if i%2 == 0 {
		return nil
	}
	return []vg.Length{vg.Points(5), vg.Points(2)}
}

func (tl *timeline) lagPanel(h *history.History, bins int) panel {
	lag, slots := maxPerSecond(h.Start, bins, len(h.Slots), func(i int) (string, time.Time, float64, bool) {
		s := &h.Slots[i]
		return s.Slot, s.At, float64(s.LagBytes), true
	})
	var lines []named
	for i, slot := range slots {
		lines = append(lines, named{"slot " + slot, line(lag[slot], lineColours[i%len(lineColours)], 1.2)})
	}
	p := tl.linePlot("Slot lag (largest per second)", "bytes behind WAL end", lines)
	yFrom0(p, len(lines))
	p.Y.Tick.Marker = bytesTicks{}
	return panel{id: "slot-lag", title: "Slot lag", plot: p, height: panelHeight}
}

func (tl *timeline) duplicatesPanel(s *series) panel {
	var lines []named
	for i, c := range s.consumers {
		l := line(binPoints(s.dups[c]), lineColours[(i+1)%len(lineColours)], 1.4)
		l.LineStyle.Dashes = dashes(i)
		lines = append(lines, named{c, l})
	}
	p := tl.linePlot("Duplicate reads so far, per consumer", "duplicates", lines)
	yFrom0(p, len(lines))
	return panel{id: "duplicates", title: "Duplicates", plot: p, height: panelHeight}
}

var (
	leaderStyle   = draw.LineStyle{Color: color.NRGBA{31, 119, 180, 255}, Width: laneHeight * 0.55}
	followerStyle = draw.LineStyle{Color: color.NRGBA{160, 160, 160, 255}, Width: vg.Points(1.5)}
)

// leadershipPanel has one row per relay: thick where it said it led, thin grey where it answered
// as a follower, nothing where it did not answer. A failover is the thick segment changing rows;
// two thick segments at one x are two leaders.
func (tl *timeline) leadershipPanel(h *history.History) panel {
	runs, relays := leadership(h)
	var ls lanes
	for i, r := range relays {
		y := float64(len(relays) - 1 - i) // the first relay on top
		for _, run := range runs[r] {
			switch run.state {
			case leading:
				ls.segs = append(ls.segs, laneSeg{from: run.from, to: run.to, y: y, style: leaderStyle})
			case follower:
				ls.segs = append(ls.segs, laneSeg{from: run.from, to: run.to, y: y, style: followerStyle})
			}
		}
	}
	p := tl.newPlot("Leadership (thick: leader, thin: up, none: down)", "", ls)
	if len(relays) > 0 {
		p.NominalY(reversed(relays)...)
	} else {
		p.HideY()
	}
	p.Y.Min, p.Y.Max = -0.7, math.Max(float64(len(relays))-0.3, 0.3)
	return panel{id: "leadership", title: "Leadership", plot: p, height: 70 + 1.6*laneHeight*vg.Length(max(len(relays), 1))}
}

func (tl *timeline) rssPanel(h *history.History, bins int) panel {
	const mib = 1 << 20
	rss, relays := maxPerSecond(h.Start, bins, len(h.Relays), func(i int) (string, time.Time, float64, bool) {
		s := &h.Relays[i]
		return s.Relay, s.At, float64(s.RSS) / mib, s.RSS > 0 // 0: not read, not "no memory"
	})
	var lines []named
	for i, r := range relays {
		lines = append(lines, named{r, line(rss[r], lineColours[(i+1)%len(lineColours)], 1.2)})
	}
	var extra []plot.Plotter
	var bound *plotter.Line
	if b := h.Settings.RSSBound; b > 0 {
		bound = line([]point{{0, float64(b) / mib}, {tl.seconds, float64(b) / mib}}, violationColour, 1)
		bound.LineStyle.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		extra = append(extra, bound)
	}
	p := tl.linePlot("Resident memory per relay (largest per second)", "RSS (MiB)", lines, extra...)
	if bound != nil {
		p.Legend.Add(fmt.Sprintf("bound %.0f MiB", float64(h.Settings.RSSBound)/mib), bound)
	}
	yFrom0(p, len(extra)+len(lines))
	return panel{id: "rss", title: "RSS", plot: p, height: panelHeight}
}

func reversed(s []string) []string {
	r := slices.Clone(s)
	slices.Reverse(r)
	return r
}

// bytesTicks labels a byte axis in the one unit (B, KiB, MiB, GiB) that suits its top, at round
// numbers of that unit: 3.2e+07 is not how anyone reads lag, nor is "977 KiB".
type bytesTicks struct{}

func (bytesTicks) Ticks(lo, hi float64) []plot.Tick {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	u, scale := 0, 1.0
	for hi/scale >= 1024 && u < len(units)-1 {
		scale *= 1024
		u++
	}
	ticks := plot.DefaultTicks{}.Ticks(lo/scale, hi/scale)
	for i := range ticks {
		ticks[i].Value *= scale
		if ticks[i].Label != "" {
			ticks[i].Label += " " + units[u]
		}
	}
	return ticks
}
