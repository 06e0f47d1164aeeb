package relay

// A lost slot's recovery, the relay's half (replication/recovery.go is the stream's): publishing,
// from the replacement slot's exported snapshot, the outbox rows committed after the last
// transaction Kafka acknowledged, and recording that point in the slot ledger as Kafka
// acknowledges.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxrow"
	"github.com/outbox-relay/outbox-relay/replication"
)

// Recovery configures how a lost slot's gap is read from the outbox table (on_slot_lost: recover).
type Recovery struct {
	// Margin, set by hand (slot_recovery_margin), is the operator's word for the longest
	// transaction that writes the outbox: where nothing PostgreSQL recorded bounds the gap (no
	// horizon in the ledger, no commit timestamps), the gap is the rows created from Margin before
	// the last acknowledged commit. Zero: no margin, and such a gap stops the relay. Pruning
	// keeps rows created from Margin (else DefaultRecoveryMargin) before it.
	Margin time.Duration
	// CreatedColumn and OrderColumn are as for Backfill.
	CreatedColumn, OrderColumn string
}

// DefaultRecoveryMargin is how long before the last acknowledged commit pruning keeps rows when
// slot_recovery_margin is not set, and the age beyond which a recovery warns about the rows of its
// gap (rewritten rows, or a transaction that long).
const DefaultRecoveryMargin = time.Hour

// keepMargin is the margin pruning keeps rows for: the configured one, else the default.
func keepMargin(configured time.Duration) time.Duration {
	if configured > 0 {
		return configured
	}
	return DefaultRecoveryMargin
}

// commitSkew is how much earlier than a transaction before it in the WAL a transaction's commit
// time may be: PostgreSQL takes the time before it inserts the commit record, and transactions
// committing at once may insert theirs in the other order. Rows committed this much before the
// last acknowledged commit are published again.
const commitSkew = time.Second

// confirmedEvery is how often the relay records in the slot ledger how far Kafka has acknowledged.
// What it trails by, a recovery publishes twice.
const confirmedEvery = 5 * time.Second

// recoverGap publishes the gap of a lost slot (replication.Config.Recover).
func (w *walSource) recoverGap(ctx context.Context, snapshot string, lost replication.LostSlot) (replication.Recovery, error) {
	started := time.Now()
	conn, err := w.cfg.Replication.Connect(ctx)
	if err != nil {
		return replication.Recovery{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := outboxrow.Begin(ctx, conn, snapshot)
	if err != nil {
		return replication.Recovery{}, err
	}
	defer rollback(ctx, tx) // not beyond a fence: see rollback
	rc := w.cfg.Recovery
	if rc == nil {
		rc = &Recovery{}
	}
	t, err := w.outboxTable(ctx, tx, rc.CreatedColumn, rc.OrderColumn)
	if err != nil {
		return replication.Recovery{}, err
	}
	g, err := chooseGap(ctx, tx, t, lost, rc.Margin)
	if err != nil {
		return replication.Recovery{}, err
	}
	left, acknowledged, err := w.countGap(ctx, tx, t, g, lost)
	if err != nil {
		return replication.Recovery{}, err
	}
	w.log.Warn("recovering a lost slot's gap from the outbox table: the events of transactions committed after the last one Kafka acknowledged",
		zap.String("slot", lost.Slot), zap.String("reason", lost.Reason), zap.Time("after", lost.Since),
		zap.String("rule", g.rule), zap.Duration("margin", g.margin), zap.Uint64("xmin_horizon", lost.Xmin),
		zap.Int64("rows", left), zap.Int64("may_be_duplicates", acknowledged),
		zap.Stringer("new_slot_consistent_point", lost.ConsistentLSN), zap.Bool("again", lost.Again))
	q := rowQuery{where: []string{g.where}, args: g.args, flag: g.duplicate}
	if w.exactlyOnce() {
		// Exactly-once positions order events by the stream's LSNs, which table rows do not have:
		// the gap goes out as one pseudo-transaction just before the new slot's first, at least
		// once (a crash during it publishes it all again), and no position it leaves can skip
		// anything the new slot streams.
		q.stamp = func(ev *decoder.Event, n int64) {
			ev.Tx.CommitLSN = lost.ConsistentLSN - 1
			ev.Tx.SystemID, ev.Tx.Timeline = lost.Server.SystemID, lost.Server.Timeline
			ev.Index = int(n)
		}
	}
	n, dups, err := w.publishSelected(ctx, tx, t, q)
	if err != nil {
		err = fmt.Errorf("publish the gap (%d events published so far; the next start publishes it all again): %w", n, err)
	}
	if err := w.cancelledReads.note(ctx, "the lost slot's gap", err); err != nil {
		return replication.Recovery{}, err
	}
	took := time.Since(started)
	w.m.SlotRecoveries.Inc()
	w.m.SlotRecoveredEvents.Add(float64(n))
	fields := []zap.Field{zap.String("slot", lost.Slot), zap.Int64("events", n), zap.Int64("may_be_duplicates", dups),
		zap.Time("after", lost.Since), zap.String("rule", g.rule), zap.Duration("took", took)}
	if w.exactlyOnce() {
		w.log.Warn("recovered the lost slot's gap, at least once: exactly-once cannot cover events read from the table (read_committed consumers may see the ones counted in may_be_duplicates twice); streaming from the new slot", fields...)
	} else {
		w.log.Warn("recovered the lost slot's gap; streaming from the new slot", fields...)
	}
	return replication.Recovery{Events: n, From: lost.Since, Rule: g.rule, Took: took}, nil
}

// chooseGap reads in tx what the gap's rule depends on (whether commit timestamps are tracked, the
// snapshot's next transaction id) and returns the gap's query.
func chooseGap(ctx context.Context, tx pgx.Tx, t outboxTable, lost replication.LostSlot, margin time.Duration) (gap, error) {
	// The snapshot's next transaction id (its xmax, a full id): the xmin rule maps each row's
	// 32-bit xmin to a full id below it.
	var tracked, next string
	if err := tx.QueryRow(ctx, "SELECT current_setting('track_commit_timestamp'), pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&tracked, &next); err != nil {
		return gap{}, fmt.Errorf("read track_commit_timestamp and the snapshot's next transaction id: %w", err)
	}
	nextXid, err := strconv.ParseUint(next, 10, 64)
	if err != nil {
		return gap{}, fmt.Errorf("read the snapshot's next transaction id %q: %w", next, err)
	}
	g, err := gapQuery(t, lost, margin, tracked == "on", nextXid)
	if err != nil {
		return gap{}, replication.Fatal(err)
	}
	return g, nil
}

// countGap counts, before anything is published, what the rule chooses (left), how much of it
// Kafka may hold already (acknowledged), and how much of it was created before any transaction
// the relay's pruning keeps rows for (a transaction that long, or rows rewritten since their
// commit), which it warns of. A gap that pruning may have cut is fatal. The count is a scan of
// the whole table, so without the role's timeouts, like the read.
func (w *walSource) countGap(ctx context.Context, tx pgx.Tx, t outboxTable, g gap, lost replication.LostSlot) (left, acknowledged int64, err error) {
	if err := outboxrow.ClearTimeouts(ctx, tx); err != nil {
		return 0, 0, err
	}
	var old int64
	var oldestRow *time.Time
	counted := append(append([]any{}, g.args...), g.oldest)
	if err := tx.QueryRow(ctx, fmt.Sprintf("SELECT count(*), count(*) FILTER (WHERE %s), count(*) FILTER (WHERE %s < $%d), min(%s) FROM %s WHERE %s",
		g.duplicate, t.created, len(counted), t.created, t.name, g.where), counted...).Scan(&left, &acknowledged, &old, &oldestRow); err != nil {
		// A cancellation counts as one of the read's: repeated, it ends the relay.
		return 0, 0, w.cancelledReads.note(ctx, "the lost slot's gap", fmt.Errorf("count the gap's rows: %w", err))
	}

	// The relay's own pruning never deletes the gap's rows (run.go guards it by the ledger), but
	// one from before that guard, or one run without the ledger, may have: a gap read from a table
	// that lost some of it would pass a partial gap off as whole.
	if lost.PrunedThrough.After(g.oldest) {
		return 0, 0, replication.Fatal(fmt.Errorf("%w: slot %q is lost (%s), and its gap cannot be recovered whole from the outbox table: pruning deleted rows created before %s, and the gap's rows may have been created from %s on. %d rows of the gap are left (besides %d that Kafka acknowledged before the loss, which the rule reads again); how many were deleted the table cannot say. Nothing of the gap was published. Publish what is left by hand if that is acceptable (stop every instance, run outbox-relay forget-slot, start once with backfill: true and backfill_since: %s), and keep rows longer than the relay may be down",
			replication.ErrSlotLost, lost.Slot, lost.Reason, lost.PrunedThrough.Format(time.RFC3339), g.oldest.Format(time.RFC3339), left-acknowledged, acknowledged, g.oldest.Format(time.RFC3339)))
	}

	if old > 0 {
		// Not left out: a row the rule chooses may be a long transaction's, which only costs a
		// duplicate if it is not. Said before publishing, so that an operator sees why a recovery
		// publishes much more than the gap.
		w.log.Warn("rows of the lost slot's gap were created long before the last acknowledged commit: rows rewritten since their commit (an UPDATE, pg_repack, a rewriting ALTER TABLE, a move between partitions) carry a new transaction id and count as committed after it, so they are published again; a transaction that ran that long is the other cause",
			zap.String("slot", lost.Slot), zap.Int64("rows", old), zap.Time("created_before", g.oldest), zap.Timep("oldest_created", oldestRow),
			zap.Int64("gap_rows", left), zap.String("rule", g.rule))
	}
	return left, acknowledged, nil
}

// gap is the WHERE clause that chooses a lost slot's gap.
type gap struct {
	rule      string
	margin    time.Duration // of the creation time rule, for the log (0: none used)
	where     string
	args      []any
	duplicate string    // true for a row that may have been published before the loss
	oldest    time.Time // the relay's pruning keeps the rows created from here on
}

// gapQuery chooses the rows committed after the last acknowledged point, by what PostgreSQL
// recorded (docs/guarantees.md, "Lost slot, no lost events"):
//   - with commit timestamps, by commit time (a transaction may have created its rows long before
//     it committed), and also by the recorded horizon if there is one (a commit time is a clock's
//     word); without a horizon, a row whose commit time is unknown (frozen, or from before the
//     setting) by creation time with a margin set by hand, else it is chosen;
//   - else by the recorded horizon (RuleXmin): the rows of transactions with an id from the
//     horizon's on, whenever they began or were prepared;
//   - else by creation time from margin before, only with a margin set by hand.
//
// Where none applies it returns an error wrapping replication.ErrSlotLost: a guess would pass a
// partial gap off as whole. next is the reading snapshot's next full transaction id.
func gapQuery(t outboxTable, lost replication.LostSlot, margin time.Duration, commitTimestamps bool, next uint64) (gap, error) {
	oldest := lost.Since.Add(-commitSkew - keepMargin(margin))
	created := lost.Since.Add(-margin)
	var byXmin string
	if lost.Xmin != 0 {
		// A row's xmin is 32 bits: its full id is the one below next (next itself is not yet
		// assigned) with those low bits, for every id within 2^31 of next (PostgreSQL stops
		// assigning ids before an unfrozen row gets older). A frozen row from before that may map
		// into the gap: a duplicate, never a row left out. Below: (next-1 - id) mod 2^32 is how
		// far below next-1 the row's full id is.
		if next < lost.Xmin || next-lost.Xmin >= 1<<31 {
			return gap{}, fmt.Errorf("%w: slot %q is lost (%s), and the horizon recorded with the last acknowledged commit (transaction id %d) is not within 2^31 transactions before the server's next one (%d): the ledger is from another cluster or a restore, so which rows the slot had not delivered cannot be told. Nothing of the gap was published. Recover by hand: stop every instance, run outbox-relay forget-slot, and start once with backfill: true and backfill_since: %s",
				replication.ErrSlotLost, lost.Slot, lost.Reason, lost.Xmin, next, lost.Since.Add(-DefaultRecoveryMargin).Format(time.RFC3339))
		}
		byXmin = fmt.Sprintf("((%d - xmin::text::bigint + 4294967296) %% 4294967296) < %d", (next-1)&0xffffffff, next-lost.Xmin)
	}
	switch {
	case commitTimestamps && !lost.FromSlotCreation:
		from := lost.Since.Add(-commitSkew)
		unknown, rule := "true", replication.RuleCommitTime
		if margin > 0 {
			unknown = fmt.Sprintf("%s >= $3", t.created)
		}
		where := fmt.Sprintf("(pg_xact_commit_timestamp(xmin) >= $1 OR (pg_xact_commit_timestamp(xmin) IS NULL AND %s))", unknown)
		if byXmin != "" {
			// The horizon proves what commit times only suggest: a transaction's commit time is
			// its server's clock (stepped back, or a commit record inserted more than the skew
			// after it was read), or a replication origin's (a transaction applied by logical
			// replication, or under pg_replication_origin_xact_setup, carries its origin's commit
			// time). A row of a transaction from the horizon on is in the gap whatever its time.
			where = fmt.Sprintf("(pg_xact_commit_timestamp(xmin) >= $1 OR %s)", byXmin)
		}
		return gap{
			rule: rule, margin: margin, oldest: oldest,
			where:     where,
			args:      []any{from, lost.Since, created},
			duplicate: fmt.Sprintf("coalesce(pg_xact_commit_timestamp(xmin) <= $2, %s < $2) AND $3::timestamptz IS NOT NULL", t.created),
		}, nil
	case byXmin != "":
		return gap{
			rule: replication.RuleXmin, oldest: oldest,
			where:     byXmin,
			args:      []any{lost.Since},
			duplicate: fmt.Sprintf("%s < $1", t.created),
		}, nil
	case margin > 0:
		return gap{
			rule: replication.RuleCreatedAt, margin: margin, oldest: oldest,
			where:     fmt.Sprintf("%s >= $1", t.created),
			args:      []any{created, lost.Since},
			duplicate: fmt.Sprintf("%s < $2", t.created),
		}, nil
	}
	why := "the slot ledger records nothing as acknowledged for it (a relay from before migration 0007 streamed it, or it was lost in its first seconds)"
	if !lost.FromSlotCreation {
		why = "the slot ledger holds no horizon with the last acknowledged commit (recorded since migration 0008: relays of an older version did not)"
		if !commitTimestamps {
			why += ", and track_commit_timestamp is off"
		}
	}
	return gap{}, fmt.Errorf("%w: slot %q is lost (%s), and nothing PostgreSQL recorded bounds its gap: %s, so which rows of the outbox table it had not delivered cannot be told (a transaction's creation time says nothing of when it committed). Nothing of the gap was published. Either set slot_recovery_margin to the longest a transaction writing the outbox can run and start again (rows created from that long before %s are published; a longer or prepared transaction, or an application that sets %s itself, escapes it), or recover by hand: stop every instance, run outbox-relay forget-slot, and start once with backfill: true and backfill_since: a time before the oldest transaction open at %s",
		replication.ErrSlotLost, lost.Slot, lost.Reason, why, lost.Since.Format(time.RFC3339), t.created, lost.Since.Format(time.RFC3339))
}

// confirmedRecorder writes to the slot ledger the commit time and position of the last transaction
// Kafka acknowledged with every one before it: where a lost slot's gap would start. The relay runs
// it every confirmedEvery while it streams, and once more after a clean stop's drain.
type confirmedRecorder struct {
	tracker *checkpoint.Tracker
	rc      *replication.Config // the slot, and how to connect
	log     *zap.Logger
	ledger  replication.Ledger

	mu           sync.Mutex
	conn         *pgx.Conn
	recorded     time.Time
	recordedXmin uint64
	// samples are horizons taken on the server, oldest first, each with the WAL's insert
	// position just after it: one becomes the recorded horizon once the tracker's acknowledged
	// position reaches its LSN (every transaction below its xmin had written its commit record
	// before that LSN, so Kafka holds their events).
	samples []horizonSample
	warned  bool
	gaveUp  bool // no ledger, or not migrated, or no right to write it: until a restart
}

// horizonSample is a snapshot's xmin (a full transaction id) and the WAL's insert position read
// after the snapshot was taken, with the timeline the sampled server was on. A sample from
// another timeline than the stream's is never used: a promoted standby may assign again ids its
// old primary had used, and a superseded primary still running goes on assigning ids of its own.
type horizonSample struct {
	xmin     uint64
	lsn      pglogrepl.LSN
	timeline uint32
}

// maxHorizonSamples bounds the samples kept while Kafka acknowledges nothing: past it the newest
// is replaced, which only makes the recorded horizon older (more duplicates), never wrong.
const maxHorizonSamples = 64

// newConfirmedRecorder records how far tracker acknowledged for the slot of rc, connecting with
// rc's credentials.
func newConfirmedRecorder(tracker *checkpoint.Tracker, rc *replication.Config, log *zap.Logger) *confirmedRecorder {
	return &confirmedRecorder{tracker: tracker, rc: rc, log: log, ledger: replication.NewLedger(rc.Schema)}
}

// run records every confirmedEvery until ctx ends, beginning with a horizon sample at once.
func (c *confirmedRecorder) run(ctx context.Context) {
	c.write(ctx)
	tick := time.NewTicker(confirmedEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			c.write(ctx)
		}
	}
}

// write records the tracker's acknowledged point, and the newest horizon it passed, if either
// moved; then samples the horizon again.
func (c *confirmedRecorder) write(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gaveUp {
		return
	}
	timeline := c.tracker.Timeline() // before Safe, as the stream reads them
	at, safe := c.tracker.SafeTime(), c.tracker.Safe()
	xmin := c.passed(safe, timeline)
	moved := !at.IsZero() && at.After(c.recorded)
	if c.conn == nil {
		conn, err := c.rc.ConnectPrimary(ctx) // the ledger's writes: a standby refuses them
		if err != nil {
			c.log.Debug("record the acknowledged position: cannot connect", zap.Error(err))
			return
		}
		c.conn = conn
	}
	if !moved && xmin <= c.recordedXmin {
		c.sample(ctx) // nothing new to record
		return
	}
	err := c.ledger.RecordConfirmed(ctx, c.conn, c.rc.Slot, replication.Confirmed{CommitTime: at, EndLSN: safe, Xmin: xmin})
	if err == nil {
		if moved {
			c.recorded = at
		}
		c.recordedXmin = max(c.recordedXmin, xmin)
		c.sample(ctx)
		return
	}
	var pgErr *pgconn.PgError
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, replication.ErrLedgerNotMigrated) || errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42501"):
		c.log.Warn("cannot record in the slot ledger how far Kafka has acknowledged, so a lost slot could not be recovered automatically: run outbox-relay migrate, and grant the relay's role INSERT and UPDATE on the ledger", zap.Error(err))
		c.gaveUp = true
	case !c.warned:
		c.log.Warn("cannot record in the slot ledger how far Kafka has acknowledged (retrying); a lost slot's recovery would start from an older point, publishing more twice", zap.Error(err))
		c.warned = true
	}
	c.closeLocked(ctx)
}

// passed returns the xmin of the newest sample of timeline whose LSN safe has reached (0: none),
// forgetting the samples older than it and those of other timelines. Timeline 0 (no session
// has streamed yet) passes nothing and keeps every sample for the first session's timeline.
func (c *confirmedRecorder) passed(safe pglogrepl.LSN, timeline uint32) uint64 {
	if timeline == 0 {
		return 0
	}
	kept := c.samples[:0]
	for _, s := range c.samples {
		if s.timeline == timeline {
			kept = append(kept, s)
		}
	}
	c.samples = kept
	i := -1
	for j, s := range c.samples {
		if s.lsn <= safe {
			i = j
		}
	}
	if i < 0 {
		return 0
	}
	xmin := c.samples[i].xmin
	c.samples = c.samples[i+1:]
	return xmin
}

// sample takes a horizon on the server: the statement's snapshot is taken before it is executed,
// so the insert position is read after the snapshot. The server's timeline is the one its WAL
// is written on now (a WAL file name's first 8 hex digits): the tracker's could be another
// server's, the connection being the recorder's own (a first session not yet streaming, a
// failover the stream followed and this connection did not). A failure only delays the next
// recorded horizon; the connection is opened afresh at the next write.
func (c *confirmedRecorder) sample(ctx context.Context) {
	var xmin, lsn string
	var timeline int64
	if err := c.conn.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text, l::text, ('x' || substr(pg_walfile_name(l), 1, 8))::bit(32)::bigint
		FROM pg_current_wal_insert_lsn() AS l`).Scan(&xmin, &lsn, &timeline); err != nil {
		c.log.Debug("sample the transaction horizon for the slot ledger", zap.Error(err))
		c.closeLocked(ctx)
		return
	}
	x, err := strconv.ParseUint(xmin, 10, 64)
	if err != nil {
		return
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return
	}
	s := horizonSample{xmin: x, lsn: l, timeline: uint32(timeline)}
	if len(c.samples) == maxHorizonSamples {
		c.samples[len(c.samples)-1] = s
		return
	}
	c.samples = append(c.samples, s)
}

// close closes the recorder's connection, within ctx.
func (c *confirmedRecorder) close(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked(ctx)
}

func (c *confirmedRecorder) closeLocked(ctx context.Context) {
	if c.conn != nil {
		c.conn.Close(ctx)
		c.conn = nil
	}
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// KeepFrom is the creation time from which outbox rows must stay for a recovery of slot's gap (the
// ledger's last acknowledged commit, or the recovery under way, or the slot's creation, less the
// margin, else DefaultRecoveryMargin, and the commit skew): the guard on pruning. A transaction
// that ran longer than that and committed after the acknowledged point has rows older than it,
// which only KeepXmin keeps (docs/operations.md). ok is false when the ledger cannot say (no
// ledger, not migrated, no entry): pruning then goes by its age alone.
//
// strict (on_slot_lost: recover) makes a ledger the role may not read an error: pruning by age
// alone could then delete the gap a recovery would publish as whole.
func KeepFrom(ctx context.Context, q querier, schema, slot string, margin time.Duration, strict bool) (from time.Time, ok bool, err error) {
	ledger := replication.NewLedger(schema)
	if exists, err := ledger.Exists(ctx, q); err != nil || !exists {
		return time.Time{}, false, err
	}
	st, err := ledger.Recovery(ctx, q, slot)
	if strict && (errors.Is(err, replication.ErrLedgerNotMigrated) || denied(err)) {
		return time.Time{}, false, fmt.Errorf("on_slot_lost is recover, so pruning keeps what a lost slot's recovery needs, but it cannot read the slot ledger %s (run outbox-relay migrate; GRANT SELECT, UPDATE ON it to the pruning role): %w", ledger.Table(), err)
	}
	if errors.Is(err, replication.ErrLedgerNotMigrated) || denied(err) {
		return time.Time{}, false, nil // pruning's role may not read it: by age alone, as before
	}
	if err != nil {
		return time.Time{}, false, err
	}
	since := st.Since
	for _, t := range []time.Time{st.Confirmed.CommitTime, st.SlotCreated} {
		if since.IsZero() {
			since = t
		}
	}
	if since.IsZero() {
		return time.Time{}, false, nil
	}
	return since.Add(-commitSkew - keepMargin(margin)), true, nil
}

// KeepXmin is the horizon recorded with slot's last acknowledged commit: rows of transactions from
// it on may be a lost slot's gap whatever their age, so pruning keeps them. ok is false when the
// ledger cannot say (no ledger, not migrated, no entry, no horizon); strict is as for KeepFrom.
func KeepXmin(ctx context.Context, q querier, schema, slot string, strict bool) (xmin uint64, ok bool, err error) {
	ledger := replication.NewLedger(schema)
	if exists, err := ledger.Exists(ctx, q); err != nil || !exists {
		return 0, false, err
	}
	st, err := ledger.Recovery(ctx, q, slot)
	if strict && (errors.Is(err, replication.ErrLedgerNotMigrated) || denied(err)) {
		return 0, false, fmt.Errorf("on_slot_lost is recover, so pruning keeps what a lost slot's recovery needs, but it cannot read the slot ledger %s (run outbox-relay migrate; GRANT SELECT, UPDATE ON it to the pruning role): %w", ledger.Table(), err)
	}
	if errors.Is(err, replication.ErrLedgerNotMigrated) || denied(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return st.Confirmed.Xmin, st.Confirmed.Xmin != 0, nil
}

// RecordPruned notes in the slot ledger that pruning deleted rows created before before, so that a
// recovery knows whether its gap is whole. Without a ledger (or one not migrated) it does nothing.
func RecordPruned(ctx context.Context, q querier, schema, slot string, before time.Time, strict bool) error {
	ledger := replication.NewLedger(schema)
	if exists, err := ledger.Exists(ctx, q); err != nil || !exists {
		return err
	}
	err := ledger.RecordPruned(ctx, q, slot, before)
	if !strict && (errors.Is(err, replication.ErrLedgerNotMigrated) || denied(err)) {
		return nil
	}
	return err
}

// denied reports a PostgreSQL insufficient_privilege error.
func denied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}
