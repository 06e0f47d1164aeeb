package sink

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/sink/positions"
)

// Position is how far the events committed in Kafka reach, in WAL stream order
// (positions.Position: the positions topic and its encoding live in package positions).
type Position = positions.Position

// ReadPosition returns the last committed position for cfg.Transactions.ID (read_committed);
// ok is false when none was ever committed. It creates the positions topic (compacted) when it is
// missing. It reads backwards from the partition's last stable offset in chunks, so a long-lived
// partition is not scanned from its start.
//
// A relay must read its position only after its sink has fenced earlier producers (WaitReady, or
// Sink.ReadPosition): a paused old producer could otherwise still commit after the read.
func ReadPosition(ctx context.Context, cfg Config) (pos Position, ok bool, err error) {
	cfg.setDefaults()
	if cfg.Transactions == nil {
		return Position{}, false, errors.New("sink: ReadPosition needs exactly-once delivery (Config.Transactions)")
	}
	if len(cfg.Brokers) == 0 {
		return Position{}, false, errors.New("sink: no Kafka brokers configured")
	}
	client, transport := NewClient(cfg, cfg.WriteTimeout)
	defer transport.CloseIdleConnections()
	pos, _, ok, err = positions.Read(ctx, client, cfg.Transactions.PositionsTopic, cfg.Transactions.ID,
		positions.StableWait(cfg.Transactions.Timeout), zap.NewNop())
	return pos, ok, err
}

// ReadPosition is the package's ReadPosition for this sink's transactional id, after fencing
// every earlier producer with it (InitProducerID): nothing can commit past the position returned.
// It also settles what a lost commit marker left behind (markers.go): this producer's records left
// open are committed, and a position whose records were discarded is returned as the zero
// position, which skips nothing.
func (s *Sink) ReadPosition(ctx context.Context) (Position, bool, error) {
	if s.txn == nil {
		return Position{}, false, errors.New("sink: ReadPosition needs exactly-once delivery (Config.Transactions)")
	}
	if _, err := s.ident.Get(ctx); err != nil {
		return Position{}, false, err
	}
	// What an earlier producer left is settled once, before this sink's first transaction: later
	// reads (the relay reads again after each reconnect to PostgreSQL) come while this sink's own
	// transactions may be open, which an empty commit would commit half-written.
	settle := !s.txn.settled.Load()
	if settle {
		// A commit marker lost at the positions partition leaves the last position open there,
		// and the read below would wait for it.
		if err := s.txn.commitOwnOpen(ctx); err != nil {
			return Position{}, false, fmt.Errorf("sink: commit what this producer left open in the positions topic: %w", err)
		}
	}
	pos, written, found, err := positions.Read(ctx, s.client, s.cfg.Transactions.PositionsTopic, s.cfg.Transactions.ID, s.txn.stableWait, s.log)
	if err != nil || !settle {
		return pos, found, err
	}
	trusted := true
	if found {
		if trusted, err = s.txn.c.Settle(ctx, written); err != nil {
			return Position{}, false, fmt.Errorf("sink: check the Kafka transaction of the committed position: %w", err)
		}
	}
	s.txn.settled.Store(true)
	if !trusted {
		// Found, but covering events Kafka does not hold: the zero position skips nothing.
		return Position{}, true, nil
	}
	return pos, found, nil
}

// Committed returns the position of the last Kafka transaction this sink committed; ok is false
// before the first one (and in at-least-once mode).
func (s *Sink) Committed() (pos Position, ok bool) {
	if s.txn == nil {
		return Position{}, false
	}
	return s.txn.committed()
}
