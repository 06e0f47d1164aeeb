// Package poll is the relay's source for databases without logical replication: it reads the
// outbox table itself. Workers claim batches of pending rows in short transactions, hand them to
// the sink, and mark exactly the rows Kafka acknowledged as processed before they commit; a row
// Kafka refuses for good is retried after a backoff and, after MaxAttempts refusals, goes to the
// failure policy. Several workers, in one relay or in several, poll one table at once.
//
// Per-aggregate order (claim.go): a worker claims a row only when every older pending row of its
// aggregate is claimed by it too, in the same batch. An advisory lock per aggregate, held for the
// batch's transaction, keeps two workers off one aggregate; a check with a fresh snapshot after
// the locks are taken drops any row with an older pending row outside the batch (in backoff,
// locked by another session, or committed while the claim ran). Rows are ordered by seq, the
// insertion sequence; see docs/guarantees.md for what that means for transactions that commit
// in another order than they inserted.
//
// Nothing is shared with the WAL source (package replication): no slot, no LSN, no checkpoint. A
// row's processed_at is the only record of its delivery.
package poll

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/credentials"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Config configures a Poller. Zero values get the defaults noted.
type Config struct {
	DSN string
	// PasswordFile holds the password (config key pg_password_file); it is read for every
	// connection, so a rotated secret is used at the next reconnect.
	PasswordFile string
	Schema       string // default "public"
	Table        string // default "outbox_events"
	Columns      decoder.Columns
	// Extra lists further columns whose values travel with the event (as Kafka headers).
	Extra []string
	// CreatedColumn is the row's creation time: the event's timestamp for the end-to-end latency,
	// and the age of the oldest pending row. Default "created_at".
	CreatedColumn string
	// BatchSize is the most rows one worker claims in one transaction. Default 200.
	BatchSize int
	// Interval is the fallback poll: how long a worker with nothing to do waits when no
	// notification wakes it (notifications are lost while the listening connection is down, and a
	// row in backoff becomes due without one). Default 1s.
	Interval time.Duration
	// MaxAttempts is how many permanent refusals a row takes before it is a dead letter and goes
	// to the failure policy. Default 5.
	MaxAttempts int
	// RetryBackoff is the first retry's delay after a refusal; it doubles per attempt up to
	// maxBackoff, each drawn between half and all of that (jitter). Default 1s.
	RetryBackoff time.Duration
	// Workers is how many batches one relay has in flight at once, each with its own connection
	// and transaction. Default 2.
	Workers int
	// StatsInterval is how often the pending-row gauges are read. Default 10s.
	StatsInterval time.Duration
}

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.Table == "" {
		c.Table = "outbox_events"
	}
	if c.Columns == (decoder.Columns{}) {
		c.Columns = decoder.DefaultColumns()
	}
	if c.CreatedColumn == "" {
		c.CreatedColumn = "created_at"
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 200
	}
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = time.Second
	}
	if c.Workers <= 0 {
		c.Workers = 2
	}
	if c.StatsInterval <= 0 {
		c.StatsInterval = 10 * time.Second
	}
}

// maxBackoff caps the delay between retries of a refused row: an operator who fixes the cause
// (a topic's max.message.bytes, a create-topic policy) sees the row go out within minutes.
const maxBackoff = 5 * time.Minute

// Sink is what the poller needs of the sink (*sink.Sink). Publish and Reject are never called
// concurrently: the poller serialises them, as the sink requires.
type Sink interface {
	WaitReady(ctx context.Context) error
	Publish(ctx context.Context, ev *decoder.Event, ack sink.Acker) error
	Reject(ctx context.Context, ev *decoder.Event, reason string, err error, ack sink.Acker) error
	// Flush sends what was handed over without lingering: a batch waits for its acknowledgements
	// before its worker claims again, so nothing would join it.
	Flush()
	Halted() (eventID, reason string, err error, halted bool)
	// Published and Withholds tell which of a halted batch's rows Kafka still settles.
	Published() uint64
	Withholds(pos uint64) bool
}

// ReasonMaxAttempts is the failure-policy reason of a row refused MaxAttempts times.
const ReasonMaxAttempts = "max_attempts"

// Poller relays the outbox table to the sink. It runs once.
type Poller struct {
	cfg  Config
	log  *zap.Logger
	m    *metrics.Metrics
	sink Sink

	q       queries
	publish sync.Mutex // Publish and Reject run on one goroutine at a time
	wake    *waker
	polling atomic.Bool
}

// New builds a poller. Nothing is contacted until Run.
func New(cfg Config, sk Sink, log *zap.Logger, m *metrics.Metrics) *Poller {
	cfg.setDefaults()
	return &Poller{cfg: cfg, log: log, m: m, sink: sk, q: newQueries(cfg), wake: newWaker()}
}

// Polling reports whether a worker has claimed from the table (it stays set across reconnects).
func (p *Poller) Polling() bool { return p.polling.Load() }

// ErrNotMigrated is wrapped by Run's error when the table lacks the polling columns.
var ErrNotMigrated = errors.New("the outbox table lacks the polling mode's columns")

// Run polls until stop ends or a fatal error. A batch in progress when stop ends hands Kafka no
// more rows, waits for the acknowledgements of those it handed over, marks them and commits;
// hard ends that wait too (a fence, or the shutdown timeout): the batch is rolled back and its
// rows, published or not, stay pending for the next claim. Run returns nil after a stop.
func (p *Poller) Run(stop, hard context.Context) error {
	if err := p.preflight(stop); err != nil {
		if stop.Err() != nil {
			return nil
		}
		return err
	}
	if err := p.sink.WaitReady(stop); err != nil {
		if stop.Err() != nil {
			return nil
		}
		return err
	}
	var helpers sync.WaitGroup
	helpers.Go(func() { p.listen(stop) })
	helpers.Go(func() { p.stats(stop) })
	defer helpers.Wait()
	p.log.Info("polling", zap.String("table", p.cfg.Schema+"."+p.cfg.Table), zap.Int("workers", p.cfg.Workers),
		zap.Int("batch_size", p.cfg.BatchSize), zap.Duration("interval", p.cfg.Interval), zap.Int("max_attempts", p.cfg.MaxAttempts))
	var workers sync.WaitGroup
	errs := make(chan error, p.cfg.Workers)
	for i := range p.cfg.Workers {
		workers.Go(func() {
			if err := p.work(stop, hard, i); err != nil {
				errs <- err
			}
		})
	}
	workers.Wait()
	close(errs)
	return <-errs
}

// preflight checks once, before anything is published, that the table is migrated for polling and
// has the mapped columns, so a mistake is one clear error and not a worker retrying for ever.
func (p *Poller) preflight(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		conn, err := p.connect(ctx)
		if err == nil {
			err = p.q.check(ctx, conn)
			conn.Close(context.WithoutCancel(ctx))
			if err == nil || errors.Is(err, ErrNotMigrated) || errors.Is(err, errMissingColumn) {
				return err
			}
		}
		delay := reconnectDelay(attempt)
		p.log.Warn("poll: cannot reach the outbox table; retrying", zap.Error(err), zap.Duration("retry_in", delay))
		if !sleep(ctx, delay) {
			return ctx.Err()
		}
	}
}

// work is one worker: claim a batch, publish it, mark it, commit; again at once while batches come
// back full, else after a notification or Interval.
func (p *Poller) work(stop, hard context.Context, id int) error {
	log := p.log.With(zap.Int("worker", id))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(stop), time.Second)
			conn.Close(closeCtx)
			cancel()
		}
	}()
	failures := 0
	for stop.Err() == nil {
		if _, _, _, halted := p.sink.Halted(); halted {
			<-stop.Done() // the halt policy: nothing more is published until an operator restarts
			return nil
		}
		wake := p.wake.next()
		if conn == nil {
			c, err := p.connect(stop)
			if err != nil {
				if stop.Err() != nil {
					return nil
				}
				delay := reconnectDelay(failures)
				failures++
				log.Warn("poll: cannot connect to PostgreSQL; retrying", zap.Error(err), zap.Duration("retry_in", delay))
				p.m.Reconnects.WithLabelValues("poll").Inc()
				sleep(stop, delay)
				continue
			}
			conn = c
		}
		res, err := p.batch(stop, hard, conn, log)
		if err != nil {
			if hard.Err() != nil {
				return nil
			}
			delay := reconnectDelay(failures)
			failures++
			log.Warn("poll: batch failed; its rows stay pending and are claimed again", zap.Error(err), zap.Duration("retry_in", delay))
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(stop), time.Second)
			conn.Close(closeCtx)
			cancel()
			conn = nil
			sleep(stop, delay)
			continue
		}
		failures = 0
		p.polling.Store(true)
		switch {
		case res.claimed == p.cfg.BatchSize:
			continue // more is waiting
		case res.claimed == 0 && res.busy:
			// Rows are pending but their aggregates are another worker's: look again soon, not
			// after a whole interval.
			sleep(stop, busyWait)
			continue
		}
		select {
		case <-wake:
		case <-time.After(p.cfg.Interval):
		case <-stop.Done():
		}
	}
	return nil
}

// connect opens a worker's (or the statistics') connection, which runs nothing but the poller's
// queries: each reads a few rows at the queue's head, or rows by seq, through an index. Statistics
// cannot be trusted to see that, as they describe the whole table and not where its pending rows
// are (at its end), and in a backlog they misled the planner twice: without statistics for the new
// pending index it fetched every pending row and sorted them for each claim (bitmap scans; a
// second per claim instead of a millisecond at 200,000 pending rows), and with statistics taken
// during a drain it read the whole table for each verification (a parallel sequential scan and a
// sort: 1.2 s per batch on a table of 1,000,000 rows, 300,000 of them pending). So bitmap and
// sequential scans are off, and so is JIT compilation, which such estimates would also buy
// (0.18 s per query there).
func (p *Poller) connect(ctx context.Context) (*pgx.Conn, error) {
	return connect(ctx, p.cfg.DSN, p.cfg.PasswordFile)
}

func connect(ctx context.Context, dsn, passwordFile string) (*pgx.Conn, error) {
	cc, err := credentials.PostgresConfig(dsn, passwordFile)
	if err != nil {
		return nil, err
	}
	// Timestamps (columns.timestamp, the creation column) are read in text form, in the ISO format
	// the decoder reads, whatever DateStyle the database or role sets (as the replication
	// connection does). A connection pooler passes DateStyle on at startup.
	cc.RuntimeParams["DateStyle"] = "ISO"
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	// The planner settings are session settings rather than startup parameters, which a pooler
	// such as PgBouncer refuses (or drops, with ignore_startup_parameters) for all but a few.
	if _, err := conn.Exec(ctx, "SET enable_bitmapscan = off; SET enable_seqscan = off; SET jit = off"); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("set the poller's planner settings: %w", err)
	}
	return conn, nil
}

// busyWait is how long a worker waits when every pending row it saw belongs to aggregates other
// workers hold: about one batch's round trip to Kafka.
const busyWait = 20 * time.Millisecond

// reconnectDelay grows from 200ms to 5s.
func reconnectDelay(attempt int) time.Duration {
	return min(200*time.Millisecond<<min(attempt, 5), 5*time.Second)
}

// sleep waits d or until ctx ends; it reports whether the whole d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// waker wakes every waiting worker at once: next returns a channel closed by the next wake-up.
type waker struct {
	mu sync.Mutex
	ch chan struct{}
}

func newWaker() *waker { return &waker{ch: make(chan struct{})} }

func (w *waker) next() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ch
}

func (w *waker) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.ch)
	w.ch = make(chan struct{})
}

// listen LISTENs on the table's channel and wakes the workers on each notification, and after
// every (re)connection, since notifications sent while it was away are lost.
func (p *Poller) listen(ctx context.Context) {
	channel := pgx.Identifier{migrations.Channel(p.cfg.Table)}.Sanitize()
	for attempt := 0; ctx.Err() == nil; attempt++ {
		conn, err := p.connect(ctx)
		if err == nil {
			if _, err = conn.Exec(ctx, "LISTEN "+channel); err == nil {
				attempt = 0
				p.wake.wakeAll()
				for err == nil {
					_, err = conn.WaitForNotification(ctx)
					if err == nil {
						p.wake.wakeAll()
					}
				}
			}
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			conn.Close(closeCtx)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		delay := reconnectDelay(attempt)
		p.log.Warn("poll: the LISTEN connection failed; polling every poll_interval until it is back", zap.Error(err), zap.Duration("retry_in", delay))
		p.m.Reconnects.WithLabelValues("poll_listen").Inc()
		sleep(ctx, delay)
	}
}

// stats reads the pending-row gauges every StatsInterval.
func (p *Poller) stats(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for {
		if conn == nil {
			conn, _ = p.connect(ctx)
		}
		if conn != nil {
			st, err := p.q.stats(ctx, conn)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				p.log.Debug("poll: cannot read the outbox statistics", zap.Error(err))
				p.m.PostgresUp.Set(0)
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
			} else {
				p.m.PostgresUp.Set(1)
				p.m.PollPendingRows.Set(float64(st.pending))
				p.m.PollOldestPendingAge.Set(st.oldestAge.Seconds())
				p.m.PollDeadLetters.Set(float64(st.dead))
			}
		} else {
			p.m.PostgresUp.Set(0)
		}
		if !sleep(ctx, p.cfg.StatsInterval) {
			return
		}
	}
}

// errorf wraps err with the table's name.
func (p *Poller) errorf(format string, args ...any) error {
	return fmt.Errorf("poll %s.%s: "+format, append([]any{p.cfg.Schema, p.cfg.Table}, args...)...)
}
