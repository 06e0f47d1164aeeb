package relay

// Exactly-once delivery, the relay's half (the sink's transactional producer is the Kafka half).
//
// The position that matters is the one committed in Kafka: every Kafka transaction also writes, to
// the positions topic, how far in the stream its events reach. The slot's confirmed position only
// trails it (the sink acknowledges an event once its Kafka transaction has committed), so after a
// crash PostgreSQL replays transactions that Kafka already holds. At every session the relay reads
// the committed position and gives it to the tracker as a floor: what it covers is acknowledged
// without being published, and the slot moves past it.
//
// Order matters at a start: the sink's InitProducerID (in WaitReady, after the checks found the
// slot free, never in Prestart, and before the first session)
// fences every earlier producer with the transactional id and ends its open transaction, so the
// position read afterwards cannot move any more except by this relay's own commits.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// ErrSuperseded is what Run returns when Kafka fenced the relay's transactional producer: another
// producer with the same transactional id has started (a new leader took over while this one was
// paused, or another relay is configured with the same transactional_id). The relay stopped at
// once; nothing it had not committed is visible to read_committed consumers.
var ErrSuperseded = errors.New("fenced by Kafka: another producer with the same transactional id took over")

// ErrRestart is what Run returns when a Kafka transaction was aborted (the broker timed it out or
// refused to commit it): the relay stopped at once, confirming nothing of it, and a new Relay
// resumes from the position committed in Kafka, publishing what the aborted transaction held again.
var ErrRestart = errors.New("a Kafka transaction was aborted; the relay must start afresh")

func (w *walSource) exactlyOnce() bool { return w.cfg.Sink.Transactions != nil }

// transactionsHintAfter is how long a start waits for Kafka's transaction coordinator before it
// says, at ERROR, what usually keeps it away.
const transactionsHintAfter = 30 * time.Second

// transactionsHint is logged when the sink has not become ready within transactionsHintAfter. The
// sink logs each retry with Kafka's error; what it cannot say is the usual cause: a coordinator
// that never becomes available because the transaction state topic cannot be created or led.
func (w *walSource) transactionsHint() {
	w.log.Error("exactly-once: Kafka has not given the relay a transactional producer for "+transactionsHintAfter.String()+"; nothing is published until it does, and the relay never falls back to at-least-once. "+
		"If the retries logged above say COORDINATOR_NOT_AVAILABLE (or NOT_COORDINATOR), the brokers' transaction coordinator is not available: its topic __transaction_state needs transaction.state.log.replication.factor and transaction.state.log.min.isr no higher than the number of brokers running (both 1 on a single broker), see docs/operations.md; "+
		"if they say the positions topic is not available, the relay's principal needs Describe, Read and Write on positions_topic (and Create, to create it); "+
		"if they say the brokers are unreachable, see kafka_brokers",
		zap.String("transactional_id", w.cfg.Sink.Transactions.ID), zap.Strings("kafka_brokers", w.cfg.Sink.Brokers))
}

// sinkFailed turns the sink's terminal error into what Run returns: fenced, aborted (a fresh start
// fixes it), or anything else (an unauthorized transactional id, brokers without transactions),
// which only an operator fixes.
func sinkFailed(err error) error {
	switch {
	case errors.Is(err, sink.ErrFenced):
		return fmt.Errorf("%w: %w", ErrSuperseded, err)
	case errors.Is(err, sink.ErrAborted):
		return fmt.Errorf("%w: %w", ErrRestart, err)
	}
	return replication.Fatal(err)
}

// takeUpPosition runs at the start of every replication session with exactly-once delivery, before
// any event of it is handled: it reads the position committed in Kafka and makes the part of it
// that belongs to the session's server (origin.go) the tracker's floor. On the relay's first
// session it also checks the position against the slot ledger.
//
// Every session decides afresh, by the position's recorded origin and the server's timeline
// history: after a failover while streaming, the tracker forgot the old timeline's floor (Reset),
// and the position read now may still be the old timeline's; a new Relay (a leader's next term,
// ErrRestart, a new process) knows nothing of the failover at all.
func (w *walSource) takeUpPosition(ctx context.Context, session replication.Message) error {
	var pos sink.Position
	var found bool
	if start := w.startPosition; start != nil {
		// Read before this session started streaming (startingPosition).
		pos, found, w.startPosition = start.pos, start.found, nil
	} else {
		var err error
		if pos, found, err = w.readPosition(ctx); err != nil {
			return err
		}
		if !w.positionChecked {
			if err := w.checkPositionLedger(ctx, found); err != nil {
				return err
			}
			w.positionChecked = true
		}
	}
	if !found {
		if !w.positionLogged {
			w.positionLogged = true
			w.log.Info("exactly-once: no position committed in Kafka yet for this transactional id; publishing from the slot's confirmed position",
				zap.String("transactional_id", w.cfg.Sink.Transactions.ID), zap.Stringer("slot_confirmed", session.WALEnd))
		}
		return nil
	}
	use, ok, err := w.positionOnServer(ctx, pos, session)
	if err != nil || !ok {
		return err
	}
	if session.ServerEnd != 0 && use.CommitLSN > session.ServerEnd {
		// No transaction this server committed lies beyond its end of WAL: the position was not
		// reached here (forged, or a data directory restored from before it). Skipping by it
		// would drop every event up to it for good; skipping nothing publishes again, at most,
		// what Kafka already holds past the slot's confirmed position.
		w.log.Error("exactly-once: the position committed in Kafka lies beyond the server's end of WAL, so no transaction of this server reached it; it skips nothing here (events after the slot's confirmed position may be published again). "+
			"If the server was not restored from a backup, someone else wrote the position: check who may write to positions_topic",
			zap.String("transactional_id", w.cfg.Sink.Transactions.ID), zap.Stringer("commit_lsn", use.CommitLSN),
			zap.Stringer("server_wal_end", session.ServerEnd), zap.Stringer("slot_confirmed", session.WALEnd))
		return nil
	}
	w.tracker.Cover(use.CommitLSN, use.Events)
	level := zap.DebugLevel
	if !w.positionLogged {
		w.positionLogged, level = true, zap.InfoLevel
	}
	w.log.Check(level, "exactly-once: resuming after the position committed in Kafka; PostgreSQL replays from the slot's confirmed position and what the position covers is not published again").Write(
		zap.String("transactional_id", w.cfg.Sink.Transactions.ID), zap.Stringer("commit_lsn", pos.CommitLSN),
		zap.Int("events_of_that_transaction", pos.Events), zap.Stringer("slot_confirmed", session.WALEnd))
	return nil
}

// positionRead is a position read before streaming started, for the session's start.
type positionRead struct {
	pos   sink.Position
	found bool
}

// startingPosition reads the committed position and checks it against the slot ledger before the
// first session starts streaming (BeforeStream, after the sink fenced earlier producers), so a
// position that cannot be read, or was lost, stops the relay before PostgreSQL sends anything.
// The session's start then takes it up (takeUpPosition); later sessions read it again.
func (w *walSource) startingPosition(ctx context.Context) error {
	pos, found, err := w.readPosition(ctx)
	if err != nil {
		return err
	}
	if err := w.checkPositionLedger(ctx, found); err != nil {
		return err
	}
	w.positionChecked = true
	w.startPosition = &positionRead{pos: pos, found: found}
	return nil
}

// readPosition reads the committed position, retrying what may heal (a broker restarting, a
// coordinator moving) until ctx ends. An authorization failure, or a broker that cannot serve the
// request, ends the relay with an error that says what to fix: never a fallback to publishing from
// the slot's position, which would repeat what Kafka holds.
func (w *walSource) readPosition(ctx context.Context) (sink.Position, bool, error) {
	topic := w.cfg.Sink.Transactions.PositionsTopic
	if topic == "" {
		topic = sink.DefaultPositionsTopic
	}
	for attempt := 0; ; attempt++ {
		pos, found, err := w.positions(ctx)
		if err == nil {
			return pos, found, nil
		}
		if ctx.Err() != nil {
			return sink.Position{}, false, ctx.Err()
		}
		if positionErrorIsPermanent(err) {
			return sink.Position{}, false, replication.Fatal(fmt.Errorf("exactly-once: cannot read the committed position from positions_topic %q with transactional id %q: %w. The relay's Kafka principal needs Read and Describe on the topic (and Create on the cluster or topic to create it), Write and Describe on the transactional id, and the brokers must support transactions (Kafka 0.11 or later, with the transaction state topic available); see docs/operations.md",
				topic, w.cfg.Sink.Transactions.ID, err))
		}
		delay := backoffPosition(attempt)
		w.log.Warn("exactly-once: cannot read the committed position yet; retrying (nothing is published until it is known)",
			zap.String("positions_topic", topic), zap.Error(err), zap.Duration("retry_in", delay))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return sink.Position{}, false, ctx.Err()
		}
	}
}

func backoffPosition(attempt int) time.Duration {
	return min(250*time.Millisecond<<min(attempt, 5), 5*time.Second)
}

// positionErrorIsPermanent lists the errors retrying cannot fix: an allow-list, so anything
// unexpected is retried (and logged) rather than ending the relay.
func positionErrorIsPermanent(err error) bool {
	for _, e := range []error{
		kafka.TopicAuthorizationFailed, kafka.GroupAuthorizationFailed, kafka.ClusterAuthorizationFailed,
		kafka.TransactionalIDAuthorizationFailed, kafka.SASLAuthenticationFailed, kafka.UnsupportedVersion,
		kafka.InvalidTopic, kafka.UnsupportedForMessageFormat,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return replication.IsFatal(err)
}

// checkPositionLedger compares what Kafka holds with what the slot ledger remembers. The ledger
// records that a position was committed for the slot; a start that then finds none was not a
// first start: the positions topic was deleted or recreated, or its record removed by retention.
// Publishing from the slot's confirmed position would publish again what Kafka committed after it,
// so the relay refuses and says how to go on.
func (w *walSource) checkPositionLedger(ctx context.Context, found bool) error {
	rc := w.cfg.Replication
	txn := w.cfg.Sink.Transactions
	conn, err := connect(ctx, &rc)
	if err != nil {
		return fmt.Errorf("exactly-once: connect to read the slot ledger: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ledger := replication.NewLedger(rc.Schema)
	if exists, err := ledger.Exists(ctx, conn); err != nil {
		return fmt.Errorf("exactly-once: look for the slot ledger: %w", err)
	} else if !exists {
		return replication.Fatal(fmt.Errorf("delivery: exactly-once needs the slot ledger table %s, where it records that positions were committed in Kafka (so a lost positions topic is noticed): run outbox-relay migrate", ledger.Table()))
	}
	rec, marked, err := ledger.Positions(ctx, conn, rc.Slot)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.Is(err, replication.ErrLedgerNotMigrated) || errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return replication.Fatal(fmt.Errorf("delivery: exactly-once: %w (the relay's role needs SELECT, INSERT and UPDATE on %s)", err, ledger.Table()))
		}
		return fmt.Errorf("exactly-once: %w", err)
	}
	switch {
	case marked && !found:
		return replication.Fatal(fmt.Errorf("exactly-once: positions_topic %q holds no position for transactional id %q, but a position was committed for slot %q under transactional id %q in topic %q (recorded in %s since %s). The topic was deleted or recreated, or its record removed (it must keep cleanup.policy=compact, without retention.ms deletion), or transactional_id or positions_topic were changed. Nothing is lost, but starting from the slot's confirmed position would publish again the events Kafka committed after it. If the settings changed, change them back. Otherwise, to go on and accept those duplicates once: make sure the topic exists (compacted), run UPDATE %s SET kafka_transactional_id = NULL WHERE slot = %s, and restart",
			positionsTopic(txn), txn.ID, rc.Slot, rec.TransactionalID, rec.PositionsTopic, ledger.Table(), rec.Since.Format(time.RFC3339),
			ledger.Table(), quoteLiteral(rc.Slot)))
	case found && (!marked || rec.TransactionalID != txn.ID || rec.PositionsTopic != positionsTopic(txn)):
		if err := ledger.RecordPositions(ctx, conn, rc.Slot, txn.ID, positionsTopic(txn)); err != nil {
			return fmt.Errorf("exactly-once: record the position in %s (the relay's role needs INSERT and UPDATE on it): %w", ledger.Table(), err)
		}
	case !found:
		w.recordFirstPosition.Store(true) // once the first Kafka transaction has committed (recordPositions)
	}
	return nil
}

// connect opens a plain connection with the replication settings' credentials, to the primary
// (the slot ledger's positions are written there: a standby refuses the writes).
func connect(ctx context.Context, rc *replication.Config) (*pgx.Conn, error) {
	return rc.ConnectPrimary(ctx)
}

// recordPositions notes in the slot ledger, once the first Kafka transaction of a first
// exactly-once start has committed, that positions exist now: from then on a start that finds
// none refuses (checkPositionLedger). A failure is logged and retried at the next start.
func (w *walSource) recordPositions(ctx context.Context) {
	select {
	case <-w.tracker.Acknowledged():
	case <-ctx.Done():
		return
	}
	if !w.recordFirstPosition.Load() {
		return // a position was found at the start, and the ledger checked and updated then
	}
	rc := w.cfg.Replication
	txn := w.cfg.Sink.Transactions
	ledger := replication.NewLedger(rc.Schema)
	err := func() error {
		conn, err := connect(ctx, &rc)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		return ledger.RecordPositions(ctx, conn, rc.Slot, txn.ID, positionsTopic(txn))
	}()
	if err != nil && ctx.Err() == nil {
		w.log.Error("exactly-once: cannot record in the slot ledger that positions were committed in Kafka; until it is recorded, a lost positions topic would go unnoticed (the next start tries again)",
			zap.String("table", ledger.Table()), zap.Error(err))
		return
	}
	if err == nil {
		w.log.Info("exactly-once: the first Kafka transaction committed; recorded in the slot ledger that this slot's position lives in Kafka",
			zap.String("transactional_id", txn.ID), zap.String("positions_topic", positionsTopic(txn)))
	}
}

func positionsTopic(t *sink.Transactions) string {
	if t.PositionsTopic == "" {
		return sink.DefaultPositionsTopic
	}
	return t.PositionsTopic
}

// TransactionalID is the default transactional id of a relay streaming slot: the database cluster's
// system identifier (the same on a primary and its physical standbys, so it survives a failover)
// and the slot name. It asks the server with IDENTIFY_SYSTEM, which every role that may stream a
// slot may run, retrying until ctx ends while PostgreSQL is unreachable; refused credentials end it.
// conn is the relay's connection configuration (credentials and TLS applied); it is not changed.
func TransactionalID(ctx context.Context, conn *pgconn.Config, slot string, log *zap.Logger) (string, error) {
	for attempt := 0; ; attempt++ {
		id, err := identify(ctx, conn)
		if err == nil {
			return "outbox-relay-" + id + "-" + slot, nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000" || pgErr.Code[:2] == "42") {
			return "", fmt.Errorf("read the database's system identifier for the default transactional_id: %w", err)
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		delay := backoffPosition(attempt)
		log.Warn("cannot read the database's system identifier for the default transactional_id yet; retrying",
			zap.Error(err), zap.Duration("retry_in", delay))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

func identify(ctx context.Context, cfg *pgconn.Config) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	id, err := replication.IdentifySystem(cctx, cfg)
	return id.SystemID, err
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
