package report

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// outage is a stretch during which nothing reached the consumers; when it ends the backlog drains
// and, after a replay, the last events before it are delivered a second time.
type outage struct {
	from, to float64
	replay   float64 // seconds before from whose events are delivered again
}

// synthetic is a made-up run that looks like a real one: three relays, a failover of leadership
// after a kill -9, a pause past the lease (a short zombie), faults of six kinds, duplicates after
// the faults that replay, and a SIGTERM.
func synthetic(d time.Duration, eventsPerSecond int) *history.History {
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	total := d.Seconds()
	frac := func(f float64) float64 { return f * total } // faults placed as fractions of the run
	h := &history.History{
		Seed: 42, Mode: "alo-table", Start: t0, End: at(total),
		Settings: history.Settings{Delivery: history.AtLeastOnce, RSSBound: 256 << 20, Lease: 10 * time.Second},
	}
	kill, pause, broker, cut, failover, load := frac(0.2), frac(0.4), frac(0.55), frac(0.67), frac(0.8), frac(0.87)
	h.Faults = []history.Fault{
		{Kind: "kill9", Target: "relay-1", Start: at(kill), End: at(kill), Detail: "leader"},
		{Kind: "pause", Target: "relay-2", Start: at(pause), End: at(pause + 20), Detail: "SIGSTOP 20s, lease 10s"},
		{Kind: "broker-stop", Target: "broker", Start: at(broker), End: at(broker + 30)},
		{Kind: "cut-pg", Target: "relay-3", Start: at(cut), End: at(cut + 25), Detail: "netproxy relay-3 -> postgres"},
		{Kind: "failover", Target: "postgres", Start: at(failover), End: at(failover + 15), Detail: "synchronized_standby_slots set"},
		{Kind: "load", Target: "postgres", Start: at(load), End: at(load + 40), Detail: "other tables, 500 tx/s"},
		{Kind: "kill9", Target: "relay-1", Start: at(frac(0.95)), End: at(frac(0.95)), Detail: "standby"},
	}
	outages := []outage{
		{kill, kill + 5, 2}, {pause, pause + 10, 1.5}, {broker, broker + 30, 3}, {cut, cut + 25, 2}, {failover, failover + 12, 2},
	}
	// Writes: a transaction every 1/10 s with eventsPerSecond/10 events; some roll back.
	seq := map[string]int{}
	var id int
	for s := 0.0; s < total-1; s += 0.1 {
		tx := history.Txn{ID: fmt.Sprint("tx", id), Writer: "w1", Start: at(s), End: at(s + 0.005), Outcome: history.Committed}
		if rng.IntN(20) == 0 {
			tx.Outcome = history.RolledBack
		}
		n := eventsPerSecond / 10
		if s > load && s < load+40 {
			n = n * 3 / 2
		}
		for range n {
			key := fmt.Sprint("agg", rng.IntN(50))
			seq[key]++
			id++
			tx.Events = append(tx.Events, history.Event{ID: fmt.Sprint("ev", id), Topic: "orders", Key: key, Seq: seq[key]})
		}
		h.Txns = append(h.Txns, tx)
	}
	// Deliveries: 50 ms after commit, or after the outage it fell into, draining at 4x the write
	// rate; events just before an outage that replays are read twice.
	deliver := func(commit float64) (first float64, again float64) {
		first, again = commit+0.05+rng.Float64()*0.05, -1
		for _, o := range outages {
			if commit >= o.from && commit < o.to {
				first = o.to + (commit-o.from)/4 + rng.Float64()*0.1
			}
			if commit >= o.from-o.replay && commit < o.from {
				again = o.to + rng.Float64()*0.5
			}
		}
		return first, again
	}
	for _, consumer := range []string{"rc", "ru"} {
		iso := history.ReadCommitted
		if consumer == "ru" {
			iso = history.ReadUncommitted
		}
		var off int64
		for _, tx := range h.Txns {
			if tx.Outcome != history.Committed {
				continue
			}
			commit := tx.End.Sub(t0).Seconds()
			first, again := deliver(commit)
			for _, e := range tx.Events {
				off++
				h.Reads = append(h.Reads, history.Read{Consumer: consumer, Isolation: iso, Topic: e.Topic, Offset: off, Key: e.Key, EventID: e.ID, Seq: e.Seq, Appended: at(first)})
				if again >= 0 && consumer == "rc" || again >= 0 && rng.IntN(2) == 0 {
					off++
					h.Reads = append(h.Reads, history.Read{Consumer: consumer, Isolation: iso, Topic: e.Topic, Offset: off, Key: e.Key, EventID: e.ID, Seq: e.Seq, Appended: at(again)})
				}
			}
		}
	}
	// Samples once a second. Leadership: relay-1 until its kill -9, relay-2 until its pause, then
	// relay-3 (relay-2 claims it for a second after it resumes: the zombie); relay-1 again after
	// relay-3's SIGTERM.
	term := frac(0.9)
	for s := 0.0; s < total; s++ {
		for i, r := range []string{"relay-1", "relay-2", "relay-3"} {
			up, leader := true, false
			switch r {
			case "relay-1":
				up = !(s >= kill && s < kill+4) && !(s >= frac(0.95) && s < frac(0.95)+4)
				leader = s < kill || s >= term+3
			case "relay-2":
				up = !(s >= pause && s < pause+20)
				leader = s >= kill+5 && s < pause || s >= pause+20 && s < pause+21
			case "relay-3":
				up = !(s >= term && s < term+6)
				leader = s >= pause+10 && s < term
			}
			rss := int64(0)
			if up {
				rss = int64((40 + 10*float64(i) + 8*math.Sin(s/30) + rng.Float64()*3) * (1 << 20))
				if leader {
					rss += 30 << 20
				}
			}
			h.Relays = append(h.Relays, history.RelaySample{At: at(s + 0.3), Relay: r, Up: up, Leader: leader && up, RSS: rss})
		}
		var pending int
		for _, o := range outages {
			if s >= o.from && s < o.to+(o.to-o.from)/4 {
				pending = int(math.Max(0, math.Min(s, o.to)-o.from)) * eventsPerSecond
				if s > o.to {
					pending -= int(s-o.to) * eventsPerSecond * 4
				}
			}
		}
		lag := int64(max(pending, 0))*600 + int64(rng.IntN(20000))
		h.Slots = append(h.Slots, history.SlotSample{At: at(s + 0.6), Slot: "outbox_relay", LagBytes: lag})
	}
	h.Stops = []history.Stop{{Relay: "relay-3", Signal: at(term), Exited: at(term + 1.3), Code: 0}}
	h.Notes = []history.Note{
		{At: at(kill + 4), Text: "relay-1 restarted after kill -9"},
		{At: at(failover + 15), Text: "old primary kept away; relays reconnected to the standby"},
	}
	return h
}
