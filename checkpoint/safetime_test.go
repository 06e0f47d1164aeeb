package checkpoint_test

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// SafeTime is where a lost slot's recovery starts reading the outbox table: it must never name a
// transaction that is not acknowledged together with every one before it, or recovery would skip
// it.
func TestTrackerSafeTimeIsTheLatestCommitTimeOfWhatIsAcknowledgedInOrder(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type txn struct {
		commitLSN uint64
		at        time.Time
		acked     bool
	}
	tests := []struct {
		name string
		txns []txn
		want time.Time
	}{
		{"nothing acknowledged", []txn{{100, at(1), false}}, time.Time{}},
		{"the head acknowledged", []txn{{100, at(1), true}, {200, at(2), false}}, at(1)},
		{"a later one done behind an unacknowledged head counts for nothing",
			[]txn{{100, at(1), false}, {200, at(2), true}, {300, at(3), true}}, time.Time{}},
		{"all acknowledged", []txn{{100, at(1), true}, {200, at(2), true}, {300, at(3), true}}, at(3)},
		{"an earlier clock later in the stream does not move it back",
			[]txn{{100, at(5), true}, {200, at(4), true}}, at(5)},
		{"folded transactions carry their time to the head once it is acknowledged",
			[]txn{{100, at(1), true}, {200, at(2), true}, {300, at(9), true}}, at(9)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := checkpoint.New(0)
			var open []*checkpoint.Txn
			for _, x := range tt.txns {
				tx := tr.BeginAt(pglogrepl.LSN(x.commitLSN), x.at)
				tx.Add()
				tr.Commit(tx, pglogrepl.LSN(x.commitLSN+10))
				open = append(open, tx)
			}
			// Acknowledge from the last to the first, so every later one is done before the head.
			for i := len(open) - 1; i >= 0; i-- {
				if tt.txns[i].acked {
					open[i].Ack(1)
				}
			}
			if got := tr.SafeTime(); !got.Equal(tt.want) {
				t.Errorf("SafeTime = %v, want %v", got, tt.want)
			}
		})
	}
}
