package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// Consumer applies outbox events from Kafka exactly once, in each aggregate's version order, in
// the consumer's own database transactions:
//
//	c := &inbox.Consumer{DB: pool, Store: store, Registry: reg, OnGap: inbox.WaitOnGap}
//	for {
//		m, err := reader.FetchMessage(ctx)
//		...
//		if _, err := c.Handle(ctx, m); err != nil {
//			return err // not committed: redelivered after a restart
//		}
//		if err := reader.CommitMessages(ctx, m); err != nil { ... }
//	}
//
// For each record, Handle runs one transaction that locks the aggregate's row in the version
// table, compares the record's aggregate_version with the version applied, and:
//   - the next version: runs the Registry's handler, records the event id and the new version
//     (Applied, "new");
//   - an event applied before: does nothing (Duplicate);
//   - an older version not applied itself (the state was reloaded past it): does nothing (Stale);
//   - a later version, so some are missing: asks OnGap (Gap).
//
// Events without an aggregate_version header are told apart by their id only (new or duplicate).
// After the transaction commits, Handle performs the effects the handler recorded with
// Event.Intend (effects.go). Commit the record's offset only after Handle returned nil.
//
// Two consumers handling one aggregate at once (a rebalance in progress, two groups' instances
// sharing the tables under one Consumer name) take turns on the aggregate's row, and each sees
// what the other committed; under REPEATABLE READ or SERIALIZABLE the second may fail with a
// serialization error (SQLSTATE 40001) instead, which is safe to retry.
type Consumer struct {
	DB       DB
	Store    *Store
	Registry *Registry
	// OnGap decides what happens to an event that comes after a missing version. Default
	// WaitOnGap.
	OnGap GapPolicy
	// Effects performs the operations handlers record with Event.Intend, by effect name.
	Effects map[string]Effect

	counts [Gap + 1]atomic.Int64
}

// DB is what a Consumer needs of the database: *pgxpool.Pool satisfies it.
type DB interface {
	Beginner
	Execer
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Event is a delivery being applied: the handler's view, inside the consumer's transaction.
type Event struct {
	Delivery
	Tx pgx.Tx

	c       *Consumer
	intents []string // idempotency keys recorded by Intend in this transaction
}

// GapInfo describes a delivery that comes after missing versions: Applied+1 .. Version-1.
type GapInfo struct {
	Delivery
	Applied int64 // the version the consumer applied last (0: none)
}

// Missing returns the first and last missing version.
func (g GapInfo) Missing() (first, last int64) { return g.Applied + 1, g.Version - 1 }

// ReplayCommand is the command that publishes the missing versions again, and the ones after
// them, for an operator or an automation to run.
func (g GapInfo) ReplayCommand() string {
	return fmt.Sprintf("outbox-relay replay --aggregate-type %q --aggregate-id %q --from-version %d", g.AggregateType, g.AggregateID, g.Applied+1)
}

// GapDecision is a GapPolicy's answer; see WaitOnGap, ReloadOnGap and ReplayOnGap.
type GapDecision struct {
	skip     bool
	reloaded int64 // > 0: the state was reloaded up to this version
}

// GapPolicy decides, inside the consumer's transaction, what to do with a delivery that comes
// after missing versions.
type GapPolicy func(ctx context.Context, tx pgx.Tx, g GapInfo) (GapDecision, error)

// WaitOnGap leaves the delivery unapplied and makes Handle return a *GapError: do not commit the
// offset, and handle the same record again after a pause. Right when the missing versions can still
// arrive on their own: events of one aggregate routed to several topics or partitions (a topic per
// event type), or a replay already under way. Within one partition nothing comes to fill the gap
// before the record waiting for it, so pair it with a bounded number of attempts and an alert.
func WaitOnGap(context.Context, pgx.Tx, GapInfo) (GapDecision, error) { return GapDecision{}, nil }

// ReloadOnGap fills a gap by loading the aggregate's state from its owner (an API, a snapshot):
// load writes that state through tx and returns the aggregate version it reflects. The delivery is
// then judged against that version: applied if it is the next one, stale if the state covers it.
func ReloadOnGap(load func(ctx context.Context, tx pgx.Tx, g GapInfo) (version int64, err error)) GapPolicy {
	return func(ctx context.Context, tx pgx.Tx, g GapInfo) (GapDecision, error) {
		v, err := load(ctx, tx, g)
		if err != nil {
			return GapDecision{}, err
		}
		if v <= g.Applied {
			return GapDecision{}, fmt.Errorf("inbox: reloading %s/%s returned version %d, not past the applied %d", g.AggregateType, g.AggregateID, v, g.Applied)
		}
		return GapDecision{reloaded: v}, nil
	}
}

// ReplayOnGap asks for the missing versions again: request records the request (a row written
// through tx, an alert, a call to whatever runs g.ReplayCommand()), and the delivery is skipped
// without being applied or recorded, so Handle returns Gap and no error and its offset may be
// committed. The replay publishes the missing versions and the ones after them, this one
// included, and they are applied in order then.
func ReplayOnGap(request func(ctx context.Context, tx pgx.Tx, g GapInfo) error) GapPolicy {
	return func(ctx context.Context, tx pgx.Tx, g GapInfo) (GapDecision, error) {
		if err := request(ctx, tx, g); err != nil {
			return GapDecision{}, err
		}
		return GapDecision{skip: true}, nil
	}
}

// ErrGap is what a *GapError matches with errors.Is.
var ErrGap = errors.New("inbox: versions are missing before this event")

// GapError reports a delivery left waiting for missing versions (WaitOnGap).
type GapError struct{ GapInfo }

func (e *GapError) Error() string {
	first, last := e.Missing()
	return fmt.Sprintf("inbox: event %s of aggregate %s/%s has version %d but version %d was applied last: versions %d..%d are missing; it is not applied and its offset must not be committed (to ask for them: %s)",
		e.ID, e.AggregateType, e.AggregateID, e.Version, e.Applied, first, last, e.ReplayCommand())
}

func (e *GapError) Is(target error) bool { return target == ErrGap }

// Count returns how many deliveries Handle classified as o since the Consumer was made.
func (c *Consumer) Count(o Outcome) int64 {
	if o < Applied || o > Gap {
		return 0
	}
	return c.counts[o].Load()
}

// Handle applies the record m (see Consumer). On an error nothing of it is committed, apart from
// effect outcomes already recorded; commit m's offset only after a nil error.
func (c *Consumer) Handle(ctx context.Context, m kafka.Message) (Outcome, error) {
	d, err := ParseDelivery(m)
	if err != nil {
		return 0, err
	}
	return c.HandleDelivery(ctx, d)
}

// HandleDelivery is Handle for a record already parsed.
func (c *Consumer) HandleDelivery(ctx context.Context, d Delivery) (Outcome, error) {
	if c.DB == nil || c.Store == nil || c.Registry == nil {
		return 0, errors.New("inbox: Consumer needs DB, Store and Registry")
	}
	var outcome Outcome
	var fresh []string
	err := pgx.BeginFunc(ctx, c.DB, func(tx pgx.Tx) error {
		e := &Event{Delivery: d, Tx: tx, c: c}
		var err error
		outcome, err = c.classify(ctx, e)
		fresh = e.intents
		return err
	})
	if errors.Is(err, ErrGap) {
		c.counts[Gap].Add(1)
	}
	if err != nil {
		return outcome, err
	}
	c.counts[outcome].Add(1)
	if outcome == Applied || outcome == Duplicate {
		// A duplicate may be the redelivery of an event whose effects a crash left pending.
		if err := c.settle(ctx, d.ID, fresh); err != nil {
			return outcome, err
		}
	}
	return outcome, nil
}

// classify runs in the consumer's transaction.
func (c *Consumer) classify(ctx context.Context, e *Event) (Outcome, error) {
	s := c.Store
	if e.ID == "" {
		return 0, ErrNoEventID
	}
	if e.Version == 0 {
		return c.applyOnce(ctx, e)
	}
	// Locks the aggregate's row (creating it at version 0) and reads the version applied. Under
	// READ COMMITTED an upsert that waited for another transaction works on what that one
	// committed, so two consumers of one aggregate never both see the same version as last.
	var applied int64
	if err := e.Tx.QueryRow(ctx, `INSERT INTO `+s.versions+` AS v (consumer, aggregate_type, aggregate_id, version)
		VALUES ($1, $2, $3, 0)
		ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET version = v.version
		RETURNING version`, s.consumer, e.AggregateType, e.AggregateID).Scan(&applied); err != nil {
		return 0, fmt.Errorf("inbox: lock aggregate %s/%s in %s: %w", e.AggregateType, e.AggregateID, s.versions, err)
	}
	if e.Version > applied+1 {
		policy := c.OnGap
		if policy == nil {
			policy = WaitOnGap
		}
		g := GapInfo{Delivery: e.Delivery, Applied: applied}
		decision, err := policy(ctx, e.Tx, g)
		switch {
		case err != nil:
			return Gap, fmt.Errorf("inbox: gap policy for event %s of %s/%s: %w", e.ID, e.AggregateType, e.AggregateID, err)
		case decision.skip:
			return Gap, nil
		case decision.reloaded == 0:
			return Gap, &GapError{g}
		}
		applied = decision.reloaded
		if err := c.setVersion(ctx, e, applied); err != nil {
			return 0, err
		}
		if e.Version > applied+1 {
			return Gap, &GapError{GapInfo{Delivery: e.Delivery, Applied: applied}}
		}
	}
	if e.Version <= applied {
		var seen bool
		if err := e.Tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.table+` WHERE consumer = $1 AND event_id = $2)`,
			s.consumer, e.ID).Scan(&seen); err != nil {
			return 0, fmt.Errorf("inbox: look up event %s: %w", e.ID, err)
		}
		if seen {
			return Duplicate, nil
		}
		return Stale, nil
	}
	outcome, err := c.applyOnce(ctx, e)
	if err != nil {
		return 0, err
	}
	// Also after a Duplicate: an event applied by id before versions were tracked moves the
	// version on, or the next one would wait for it for ever.
	return outcome, c.setVersion(ctx, e, e.Version)
}

// applyOnce records the event id and, when it is new, runs its handler.
func (c *Consumer) applyOnce(ctx context.Context, e *Event) (Outcome, error) {
	tag, err := e.Tx.Exec(ctx, c.Store.insert, c.Store.consumer, e.ID)
	if err != nil {
		return 0, fmt.Errorf("inbox: record event %s: %w", e.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return Duplicate, nil
	}
	h, err := c.Registry.resolve(&e.Delivery)
	if err != nil {
		return 0, err
	}
	if err := h(ctx, e); err != nil {
		return 0, fmt.Errorf("inbox: handle event %s (%s v%d of %s/%s): %w", e.ID, e.EventType, e.SchemaVersion, e.AggregateType, e.AggregateID, err)
	}
	return Applied, nil
}

func (c *Consumer) setVersion(ctx context.Context, e *Event, v int64) error {
	s := c.Store
	if _, err := e.Tx.Exec(ctx, `UPDATE `+s.versions+` SET version = $4, updated_at = now()
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
		s.consumer, e.AggregateType, e.AggregateID, v); err != nil {
		return fmt.Errorf("inbox: record version %d of %s/%s: %w", v, e.AggregateType, e.AggregateID, err)
	}
	return nil
}

// AppliedVersion returns the version of an aggregate the consumer applied last (0: none).
func (s *Store) AppliedVersion(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, aggregateType, aggregateID string) (int64, error) {
	var v int64
	err := db.QueryRow(ctx, `SELECT coalesce((SELECT version FROM `+s.versions+`
		WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3), 0)`, s.consumer, aggregateType, aggregateID).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("inbox: read the version of %s/%s: %w", aggregateType, aggregateID, err)
	}
	return v, nil
}
