// Package report draws a chaos run (a history.History) as one self-contained HTML page: stacked
// charts on one time axis (faults as bands, events written and delivered, slot lag, duplicates,
// leadership, memory), then the checker's summary, the fault schedule, the harness's notes and the
// violations. The charts are drawn by gonum.org/v1/plot and inlined as SVG; the page has no script
// and loads nothing, so it opens from a CI artifact offline.
package report

import (
	"bytes"
	"fmt"
	"html/template"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// Mark is a violation to mark on the timeline: a red line at At on every chart, and a row of the
// violations table.
type Mark struct {
	At    time.Time
	Label string
}

// WriteFile writes the report of h to path; see Write.
func WriteFile(path string, h *history.History, marks []Mark, summary string) error {
	var b bytes.Buffer
	if err := Write(&b, h, marks, summary); err != nil {
		return err
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("report: write %s: %w", path, err)
	}
	return nil
}

// Write writes the report of h as one HTML page. summary is preformatted text (the checker's
// verdict) shown under the charts; marks are the violations to draw on them.
func Write(w io.Writer, h *history.History, marks []Mark, summary string) error {
	ps := panels(h, marks)
	left, right := margins(ps)
	pg := page{
		Title:   fmt.Sprintf("chaos run: %s, seed %d", h.Mode, h.Seed),
		Facts:   facts(h),
		Summary: summary,
	}
	for _, p := range ps {
		svg, err := renderSVG(p, left, right)
		if err != nil {
			return err
		}
		pg.Panels = append(pg.Panels, pagePanel{ID: p.id, Title: p.title, SVG: template.HTML(svg)})
	}
	pg.Faults = faultRows(h)
	for _, n := range h.Notes {
		pg.Notes = append(pg.Notes, row{At: seconds(offset(h, n.At)), Text: n.Text})
	}
	for _, m := range marks {
		pg.Marks = append(pg.Marks, row{At: seconds(offset(h, m.At)), Text: m.Label})
	}
	for _, s := range h.Stops {
		r := stopRow{Relay: s.Relay, At: seconds(offset(h, s.Signal)), Took: "did not exit", Code: s.Code}
		if !s.Exited.IsZero() {
			r.Took = s.Exited.Sub(s.Signal).Round(time.Millisecond).String()
		}
		pg.Stops = append(pg.Stops, r)
	}
	if err := pageTemplate.Execute(w, pg); err != nil {
		return fmt.Errorf("report: write the page: %w", err)
	}
	return nil
}

// offset is t in seconds since the run's start.
func offset(h *history.History, t time.Time) float64 { return t.Sub(h.Start).Seconds() }

func seconds(s float64) string { return fmt.Sprintf("%.1f s", s) }

// margins are the widest y-axis (left) and right padding of all panels. Drawing every panel with
// the same ones lines their data areas up, so a second is at the same x on every chart: without
// it, a panel with wide tick labels ("128 MiB") would be shifted against one with narrow ones.
func margins(ps []panel) (left, right vg.Length) {
	for _, p := range ps {
		full := draw.NewCanvas(vgimg.New(panelWidth, p.height), panelWidth, p.height)
		data := p.plot.DataCanvas(full)
		left = max(left, data.Min.X-full.Min.X)
		right = max(right, full.Max.X-data.Max.X)
	}
	return left, right
}

// panelGap is the space above a panel's title; edge keeps the y labels off the image's border.
const (
	panelGap = 8 * vg.Inch / 72
	edge     = 4 * vg.Inch / 72
)

// drawAligned draws p into c with the shared margins.
func drawAligned(p panel, c draw.Canvas, left, right vg.Length) {
	c = draw.Crop(c, edge, -edge, 0, -panelGap) // the title clear of the x axis of the panel above
	data := p.plot.DataCanvas(c)
	c = draw.Crop(c, left-(data.Min.X-c.Min.X), (c.Max.X-data.Max.X)-right, 0, 0)
	p.plot.Draw(c)
}

// renderSVG draws one panel as an <svg> element ready to inline (no XML prolog).
func renderSVG(p panel, left, right vg.Length) ([]byte, error) {
	c := vgsvg.New(panelWidth, p.height)
	drawAligned(p, draw.New(c), left, right)
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, fmt.Errorf("report: draw the %s panel: %w", p.id, err)
	}
	svg := b.Bytes()
	if i := bytes.Index(svg, []byte("<svg")); i >= 0 {
		svg = svg[i:]
	}
	return svg, nil
}

// writePNG draws all the panels stacked into one PNG: what the page shows, for eyes that cannot
// open HTML (a terminal's image viewer, a test's artifact).
func writePNG(w io.Writer, h *history.History, marks []Mark) error {
	ps := panels(h, marks)
	left, right := margins(ps)
	var total vg.Length
	for _, p := range ps {
		total += p.height
	}
	img := vgimg.New(panelWidth, total)
	dc := draw.New(img)
	top := total
	for _, p := range ps {
		c := draw.Crop(dc, 0, 0, top-p.height, top-total)
		drawAligned(p, c, left, right)
		top -= p.height
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("report: encode png: %w", err)
	}
	return nil
}

// faultRows is the schedule table, in the order the faults started, with each kind's colour.
func faultRows(h *history.History) []faultRow {
	fs := slices.Clone(h.Faults)
	slices.SortStableFunc(fs, func(a, b history.Fault) int { return a.Start.Compare(b.Start) })
	colour := map[string]string{}
	for i, k := range kindsOf(h) {
		c := palette[i%len(palette)]
		colour[k] = fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B)
	}
	rows := make([]faultRow, 0, len(fs))
	for _, f := range fs {
		r := faultRow{At: seconds(offset(h, f.Start)), Kind: f.Kind, Colour: template.CSS(colour[f.Kind]), Target: f.Target, Detail: f.Detail}
		switch {
		case f.Failed != "":
			r.Detail = strings.TrimPrefix(r.Detail+"; failed (counts for nothing): "+f.Failed, "; ")
		case f.Skipped != "":
			r.Detail = strings.TrimPrefix(r.Detail+"; skipped: "+f.Skipped, "; ")
		case f.Leader:
			r.Detail = strings.TrimPrefix(r.Detail+"; the target was leading", "; ")
		}
		switch {
		case f.End.IsZero():
			r.Duration = "not healed"
		case !f.End.After(f.Start):
			r.Duration = "instant"
		default:
			r.Duration = f.End.Sub(f.Start).Round(time.Millisecond).String()
		}
		rows = append(rows, r)
	}
	return rows
}

// kindsOf is the fault kinds in colour order: sorted, as newTimeline assigns them.
func kindsOf(h *history.History) []string {
	var ks []string
	for _, f := range h.Faults {
		if !slices.Contains(ks, f.Kind) {
			ks = append(ks, f.Kind)
		}
	}
	slices.Sort(ks)
	return ks
}

// facts is the line under the title: what ran, for how long, and how much.
func facts(h *history.History) string {
	var committed, rolledBack, inDoubt, other, events int
	for _, t := range h.Txns {
		switch t.Outcome {
		case history.Committed:
			committed++
			events += len(t.Events)
		case history.RolledBack:
			rolledBack++
		case history.InDoubt:
			inDoubt++
		default:
			other++ // an outcome newer than this package
		}
	}
	s := fmt.Sprintf("%s, delivery %s, started %s, ran %s; %d transactions committed (%d events), %d rolled back, %d in doubt",
		h.Mode, h.Settings.Delivery, h.Start.UTC().Format(time.RFC3339), h.End.Sub(h.Start).Round(time.Second),
		committed, events, rolledBack, inDoubt)
	if other > 0 {
		s += fmt.Sprintf(", %d other", other)
	}
	return s + fmt.Sprintf("; %d reads; %d faults", len(h.Reads), len(h.Faults))
}

type page struct {
	Title, Facts, Summary string
	Panels                []pagePanel
	Faults                []faultRow
	Notes, Marks          []row
	Stops                 []stopRow
}

type pagePanel struct {
	ID, Title string
	SVG       template.HTML // drawn by gonum from our own data; its text is XML-escaped there
}

type faultRow struct {
	At, Duration, Kind, Target, Detail string
	Colour                             template.CSS
}

type row struct{ At, Text string }

type stopRow struct {
	Relay, At, Took string
	Code            int
}

var pageTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Title}}</title>
<style>
body { font-family: sans-serif; max-width: 1360px; margin: 1em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; }
h2 { font-size: 1.1em; margin-top: 1.6em; }
.facts { color: #555; margin-top: 0; }
.panel svg { display: block; width: 100%; height: auto; }
/* gonum measured the text in Liberation Sans; Arial has the same metrics. */
.panel svg text { font-family: "Liberation Sans", Arial, Helvetica, sans-serif !important; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { text-align: left; padding: 0.15em 0.8em 0.15em 0; vertical-align: top; }
th { border-bottom: 1px solid #999; }
td.num { text-align: right; white-space: nowrap; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.4em; vertical-align: -0.1em; }
.marks td { color: #b00; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="facts">{{.Facts}}</p>
{{range .Panels}}<div class="panel" id="panel-{{.ID}}" title="{{.Title}}">
{{.SVG}}</div>
{{end}}
<h2>Summary</h2>
<pre>{{.Summary}}</pre>
<h2>Violations ({{len .Marks}})</h2>
{{if .Marks}}<table class="marks"><tr><th>at</th><th>violation</th></tr>
{{range .Marks}}<tr class="mark"><td class="num">{{.At}}</td><td>{{.Text}}</td></tr>
{{end}}</table>{{else}}<p>none</p>{{end}}
<h2>Fault schedule ({{len .Faults}})</h2>
{{if .Faults}}<table><tr><th>at</th><th>duration</th><th>kind</th><th>target</th><th>detail</th></tr>
{{range .Faults}}<tr class="fault"><td class="num">{{.At}}</td><td class="num">{{.Duration}}</td><td><span class="swatch" style="background: {{.Colour}}"></span>{{.Kind}}</td><td>{{.Target}}</td><td>{{.Detail}}</td></tr>
{{end}}</table>{{else}}<p>none</p>{{end}}
<h2>Notes ({{len .Notes}})</h2>
{{if .Notes}}<table><tr><th>at</th><th>note</th></tr>
{{range .Notes}}<tr class="note"><td class="num">{{.At}}</td><td>{{.Text}}</td></tr>
{{end}}</table>{{else}}<p>none</p>{{end}}
<h2>SIGTERMs ({{len .Stops}})</h2>
{{if .Stops}}<table><tr><th>at</th><th>relay</th><th>exited after</th><th>exit code</th></tr>
{{range .Stops}}<tr class="stop"><td class="num">{{.At}}</td><td>{{.Relay}}</td><td>{{.Took}}</td><td>{{.Code}}</td></tr>
{{end}}</table>{{else}}<p>none</p>{{end}}
</body>
</html>
`))
