package poll

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink"
)

// result is what one batch did.
type result struct {
	claimed int
	busy    bool // nothing claimed, though rows were due: other workers hold their aggregates
}

// batch runs one claim: claim, publish, wait for Kafka, mark, commit. Its transaction lives from
// the claim to the marks, so the rows stay locked while Kafka has them; if the relay dies, the
// transaction ends with its connection and the rows are pending again at once.
func (p *Poller) batch(stop, hard context.Context, conn *pgx.Conn, log *zap.Logger) (result, error) {
	started := time.Now()
	tx, err := conn.Begin(stop)
	if err != nil {
		if stop.Err() != nil {
			return result{}, nil
		}
		return result{}, p.errorf("begin: %w", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(stop), time.Second)
		defer cancel()
		_ = tx.Rollback(ctx) // after Commit, a no-op
	}()
	rows, busy, err := p.q.claim(stop, tx, p.cfg.BatchSize)
	if err != nil {
		if stop.Err() != nil {
			return result{}, nil
		}
		return result{}, p.errorf("%w", err)
	}
	if len(rows) == 0 {
		p.m.PollEmpty.Inc()
		return result{busy: busy}, tx.Commit(hard)
	}
	if err := awaitStandbys(stop, tx, log); err != nil {
		if stop.Err() != nil {
			return result{}, nil
		}
		return result{}, p.errorf("%w", err)
	}
	p.m.PollClaims.Inc()
	p.m.PollClaimedRows.Add(float64(len(rows)))

	b := &outcomes{rows: rows, settled: make([]outcome, len(rows)), pos: make([]uint64, len(rows)), done: make(chan struct{})}
	handed := p.hand(stop, b)
	p.sink.Flush()
	b.expect(handed)
	halted := p.await(hard, b)
	if hard.Err() != nil {
		// Fenced, or the shutdown timeout: roll back. What Kafka acknowledged is published again
		// by the next claim, like any crash.
		return result{}, nil
	}
	if err := p.mark(hard, tx, b, log); err != nil {
		return result{}, err
	}
	if err := tx.Commit(hard); err != nil {
		return result{}, p.errorf("commit the marks (the batch's rows stay pending and are published again): %w", err)
	}
	p.m.PollBatchDuration.Observe(time.Since(started).Seconds())
	if halted {
		return result{}, nil
	}
	return result{claimed: len(rows)}, nil
}

// hand gives the batch's rows to the sink in seq order and returns how many it took: all, unless
// stop ended (a stop hands Kafka nothing more) or the sink halted (it takes nothing more).
func (p *Poller) hand(stop context.Context, b *outcomes) int {
	ctx, cancel := context.WithCancel(stop)
	defer cancel()
	// Publish blocks for good on a halted sink; a halt ends this batch's handing over instead.
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		t := time.NewTicker(haltPoll)
		defer t.Stop()
		for {
			if _, _, _, halted := p.sink.Halted(); halted {
				cancel()
				return
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() { cancel(); <-watching }()
	p.publish.Lock()
	defer p.publish.Unlock()
	for i, r := range b.rows {
		ack := &rowAck{b: b, i: i, final: r.dead || r.unusable != nil}
		var err error
		switch {
		case r.unusable != nil:
			err = p.sink.Reject(ctx, r.ev, unusableReason(r.unusable), r.unusable, ack)
		case r.dead:
			err = p.sink.Reject(ctx, r.ev, ReasonMaxAttempts,
				fmt.Errorf("refused by Kafka %d times (poll_max_attempts); the last time: %s", p.cfg.MaxAttempts, r.lastError), ack)
		default:
			err = p.sink.Publish(ctx, r.ev, ack)
		}
		if err != nil {
			return i
		}
		b.pos[i] = p.sink.Published() // under p.publish: nobody else hands the sink anything
	}
	return len(b.rows)
}

// unusableReason is the failure-policy reason of a row the decoder could not make an event of, as
// the WAL mode names it.
func unusableReason(err error) string {
	if errors.Is(err, decoder.ErrInvalidTimestamp) {
		return sink.ReasonInvalidTimestamp
	}
	return sink.ReasonSchemaMismatch
}

// haltPoll is how often a batch looks whether the sink has halted.
const haltPoll = 50 * time.Millisecond

// await waits until every row handed over is settled or hard ends. After a halt it waits only
// for the rows the sink still sends (those handed over before the halted event): Kafka has them,
// so they must be marked, or the next claim, here or at another relay, would publish them again.
// It waits haltGrace for them at most, since the batch's transaction holds its rows and
// aggregates meanwhile, and one of them may be stuck (its topic missing, its broker down): what
// is not settled then is published again later. It reports a halt.
func (p *Poller) await(hard context.Context, b *outcomes) bool {
	t := time.NewTicker(haltPoll)
	defer t.Stop()
	var haltedAt time.Time
	for {
		select {
		case <-b.done:
			return false
		case <-hard.Done():
			return false
		case <-t.C:
			if _, _, _, halted := p.sink.Halted(); halted {
				if haltedAt.IsZero() {
					haltedAt = time.Now()
				}
				if !b.waitsFor(p.sink.Withholds) || time.Since(haltedAt) > haltGrace {
					return true
				}
			}
		}
	}
}

// haltGrace is how long a halted batch waits for the rows handed over before the halted one.
const haltGrace = 10 * time.Second

// mark records the batch's outcome in its transaction: acknowledged rows are processed; refused
// ones count an attempt, wait a backoff and keep the error, or become dead letters; the rest
// (not handed over, or not settled before a halt) stay pending as they were.
func (p *Poller) mark(ctx context.Context, tx pgx.Tx, b *outcomes, log *zap.Logger) error {
	b.mu.Lock()
	var done, refused []int64
	var reasons []string
	for i, o := range b.settled {
		switch o.state {
		case stateAcked:
			done = append(done, b.rows[i].seq)
		case stateRefused:
			refused = append(refused, b.rows[i].seq)
			reasons = append(reasons, o.err.Error())
			p.m.PollRefused.WithLabelValues(o.reason).Inc()
			ev := b.rows[i].ev
			log.Warn("poll: kafka refused an event for good; it is published again after a backoff, and goes to the failure policy after poll_max_attempts refusals",
				zap.ByteString("event_id", ev.ID), zap.ByteString("aggregate_type", ev.AggregateType), zap.ByteString("aggregate_id", ev.AggregateID),
				zap.Int64("seq", b.rows[i].seq), zap.String("reason", o.reason), zap.Error(o.err))
		}
	}
	b.mu.Unlock()
	if len(done) > 0 {
		if _, err := tx.Exec(ctx, p.q.doneSQL, done); err != nil {
			return p.errorf("mark %d rows processed (they stay pending and are published again): %w", len(done), err)
		}
	}
	if len(refused) == 0 {
		return nil
	}
	res, err := tx.Query(ctx, p.q.refuseSQL, refused, reasons, p.cfg.MaxAttempts,
		float64(p.cfg.RetryBackoff.Milliseconds()), float64(maxBackoff.Milliseconds()))
	if err != nil {
		return p.errorf("record %d refusals: %w", len(refused), err)
	}
	defer res.Close()
	for res.Next() {
		var seq int64
		var dead bool
		if err := res.Scan(&seq, &dead); err != nil {
			return p.errorf("record refusals: %w", err)
		}
		if dead {
			p.m.PollDeadLettered.Inc()
			log.Error("poll: an event was refused poll_max_attempts times: it is a dead letter (see the dead-letter view) and goes to the failure policy",
				zap.Int64("seq", seq), zap.Int("poll_max_attempts", p.cfg.MaxAttempts))
		}
	}
	if err := res.Err(); err != nil {
		return p.errorf("record refusals: %w", err)
	}
	return nil
}

type state uint8

const (
	statePending state = iota
	stateAcked
	stateRefused
)

type outcome struct {
	state  state
	reason string
	err    error
}

// outcomes collects what the sink says about each row of a batch.
type outcomes struct {
	rows []row

	pos []uint64 // each handed-over row's position in the sink's publish order

	mu       sync.Mutex
	settled  []outcome
	left     int
	expected bool
	done     chan struct{} // closed once every row handed over is settled
}

// expect sets how many rows were handed over; only those will settle.
func (b *outcomes) expect(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range b.settled[:n] {
		if o.state == statePending {
			b.left++
		}
	}
	b.expected = true
	if b.left == 0 {
		close(b.done)
	}
}

// waitsFor reports whether a row handed over and not yet settled is one the sink still sends.
func (b *outcomes) waitsFor(withholds func(pos uint64) bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, o := range b.settled {
		if o.state == statePending && b.pos[i] != 0 && !withholds(b.pos[i]) {
			return true
		}
	}
	return false
}

func (b *outcomes) settle(i int, o outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.settled[i].state != statePending {
		return
	}
	b.settled[i] = o
	if b.expected {
		b.left--
		if b.left == 0 {
			close(b.done)
		}
	}
}

// rowAck is one row's sink.Acker and sink.Refuser.
type rowAck struct {
	b     *outcomes
	i     int
	final bool // a dead letter on its way to the failure policy: a refusal is the policy's
}

// Ack implements sink.Acker.
func (a *rowAck) Ack(int) { a.b.settle(a.i, outcome{state: stateAcked}) }

// Refuse implements sink.Refuser.
func (a *rowAck) Refuse(reason string, err error) bool {
	if a.final {
		return false
	}
	a.b.settle(a.i, outcome{state: stateRefused, reason: reason, err: err})
	return true
}
