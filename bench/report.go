package main

import (
	"fmt"
	"strings"
	"time"
)

// Report is everything one run measured.
type Report struct {
	Config       Config
	LoadBefore   string // /proc/loadavg when the run started and ended: other work on the machine
	LoadAfter    string
	BacklogWrite time.Duration
	BacklogWAL   int64 // WAL bytes the table backlog wrote
	PayloadBytes int64
	AvgPayload   float64
	Drains       []Result
	Steady       []SteadyResult
	BigTx        *Result
	Profile      *Profile
	Messages     *MessagesResult // the table-free outbox, when measured
}

var sideLabels = map[string]string{
	sideCeiling:    "ceiling (pg_recvlogical)",
	sideRelay:      "outbox-relay",
	sideRelayEOS:   "outbox-relay, exactly-once",
	sideDbzDefault: "Debezium 3.6.1, defaults",
	sideDbzTuned:   "Debezium 3.6.1, tuned",
	sidePoll:       "outbox-relay, source poll",
	sideRecover:    "outbox-relay, lost-slot recovery from the table",
}

func label(side string) string {
	if l, ok := sideLabels[side]; ok {
		return l
	}
	return side
}

func (r *Report) drain(side string) *Result {
	for i := range r.Drains {
		if r.Drains[i].Side == side && r.Drains[i].Err == nil {
			return &r.Drains[i]
		}
	}
	return nil
}

func (r *Report) steady(side string) *SteadyResult {
	for i := range r.Steady {
		if r.Steady[i].Side == side && r.Steady[i].Err == nil {
			return &r.Steady[i]
		}
	}
	return nil
}

// Table renders the results as Markdown tables, ready for docs/benchmarks.md.
func (r *Report) Table() string {
	var b strings.Builder
	if r.LoadBefore != "" {
		fmt.Fprintf(&b, "Load average (1, 5, 15 min) at the start: %s; at the end: %s.\n", r.LoadBefore, r.LoadAfter)
	}
	if len(r.Config.RelayArgs) > 0 {
		fmt.Fprintf(&b, "Relay flags beyond the defaults: %s.\n", strings.Join(r.Config.RelayArgs, " "))
	}
	fmt.Fprintf(&b, "Backlog: %d events, %.0f-byte payloads on average (%.1f MB), %d aggregates of %d types, transactions of 1-%d events, %d partitions per topic; written in %s.\n\n",
		r.Config.Events, r.AvgPayload, float64(r.PayloadBytes)/1e6, 1000, len(aggregateTypes), maxTxEvents, r.Config.Partitions,
		r.BacklogWrite.Round(100*time.Millisecond))
	ceiling, relay := r.drain(sideCeiling), r.drain(sideRelay)
	b.WriteString("| side | events/s | MB/s | vs ceiling | vs outbox-relay | wall s | first record s | all on Kafka s | events/s after first record | CPU s | CPU µs/event | CPU µs/event after first record | peak RSS MB | walsender CPU s | broker CPU s | broker CPU µs/event |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, d := range r.Drains {
		if d.Err != nil {
			fmt.Fprintf(&b, "| %s | failed: %s |||||||||||||||\n", label(d.Side), oneLine(d.Err))
			continue
		}
		name := label(d.Side)
		if d.Partial {
			name += fmt.Sprintf(" (stopped after %.0f s with %d of %d events)", d.Wall.Seconds(), d.Events, d.Target)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.1f | %s | %s | %.2f | %s | %s | %s | %.2f | %.1f | %s | %.0f | %.2f | %.2f | %.1f |\n",
			name, d.rate(), float64(d.Bytes)/1e6/d.Wall.Seconds(), ratio(d, ceiling, "%.2f"), ratio(d, relay, "%.2f"),
			d.Wall.Seconds(), secondsOrDash(d.First), secondsOrDash(d.OnKafka), rateOrDash(d.streamRate()), d.CPU.Seconds(),
			float64(d.CPU.Microseconds())/float64(d.Events), microsOrDash(d.cpuPerEventAfterFirst()), mb(d.PeakRSS), d.SenderCPU.Seconds(), d.BrokerCPU.Seconds(),
			float64(d.BrokerCPU.Microseconds())/float64(max(d.Events, 1)))
	}
	if len(r.Steady) > 0 {
		fmt.Fprintf(&b, "\nSteady state: %d events/s for %s, latency from just before the writer sends the commit to the consumer receiving the record.\n\n",
			r.Config.Rate, r.Config.SteadyFor)
		b.WriteString("| side | events | achieved events/s | p50 ms | p95 ms | p99 ms | max ms | CPU s | CPU µs/event | CPU % of a core | peak RSS MB | broker CPU s | broker CPU µs/event |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range r.Steady {
			if s.Err != nil {
				fmt.Fprintf(&b, "| %s | failed: %s ||||||||||||\n", label(s.Side), oneLine(s.Err))
				continue
			}
			name := label(s.Side)
			if s.Rate < 0.95*float64(r.Config.Rate) {
				name += " (the writer fell behind: lower offered load)"
			}
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.0f | %.0f | %.2f | %.1f |\n",
				name, s.Written, s.Rate, msf(s.P50), msf(s.P95), msf(s.P99), msf(s.Max), s.CPU.Seconds(),
				float64(s.CPU.Microseconds())/float64(max(s.Written, 1)), 100*s.CPU.Seconds()/s.Window.Seconds(), mb(s.PeakRSS), s.BrokerCPU.Seconds(),
				float64(s.BrokerCPU.Microseconds())/float64(max(s.Written, 1)))
		}
	}
	if t := r.BigTx; t != nil {
		fmt.Fprintf(&b, "\nLarge transaction: one transaction of %d events.\n\n", t.Events)
		b.WriteString("| side | events/s | MB/s | wall s | first record s | CPU s | peak RSS MB | walsender CPU s | broker CPU s |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		if t.Err != nil {
			fmt.Fprintf(&b, "| outbox-relay | failed: %s ||||||||\n", oneLine(t.Err))
		} else {
			fmt.Fprintf(&b, "| outbox-relay | %.0f | %.1f | %.2f | %s | %.2f | %.0f | %.2f | %.2f |\n",
				t.rate(), float64(t.Bytes)/1e6/t.Wall.Seconds(), t.Wall.Seconds(), secondsOrDash(t.First), t.CPU.Seconds(), mb(t.PeakRSS), t.SenderCPU.Seconds(), t.BrokerCPU.Seconds())
		}
	}
	r.messagesTable(&b)
	if p := r.Profile; p != nil {
		if p.Err != nil {
			fmt.Fprintf(&b, "\nProfiled in-process relay: failed: %s\n", oneLine(p.Err))
		} else {
			fmt.Fprintf(&b, "\nProfiled in-process relay: %s\n", p.line())
		}
	}
	return b.String()
}

// Summary is the last line: the headline numbers for scripts. Values that were not measured are
// n/a.
func (r *Report) Summary() string {
	relay := r.drain(sideRelay)
	vsCeiling, vsDbz := "n/a", "n/a"
	if c := r.drain(sideCeiling); relay != nil && c != nil {
		vsCeiling = fmt.Sprintf("%.2f", relay.rate()/c.rate())
	}
	if d := r.drain(sideDbzTuned); relay != nil && d != nil {
		vsDbz = fmt.Sprintf("%.1f", relay.rate()/d.rate())
	}
	p99, rss, big := "n/a", "n/a", "n/a"
	if s := r.steady(sideRelay); s != nil {
		p99 = fmt.Sprintf("%.0f", msf(s.P99))
		rss = fmt.Sprintf("%.0f", mb(s.PeakRSS))
	}
	if r.BigTx != nil && r.BigTx.Err == nil {
		big = fmt.Sprintf("%.0f", mb(r.BigTx.PeakRSS))
	}
	eosVsRelay, eosP99 := "n/a", "n/a"
	if e := r.drain(sideRelayEOS); relay != nil && e != nil {
		eosVsRelay = fmt.Sprintf("%.2f", e.rate()/relay.rate())
	}
	if s := r.steady(sideRelayEOS); s != nil {
		eosP99 = fmt.Sprintf("%.0f", msf(s.P99))
	}
	return fmt.Sprintf("bench: relay_vs_ceiling=%s relay_vs_debezium=%s p99_ms=%s rss_mb=%s big_tx_rss_mb=%s exactly_once_vs_relay=%s exactly_once_p99_ms=%s %s",
		vsCeiling, vsDbz, p99, rss, big, eosVsRelay, eosP99, r.messagesSummary())
}

// Failed lists the measurements that failed.
func (r *Report) Failed() []string {
	var out []string
	for _, d := range r.Drains {
		if d.Err != nil {
			out = append(out, label(d.Side)+": "+d.Err.Error())
		}
	}
	for _, s := range r.Steady {
		if s.Err != nil {
			out = append(out, "steady "+label(s.Side)+": "+s.Err.Error())
		}
	}
	if r.BigTx != nil && r.BigTx.Err != nil {
		out = append(out, "large transaction: "+r.BigTx.Err.Error())
	}
	if r.Profile != nil && r.Profile.Err != nil {
		out = append(out, "profile: "+r.Profile.Err.Error())
	}
	return append(out, r.messagesFailed()...)
}

func ratio(d Result, base *Result, format string) string {
	if base == nil || base.rate() == 0 {
		return "-"
	}
	return fmt.Sprintf(format, d.rate()/base.rate())
}

func secondsOrDash(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", d.Seconds())
}

func rateOrDash(r float64) string {
	if r <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", r)
}

func microsOrDash(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(d)/1e3)
}

func msf(d time.Duration) float64 { return float64(d) / 1e6 }

func oneLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return strings.ReplaceAll(s, "|", "/")
}
