package report

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func sec(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

var chartIDs = []string{"faults", "throughput", "slot-lag", "duplicates", "leadership", "rss"}

func TestWrite(t *testing.T) {
	withFaults := &history.History{Seed: 7, Mode: "eo-polling", Start: t0, End: sec(30),
		Faults: []history.Fault{
			{Kind: "broker-stop", Target: "broker", Start: sec(3), End: sec(9), Detail: "<stop & restart>"},
			{Kind: "kill9", Target: "relay-1", Start: sec(5), End: sec(5)},
			{Kind: "cut-pg", Target: "relay-2", Start: sec(20)}, // never healed
		},
	}
	vanished := &history.History{Seed: 8, Mode: "eo-table", Start: t0, End: sec(5),
		Txns: []history.Txn{
			{ID: "a", Start: sec(1), End: sec(1.2), Outcome: history.Committed, Events: []history.Event{{ID: "e1"}}},
			{ID: "b", Start: sec(2), End: sec(2.2), Outcome: history.Outcome("vanished"), Events: []history.Event{{ID: "e2"}}},
		},
		Reads: []history.Read{{Consumer: "rc", EventID: "e1", Appended: sec(1.5)}},
	}
	tests := []struct {
		name      string
		h         *history.History
		marks     []Mark
		summary   string
		wantTitle string
		wantText  []string
	}{
		{
			name:      "a synthetic run with faults, a failover and duplicates",
			h:         synthetic(3*time.Minute, 100),
			marks:     []Mark{{At: sec(73), Label: "two leaders at once: relay-2, relay-3"}, {At: sec(100), Label: "event ev12 read twice by rc"}},
			summary:   "FAIL: 2 violations <see below>",
			wantTitle: "chaos run: alo-table, seed 42",
			wantText:  []string{"two leaders at once: relay-2, relay-3", "event ev12 read twice by rc", "FAIL: 2 violations &lt;see below&gt;", "relay-1 restarted after kill -9", "SIGSTOP 20s, lease 10s", "relay-3"},
		},
		{
			name:      "an empty run: no transactions, reads or samples",
			h:         &history.History{Seed: 1, Mode: "alo-table", Start: t0, End: sec(60)},
			wantTitle: "chaos run: alo-table, seed 1",
		},
		{
			name:      "a run with no End and nothing recorded",
			h:         &history.History{Seed: 2, Mode: "alo-table", Start: t0},
			wantTitle: "chaos run: alo-table, seed 2",
		},
		{
			name:      "faults only, one never healed, text that needs escaping",
			h:         withFaults,
			marks:     []Mark{{At: sec(6), Label: "lost <e9>"}},
			wantTitle: "chaos run: eo-polling, seed 7",
			wantText:  []string{"not healed", "instant", "6s", "&lt;stop &amp; restart&gt;", "lost &lt;e9&gt;"},
		},
		{
			name:      "an outcome this package does not know",
			h:         vanished,
			wantTitle: "chaos run: eo-table, seed 8",
			wantText:  []string{"1 other"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := Write(&b, tt.h, tt.marks, tt.summary); err != nil {
				t.Fatalf("Write: %v", err)
			}
			page := b.String()
			if !strings.Contains(page, "<title>"+tt.wantTitle+"</title>") {
				t.Errorf("the page's title is not %q", tt.wantTitle)
			}
			for _, id := range chartIDs {
				re := regexp.MustCompile(`(?s)<div class="panel" id="panel-` + id + `"[^>]*>\s*<svg .*?</svg>\s*</div>`)
				if !re.MatchString(page) {
					t.Errorf("no SVG chart %q in the page", id)
				}
			}
			if n := strings.Count(page, "<svg "); n != len(chartIDs) {
				t.Errorf("%d SVGs in the page, want %d", n, len(chartIDs))
			}
			if got := strings.Count(page, `<tr class="fault">`); got != len(tt.h.Faults) {
				t.Errorf("%d rows in the fault table, want %d", got, len(tt.h.Faults))
			}
			if got := strings.Count(page, `<tr class="mark">`); got != len(tt.marks) {
				t.Errorf("%d rows in the violations table, want %d", got, len(tt.marks))
			}
			if got := strings.Count(page, `<tr class="note">`); got != len(tt.h.Notes) {
				t.Errorf("%d rows in the notes table, want %d", got, len(tt.h.Notes))
			}
			for _, s := range tt.wantText {
				if !strings.Contains(page, s) {
					t.Errorf("the page does not say %q", s)
				}
			}
			// Self-contained: it must open offline from a CI artifact.
			// The SVGs name their XML namespaces by URL; those are names, not loads.
			bare := regexp.MustCompile(`xmlns(:xlink)?="http://www\.w3\.org/[^"]*"`).ReplaceAllString(page, "")
			for _, s := range []string{"<script", "http:", "https:", "<link", "<img", "url("} {
				if strings.Contains(bare, s) {
					t.Errorf("the page holds %q: it must not load anything", s)
				}
			}
		})
	}
}

func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.html")
	if err := WriteFile(path, synthetic(time.Minute, 20), nil, "ok"); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("<!DOCTYPE html>")) {
		t.Errorf("%s does not start as an HTML page: %.40q", path, b)
	}
	if err := WriteFile(filepath.Join(t.TempDir(), "missing", "report.html"), synthetic(time.Minute, 20), nil, ""); err == nil {
		t.Error("WriteFile into a missing directory did not fail")
	}
}

func TestPerSecond(t *testing.T) {
	ev := func(ids ...string) []history.Event {
		var es []history.Event
		for _, id := range ids {
			es = append(es, history.Event{ID: id})
		}
		return es
	}
	read := func(consumer, id string, at float64) history.Read {
		return history.Read{Consumer: consumer, EventID: id, Appended: sec(at)}
	}
	h := &history.History{Start: t0, End: sec(4),
		Txns: []history.Txn{
			{End: sec(0.2), Outcome: history.Committed, Events: ev("a", "b")},
			{End: sec(0.9), Outcome: history.Committed, Events: ev("c")},
			{End: sec(1.0), Outcome: history.RolledBack, Events: ev("x")}, // never written
			{End: sec(1.5), Outcome: history.InDoubt, Events: ev("y")},    // not known to be written
			{End: sec(2.5), Outcome: history.Outcome("vanished"), Events: ev("z")},
			{End: sec(2.999), Outcome: history.Committed, Events: ev("d")},
			{End: sec(-1), Outcome: history.Committed, Events: ev("before")}, // outside the run
			{End: sec(9), Outcome: history.Committed, Events: ev("after")},
		},
		Reads: []history.Read{
			read("rc", "a", 0.5), read("rc", "b", 1.0), read("rc", "c", 1.1),
			read("rc", "a", 2.2), // replayed: a duplicate, not a delivery
			read("rc", "b", 3.9),
			read("ru", "a", 0.6), read("ru", "a", 0.7), read("ru", "c", 3.0),
		},
	}
	s := perSecond(h, 4)
	tests := []struct {
		name      string
		got, want []float64
	}{
		{"written: committed events by the transaction's end", s.written, []float64{3, 0, 1, 0}},
		{"delivered to rc: first reads by Appended", s.delivered["rc"], []float64{1, 2, 0, 0}},
		{"delivered to ru", s.delivered["ru"], []float64{1, 0, 0, 1}},
		{"duplicates of rc, cumulative", s.dups["rc"], []float64{0, 0, 1, 2}},
		{"duplicates of ru, cumulative", s.dups["ru"], []float64{1, 1, 1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !slices.Equal(tt.got, tt.want) {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
	if !slices.Equal(s.consumers, []string{"rc", "ru"}) {
		t.Errorf("consumers %v, want [rc ru]", s.consumers)
	}
}

func TestMaxPerSecond(t *testing.T) {
	samples := []history.SlotSample{
		{At: sec(0.1), Slot: "s", LagBytes: 5}, {At: sec(0.9), Slot: "s", LagBytes: 9}, {At: sec(0.95), Slot: "s", LagBytes: 2},
		{At: sec(2.5), Slot: "s", LagBytes: 1}, // nothing in second 1: no point there, not a zero
		{At: sec(1.5), Slot: "t", LagBytes: 7},
	}
	got, names := maxPerSecond(t0, 3, len(samples), func(i int) (string, time.Time, float64, bool) {
		return samples[i].Slot, samples[i].At, float64(samples[i].LagBytes), true
	})
	if !slices.Equal(names, []string{"s", "t"}) {
		t.Errorf("names %v", names)
	}
	if want := []point{{0.5, 9}, {2.5, 1}}; !slices.Equal(got["s"], want) {
		t.Errorf("s: got %v, want %v", got["s"], want)
	}
	if want := []point{{1.5, 7}}; !slices.Equal(got["t"], want) {
		t.Errorf("t: got %v, want %v", got["t"], want)
	}
}

func TestLeadership(t *testing.T) {
	s := func(at float64, relay string, up, leader bool) history.RelaySample {
		return history.RelaySample{At: sec(at), Relay: relay, Up: up, Leader: leader}
	}
	h := &history.History{Start: t0, Relays: []history.RelaySample{
		s(0, "r1", true, true), s(0, "r2", true, false),
		s(1, "r1", true, true), s(1, "r2", true, false),
		s(2, "r1", false, false), s(2, "r2", true, true), // r1 killed, r2 takes over
		s(3, "r1", true, false), s(3, "r2", true, true),
		s(4, "r1", true, false), s(4, "r2", true, true),
	}}
	runs, names := leadership(h)
	if !slices.Equal(names, []string{"r1", "r2"}) {
		t.Fatalf("relays %v", names)
	}
	tests := []struct {
		relay string
		want  []stateRun
	}{
		{"r1", []stateRun{{0, 2, leading}, {2, 3, down}, {3, 4, follower}}},
		{"r2", []stateRun{{0, 2, follower}, {2, 4, leading}}},
	}
	for _, tt := range tests {
		if !slices.Equal(runs[tt.relay], tt.want) {
			t.Errorf("%s: got %v, want %v", tt.relay, runs[tt.relay], tt.want)
		}
	}
}

// TestWritePNG draws the charts as one PNG. With REPORT_SAMPLE_PNG set it also draws a 10-minute
// synthetic run there, to look at.
func TestWritePNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.png")
	h := synthetic(2*time.Minute, 50)
	marks := []Mark{{At: sec(50), Label: "x"}}
	if sample := os.Getenv("REPORT_SAMPLE_PNG"); sample != "" {
		path, h = sample, synthetic(10*time.Minute, 200)
		marks = []Mark{{At: sec(0.4*600 + 20.5), Label: "two leaders: relay-2 after its pause, relay-3"}}
	}
	var b bytes.Buffer
	if err := writePNG(&b, h, marks); err != nil {
		t.Fatalf("writePNG: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatalf("decode the PNG: %v", err)
	}
	if w := img.Bounds().Dx(); w < 1200 {
		t.Errorf("the PNG is %d px wide, want the page's width", w)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkWriteLongRun is a 30-minute run with about 2 million reads: it must draw in seconds.
func BenchmarkWriteLongRun(b *testing.B) {
	h := synthetic(30*time.Minute, 550)
	b.Logf("%d transactions, %d reads", len(h.Txns), len(h.Reads))
	b.ResetTimer()
	for b.Loop() {
		var out bytes.Buffer
		if err := Write(&out, h, nil, ""); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(out.Len()), "bytes/page")
	}
}
