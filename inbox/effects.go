package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Effects outside the database (an e-mail, a card charge, a call to another service) cannot
// commit with the consumer's transaction. A handler records the intent instead (Event.Intend): a
// pending row in the operation table, committed with the business change. After the commit,
// Consumer.Handle performs it with an idempotency key derived from the event id and records the
// outcome; only then may the offset be committed. If the consumer dies in between, the row is
// still pending when the event is redelivered (a Duplicate) or when ResumePending runs at the
// next start: the operation is then reconciled, Effect.Reconcile asking the provider whether the
// operation with that key happened, and performed only if it did not. With a provider that honours
// idempotency keys, even a wrong "no" from Reconcile costs no second effect.

// Operation is one recorded effect.
type Operation struct {
	Key     string          // the idempotency key: the same for every attempt at this operation
	EventID string          // the event whose handler recorded it
	Effect  string          // the effect's name in Consumer.Effects
	Request json.RawMessage // what Event.Intend was given, as JSON
}

// Effect performs one kind of operation outside the database.
type Effect struct {
	// Perform does the operation, passing op.Key to the provider as its idempotency key, and
	// returns an outcome to record (a provider's id, a receipt). An error leaves the operation
	// pending: Handle returns it and the offset must not be committed.
	Perform func(ctx context.Context, op Operation) (outcome string, err error)
	// Reconcile asks the provider whether the operation with op.Key happened: if it did (done),
	// its outcome is recorded and Perform is not called. Called for an operation found pending
	// from an earlier attempt, never for one recorded in the same Handle call.
	Reconcile func(ctx context.Context, op Operation) (outcome string, done bool, err error)
}

// IdempotencyKey derives an operation's key from the consumer, the event id and the effect: the
// same for every delivery of the event, distinct for each consumer and effect. 32 hex digits, which
// providers' key formats accept.
func IdempotencyKey(consumer, eventID, effect string) string {
	h := sha256.Sum256([]byte(consumer + "\x00" + eventID + "\x00" + effect))
	return hex.EncodeToString(h[:16])
}

// Intend records that the effect named effect must happen for this event, with request (encoded
// as JSON; nil for none) for Perform, in the consumer's transaction. Once per effect and event: a
// second Intend of the same effect is a no-op. It returns the operation's idempotency key.
func (e *Event) Intend(ctx context.Context, effect string, request any) (string, error) {
	if e.c == nil {
		return "", errors.New("inbox: Intend is for events handed to a Consumer's handlers")
	}
	if _, ok := e.c.Effects[effect]; !ok {
		return "", fmt.Errorf("inbox: event %s: effect %q is not in Consumer.Effects", e.ID, effect)
	}
	var req []byte
	if request != nil {
		var err error
		if req, err = json.Marshal(request); err != nil {
			return "", fmt.Errorf("inbox: event %s: encode the request of effect %q: %w", e.ID, effect, err)
		}
	}
	s := e.c.Store
	key := IdempotencyKey(s.consumer, e.ID, effect)
	tag, err := e.Tx.Exec(ctx, `INSERT INTO `+s.ops+` (consumer, idempotency_key, event_id, effect, request)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, s.consumer, key, e.ID, effect, req)
	if err != nil {
		return "", fmt.Errorf("inbox: event %s: record effect %q: %w", e.ID, effect, err)
	}
	if tag.RowsAffected() > 0 {
		e.intents = append(e.intents, key)
	}
	return key, nil
}

// settle performs or reconciles the pending operations of one event: performs those recorded in
// this Handle call (fresh), reconciles the others.
func (c *Consumer) settle(ctx context.Context, eventID string, fresh []string) error {
	s := c.Store
	rows, err := c.DB.Query(ctx, `SELECT idempotency_key, event_id, effect, request FROM `+s.ops+`
		WHERE consumer = $1 AND event_id = $2 AND state = 'pending' ORDER BY created_at, idempotency_key`, s.consumer, eventID)
	if err != nil {
		return fmt.Errorf("inbox: read the pending operations of event %s: %w", eventID, err)
	}
	ops, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Operation])
	if err != nil {
		return fmt.Errorf("inbox: read the pending operations of event %s: %w", eventID, err)
	}
	for _, op := range ops {
		if err := c.run(ctx, op, slices.Contains(fresh, op.Key)); err != nil {
			return err
		}
	}
	return nil
}

// ResumePending settles every operation of this consumer still pending, reconciling each with its
// provider: run it at start, for operations whose events will not be delivered again (their
// offsets were committed by a consumer that did not wait for Handle, or the topic's retention
// passed). Operations another instance is settling at the moment are left to it. It returns how
// many it settled.
func (c *Consumer) ResumePending(ctx context.Context) (int, error) {
	s := c.Store
	rows, err := c.DB.Query(ctx, `SELECT idempotency_key, event_id, effect, request FROM `+s.ops+`
		WHERE consumer = $1 AND state = 'pending' ORDER BY created_at, idempotency_key`, s.consumer)
	if err != nil {
		return 0, fmt.Errorf("inbox: read the pending operations: %w", err)
	}
	ops, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Operation])
	if err != nil {
		return 0, fmt.Errorf("inbox: read the pending operations: %w", err)
	}
	settled := 0
	for _, op := range ops {
		err := c.run(ctx, op, false)
		if errors.Is(err, ErrInProgress) {
			continue // another instance is settling it
		}
		if err != nil {
			return settled, err
		}
		settled++
	}
	return settled, nil
}

// ErrInProgress is returned for an operation another consumer instance is performing or
// reconciling at the moment: the record's offset must not be committed yet; handle it again later
// (it is then a duplicate with nothing pending).
var ErrInProgress = errors.New("inbox: the operation is being settled by another consumer instance")

// run performs op (fresh) or reconciles it, and records the outcome. It holds the operation's row
// locked meanwhile (a transaction open across the provider call), so two instances (one resuming
// at its start, one handling a redelivery after a rebalance) never ask the provider and perform
// the same operation at once: the second gets ErrInProgress.
func (c *Consumer) run(ctx context.Context, op Operation, fresh bool) error {
	eff, ok := c.Effects[op.Effect]
	if !ok || eff.Perform == nil {
		return fmt.Errorf("inbox: operation %s of event %s: effect %q has no Perform in Consumer.Effects", op.Key, op.EventID, op.Effect)
	}
	s := c.Store
	return pgx.BeginFunc(ctx, c.DB, func(tx pgx.Tx) error {
		var state string
		err := tx.QueryRow(ctx, `SELECT state FROM `+s.ops+` WHERE consumer = $1 AND idempotency_key = $2 FOR UPDATE SKIP LOCKED`,
			s.consumer, op.Key).Scan(&state)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: operation %s (%s) of event %s", ErrInProgress, op.Key, op.Effect, op.EventID)
		case err != nil:
			return fmt.Errorf("inbox: lock operation %s (%s) of event %s: %w", op.Key, op.Effect, op.EventID, err)
		case state == "done":
			return nil // settled by another instance since it was read
		}
		var outcome string
		done := false
		if !fresh {
			if eff.Reconcile == nil {
				return fmt.Errorf("inbox: operation %s of event %s is pending from an earlier attempt and effect %q has no Reconcile to ask whether it happened", op.Key, op.EventID, op.Effect)
			}
			if outcome, done, err = eff.Reconcile(ctx, op); err != nil {
				return fmt.Errorf("inbox: reconcile operation %s (%s) of event %s: %w", op.Key, op.Effect, op.EventID, err)
			}
		}
		if !done {
			if outcome, err = eff.Perform(ctx, op); err != nil {
				return fmt.Errorf("inbox: perform operation %s (%s) of event %s: %w", op.Key, op.Effect, op.EventID, err)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE `+s.ops+` SET state = 'done', outcome = $3, settled_at = now()
			WHERE consumer = $1 AND idempotency_key = $2`, s.consumer, op.Key, outcome); err != nil {
			return fmt.Errorf("inbox: record the outcome of operation %s (%s) of event %s: %w", op.Key, op.Effect, op.EventID, err)
		}
		return nil
	})
}
