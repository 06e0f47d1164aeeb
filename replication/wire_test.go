package replication

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
)

// ownerOf is a wireOwner whose answers a test sets: the wire loop alone, without a Stream.
type ownerOf struct {
	halt      error
	position  pglogrepl.LSN
	confirmed []pglogrepl.LSN
}

func (o *ownerOf) serverStopping() error          { return nil }
func (o *ownerOf) beforeStatus() error            { return o.halt }
func (o *ownerOf) confirmable() pglogrepl.LSN     { return o.position }
func (o *ownerOf) confirming(flush pglogrepl.LSN) { o.confirmed = append(o.confirmed, flush) }
func (o *ownerOf) streamError(err error) error    { return err }

// TestTheWireLoopAsksTheLayerAboveBeforeEachStatusUpdate: the wire loop decides nothing about
// the slot. A status update that the layer above halts (a failed publication check, the server
// stopping) ends the session unsent; one with nothing confirmable yet sends nothing, and only
// moves the next update's time. Neither touches the connection (there is none here).
func TestTheWireLoopAsksTheLayerAboveBeforeEachStatusUpdate(t *testing.T) {
	halted := errors.New("the publication check failed")
	tests := []struct {
		name  string
		owner ownerOf
		want  error
	}{
		{"a halt from above ends the session without an update", ownerOf{halt: halted, position: 10}, halted},
		{"nothing confirmable yet: no update, no error", ownerOf{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &wire{above: &tt.owner, log: zap.NewNop(), interval: time.Second}
			before := time.Now()
			if err := w.sendStatus(context.Background(), false); !errors.Is(err, tt.want) {
				t.Fatalf("sendStatus = %v, want %v", err, tt.want)
			}
			if len(tt.owner.confirmed) != 0 || w.reported != 0 {
				t.Fatalf("a position was confirmed (%v, reported %s) although none was sendable", tt.owner.confirmed, w.reported)
			}
			if tt.want == nil && w.nextStatus.Before(before.Add(w.interval)) {
				t.Fatalf("the next update is due at %s, want an interval from now", w.nextStatus.Sub(before))
			}
		})
	}
}
