package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/outbox"
)

// The table-free outbox (outbox_shape messages): the same backlog written as transactional
// logical decoding messages instead of rows. Measured here:
//   - the producer side: how fast the same writers commit the events, and the WAL they write, for
//     the table and for messages (the server-side backlog writers, and client-side writers that
//     commit one-event transactions through outbox.Write and outbox.Emit);
//   - the drain: pg_recvlogical with pgoutput's messages option (the message mode's own ceiling)
//     and the relay with outbox_shape messages, against the table mode's ceiling and relay.

// Sides of the message-mode drain.
const (
	sideMsgCeiling = "msg-ceiling"
	sideMsgRelay   = "msg-relay"
	sideMsgProfile = "msg-profile" // the in-process relay under pprof (BENCH_PROFILE)
)

// MessagesResult is the message mode's part of a run.
type MessagesResult struct {
	BacklogWrite time.Duration // the backlog writers, as for the table's backlog
	BacklogWAL   int64
	Drains       []Result         // sideMsgCeiling, sideMsgRelay
	Producers    []ProducerResult // client-side: table, then messages
	Err          error            // a failure before anything was measured
}

// ProducerResult is one client-side producer run: sessions committing one-event transactions.
type ProducerResult struct {
	Mode   string // "table" or "messages"
	Events int
	Wall   time.Duration
	WAL    int64
	Err    error
}

func (p ProducerResult) rate() float64 {
	if p.Err != nil || p.Wall <= 0 {
		return 0
	}
	return float64(p.Events) / p.Wall.Seconds()
}

// messages runs the message mode's measurements, after the table's drains (whose slots are gone,
// so none of them decodes this backlog) and before the steady state.
func (b *bench) messages(ctx context.Context) *MessagesResult {
	res := &MessagesResult{}
	defer func() { b.round = 0 }()
	for round := range b.rounds() {
		b.round = round
		for _, side := range []string{sideMsgCeiling, sideMsgRelay} {
			if err := createSlot(ctx, b.pool, b.slot(side)); err != nil {
				res.Err = err
				return res
			}
		}
	}
	b.round = 0
	if b.cfg.ProfileDir != "" {
		if err := createSlot(ctx, b.pool, b.slot(sideMsgProfile)); err != nil {
			res.Err = err
			return res
		}
		if err := b.createTopics(ctx, sideMsgProfile); err != nil {
			res.Err = err
			return res
		}
	}
	b.logf("writing the backlog of %d events again, as logical decoding messages with prefix %s", b.cfg.Events, b.prefix)
	from, err := currentLSN(ctx, b.pool)
	if err != nil {
		res.Err = err
		return res
	}
	start := time.Now()
	if err := writeBacklog(ctx, b.pool, b.cfg.Events, b.prefix); err != nil {
		res.Err = err
		return res
	}
	res.BacklogWrite = time.Since(start)
	end, err := currentLSN(ctx, b.pool)
	if err != nil {
		res.Err = err
		return res
	}
	res.BacklogWAL = int64(end - from)
	b.logf("message backlog written in %s (%.0f events/s), %.0f WAL bytes per event", res.BacklogWrite.Round(time.Millisecond),
		float64(b.cfg.Events)/res.BacklogWrite.Seconds(), float64(res.BacklogWAL)/float64(b.cfg.Events))

	for round := range b.rounds() {
		b.round = round
		for _, side := range []string{sideMsgCeiling, sideMsgRelay} {
			r := b.drainWith(ctx, side, func() Result {
				if side == sideMsgCeiling {
					return b.recvlogical(ctx, side, end, "messages=true")
				}
				return b.drainProc(ctx, side, func() (*child, error) {
					return b.startRelay(side, b.slot(side), b.topicPrefix(side), "--outbox-shape=messages", "--messages-prefix="+b.prefix)
				}, end)
			})
			r.Round = round
			res.Drains = append(res.Drains, r)
			b.logf("%s", r.line())
			if ctx.Err() != nil {
				return res
			}
		}
	}
	b.round = 0
	if b.cfg.ProfileDir != "" {
		err := b.profileMessages(ctx, b.slot(sideMsgProfile), end)
		_ = dropSlot(ctx, b.pool, b.slot(sideMsgProfile)) // the producers' writes below would land in it
		_ = b.dropTopics(ctx, sideMsgProfile)
		if err != nil {
			b.logf("%v", err)
			if b.profile != nil && b.profile.Err == nil {
				b.profile.Err = err
			}
		}
	}

	if b.cfg.ProducerFor > 0 {
		for _, mode := range []string{"table", "messages"} {
			p := b.produce(ctx, mode)
			res.Producers = append(res.Producers, p)
			if p.Err != nil {
				b.logf("producer %s: FAILED: %v", mode, p.Err)
			} else {
				b.logf("producer %s: %d one-event transactions in %s (%.0f/s), %.0f WAL bytes per event", mode, p.Events,
					p.Wall.Round(time.Millisecond), p.rate(), float64(p.WAL)/float64(max(p.Events, 1)))
			}
		}
	}
	return res
}

// producerSessions is how many client sessions commit at once in a producer run.
const producerSessions = 4

// benchEvent is the client-side producers' payload: the same fields and size as bench_payload's.
type benchEvent struct {
	Aggregate string  `json:"aggregate"`
	N         int     `json:"n"`
	SentNS    int64   `json:"sent_ns"`
	Warm      bool    `json:"warm"`
	Amount    float64 `json:"amount"`
	Currency  string  `json:"currency"`
	Note      string  `json:"note"`
}

// produce commits one-event transactions from producerSessions sessions for ProducerFor, through
// outbox.Write (mode table) or outbox.Emit (mode messages): the cost a service pays per event,
// round trips and commits included. No slot decodes these writes.
func (b *bench) produce(ctx context.Context, mode string) ProducerResult {
	res := ProducerResult{Mode: mode}
	emitter, err := outbox.NewEmitter(outbox.EmitterConfig{Prefix: b.prefix})
	if err != nil {
		res.Err = err
		return res
	}
	write := func(ctx context.Context, tx pgx.Tx, ev outbox.Event) error {
		_, err := outbox.Write(ctx, tx, ev)
		return err
	}
	if mode == "messages" {
		write = func(ctx context.Context, tx pgx.Tx, ev outbox.Event) error {
			_, err := emitter.Emit(ctx, tx, ev)
			return err
		}
	}
	from, err := currentLSN(ctx, b.pool)
	if err != nil {
		res.Err = err
		return res
	}
	note := strings.Repeat("x", 200)
	counts := make([]int, producerSessions)
	errs := make([]error, producerSessions)
	start := time.Now()
	deadline := start.Add(b.cfg.ProducerFor)
	var wg sync.WaitGroup
	for s := range producerSessions {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				a := (s*7919 + i) % 1000
				ev := outbox.Event{
					AggregateType: aggregateTypes[a%3], AggregateID: fmt.Sprintf("agg-%d", a), EventType: "Happened",
					Payload: benchEvent{Aggregate: fmt.Sprintf("agg-%d", a), N: i, Currency: "EUR", Amount: float64(i%100000) / 100, Note: note},
					Headers: map[string]string{"tenant": fmt.Sprintf("t%d", a%10)},
				}
				if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return write(ctx, tx, ev) }); err != nil {
					errs[s] = err
					return
				}
				counts[s]++
			}
		})
	}
	wg.Wait()
	res.Wall = time.Since(start)
	for s := range producerSessions {
		res.Events += counts[s]
		if errs[s] != nil && res.Err == nil {
			res.Err = fmt.Errorf("producer %s: %w", mode, errs[s])
		}
	}
	end, err := currentLSN(ctx, b.pool)
	if err != nil && res.Err == nil {
		res.Err = err
	}
	res.WAL = int64(end - from)
	return res
}

// messagesTable renders the message mode's results.
func (r *Report) messagesTable(b *strings.Builder) {
	m := r.Messages
	if m == nil {
		return
	}
	b.WriteString("\nTable-free outbox (outbox_shape messages): the same backlog written as transactional logical decoding messages.\n\n")
	if m.Err != nil {
		fmt.Fprintf(b, "Failed: %s\n", oneLine(m.Err))
		return
	}
	events := float64(r.Config.Events)
	b.WriteString("Producer side, the backlog's two server-side writers (transactions of 1-50 events):\n\n")
	b.WriteString("| events as | write s | events/s | vs table | WAL MB | WAL bytes/event | vs table |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	tableRate, msgRate := events/r.BacklogWrite.Seconds(), events/m.BacklogWrite.Seconds()
	fmt.Fprintf(b, "| table rows | %.2f | %.0f | 1.00 | %.1f | %.0f | 1.00 |\n",
		r.BacklogWrite.Seconds(), tableRate, float64(r.BacklogWAL)/1e6, float64(r.BacklogWAL)/events)
	fmt.Fprintf(b, "| messages | %.2f | %.0f | %.2f | %.1f | %.0f | %.2f |\n",
		m.BacklogWrite.Seconds(), msgRate, msgRate/tableRate, float64(m.BacklogWAL)/1e6, float64(m.BacklogWAL)/events,
		float64(m.BacklogWAL)/float64(max(r.BacklogWAL, 1)))
	if len(m.Producers) == 2 {
		fmt.Fprintf(b, "\nProducer side, %d client sessions committing one-event transactions for %s each (outbox.Write, outbox.Emit):\n\n",
			producerSessions, r.Config.ProducerFor)
		b.WriteString("| events as | events | events/s | vs table | WAL bytes/event | vs table |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|\n")
		t := m.Producers[0]
		for _, p := range m.Producers {
			if p.Err != nil {
				fmt.Fprintf(b, "| %s | failed: %s |||||\n", p.Mode, oneLine(p.Err))
				continue
			}
			fmt.Fprintf(b, "| %s | %d | %.0f | %s | %.0f | %s |\n", p.Mode, p.Events, p.rate(), ratioOf(p.rate(), t.rate()),
				float64(p.WAL)/float64(max(p.Events, 1)), ratioOf(float64(p.WAL)/float64(max(p.Events, 1)), float64(t.WAL)/float64(max(t.Events, 1))))
		}
	}
	b.WriteString("\nDrain of the message backlog:\n\n")
	b.WriteString("| side | events/s | vs table ceiling | vs message ceiling | vs table relay | wall s | first record s | CPU s | CPU µs/event | peak RSS MB | walsender CPU s | broker CPU s |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	labels := map[string]string{sideMsgCeiling: "ceiling (pg_recvlogical, messages)", sideMsgRelay: "outbox-relay, messages"}
	// Against the table's medians (its rounds ran before any of these) and this round's ceiling.
	tableCeiling, tableRelay := r.drain(sideCeiling), r.drain(sideRelay)
	for _, d := range m.Drains {
		msgCeiling := drains(m.Drains).in(sideMsgCeiling, d.Round)
		if d.Err != nil {
			fmt.Fprintf(b, "| %s | failed: %s |||||||||||\n", labels[d.Side], oneLine(d.Err))
			continue
		}
		name := labels[d.Side] + r.roundLabel(d)
		if d.Partial {
			name += fmt.Sprintf(" (stopped after %.0f s with %d of %d events)", d.Wall.Seconds(), d.Events, d.Target)
		}
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %s | %.2f | %s | %.2f | %.1f | %.0f | %.2f | %.2f |\n",
			name, d.rate(), ratio(d, tableCeiling, "%.2f"), ratio(d, msgCeiling, "%.2f"), ratio(d, tableRelay, "%.2f"),
			d.Wall.Seconds(), secondsOrDash(d.First), d.CPU.Seconds(), float64(d.CPU.Microseconds())/float64(d.Events),
			mb(d.PeakRSS), d.SenderCPU.Seconds(), d.BrokerCPU.Seconds())
	}
}

func ratioOf(a, base float64) string {
	if base <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/base)
}

// messagesSummary is the message mode's part of the summary line: how many times faster the
// backlog writers committed messages than rows, how many times less WAL they wrote, and the
// message relay against its own ceiling.
func (r *Report) messagesSummary() string {
	write, wal, vs := "n/a", "n/a", "n/a"
	if m := r.Messages; m != nil && m.Err == nil && m.BacklogWrite > 0 && r.BacklogWrite > 0 {
		write = fmt.Sprintf("%.1f", r.BacklogWrite.Seconds()/m.BacklogWrite.Seconds())
		if m.BacklogWAL > 0 && r.BacklogWAL > 0 {
			wal = fmt.Sprintf("%.1f", float64(r.BacklogWAL)/float64(m.BacklogWAL))
		}
		vs = r.ratioMedian(messagesVsCeiling)
	}
	return fmt.Sprintf("msg_write_x=%s msg_wal_x=%s msg_relay_vs_ceiling=%s", write, wal, vs)
}

// messagesFailed lists the message mode's failed measurements.
func (r *Report) messagesFailed() []string {
	m := r.Messages
	if m == nil {
		return nil
	}
	var out []string
	if m.Err != nil {
		out = append(out, "messages: "+m.Err.Error())
	}
	for _, d := range m.Drains {
		if d.Err != nil {
			out = append(out, "messages "+d.Side+": "+d.Err.Error())
		}
	}
	for _, p := range m.Producers {
		if p.Err != nil {
			out = append(out, "producer "+p.Mode+": "+p.Err.Error())
		}
	}
	return out
}
