package relay

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// relation handles a Relation message of the stream: a relation not named like the outbox is
// classified by the replication side (which can ask the database) before the decoder goes on, so
// nothing is skipped as "another table" that may be part of the outbox; an outbox relation whose
// OID is not the table's the relay started with is reported, and one that lacks a mapped column
// is reported once here, its rows going to the failure policy.
func (w *walSource) relation(ctx context.Context, rel *decoder.RelationInfo) error {
	name := rel.Schema + "." + rel.Table
	unusable := rel.Unusable
	if !rel.Named {
		ours, err := w.stream.BelongsToOutbox(ctx, replication.RelationRef{OID: rel.OID, Schema: rel.Schema, Table: rel.Table, Columns: rel.Columns})
		if err != nil {
			return fmt.Errorf("relation %s in the replication stream: %w", name, err)
		}
		unusable = w.dec.Classify(rel.OID, ours)
		if !ours {
			return nil
		}
	} else if known := w.stream.OutboxOID(); known != 0 && rel.OID != known {
		// WAL written before the table was dropped and recreated (while no relay ran): its rows are
		// outbox events and are published; rows written to the new table before it joined the
		// publication are not in the stream at all.
		w.log.Error("the outbox table in the replication stream is not the table that exists now: it was dropped and recreated since these rows were written; they are published, but rows written to the new table before it was added to the publication are not in the stream: republish them (backfill_since)",
			zap.String("table", name), zap.Uint32("stream_oid", rel.OID), zap.Uint32("table_oid", known))
	}
	if unusable != nil {
		w.log.Error("outbox rows written under this table definition cannot be read; each goes to the failure policy as "+sink.ReasonSchemaMismatch,
			zap.String("relation", name), zap.Uint32("oid", rel.OID), zap.Error(unusable))
	}
	return nil
}

// reject returns a publish function that hands events to the failure policy for unusable: a row
// written while a mapped column was missing, or a message whose content is not an event.
func (w *walSource) reject(unusable error) func(context.Context, *decoder.Event, sink.Acker) error {
	reason := sink.ReasonSchemaMismatch
	switch {
	case errors.Is(unusable, decoder.ErrInvalidMessage):
		reason = sink.ReasonInvalidMessage
	case errors.Is(unusable, decoder.ErrInvalidTimestamp):
		reason = sink.ReasonInvalidTimestamp
	}
	return func(ctx context.Context, ev *decoder.Event, ack sink.Acker) error {
		return w.sink.Reject(ctx, ev, reason, unusable, ack)
	}
}
