package replication

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
)

func TestTransactionIDsAreOrderedModulo2To32AndReadFromBegin(t *testing.T) {
	for _, tt := range []struct {
		a, b uint32
		want bool
	}{{2, 1, true}, {1, 2, false}, {5, 5, false}, {3, 0xfffffff0, true}, {0xfffffff0, 3, false}} {
		if got := xidAfter(tt.a, tt.b); got != tt.want {
			t.Errorf("xidAfter(%d, %d) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
	begin := make([]byte, 21)
	begin[0] = 'B'
	binary.BigEndian.PutUint32(begin[17:], 4242)
	if xid, ok := beginXid(begin); !ok || xid != 4242 {
		t.Fatalf("beginXid = %d, %v; want 4242", xid, ok)
	}
	if _, ok := beginXid(append([]byte{'C'}, begin[1:]...)); ok {
		t.Fatal("a Commit message read as a Begin")
	}
}

// A slot confirmed beyond what the process confirmed is someone else's doing only when nobody else
// can have streamed it: the same term, or the ledger naming this process. Another relay named by
// the ledger is a takeover; a ledger that cannot say is a warning, since a takeover is possible.
func TestASlotAheadOfWhatTheProcessConfirmedStopsOnlyWhenNobodyElseStreamedIt(t *testing.T) {
	id := Identity{SystemID: "1", Timeline: 1}
	mem := NewMemory()
	mem.note("s", id, true, 0x2000, 0x1000, 0, false)
	for _, tt := range []struct {
		name     string
		streamed bool
		check    slotCheck
		fatal    bool
	}{
		{"the same term", true, slotCheck{confirmed: 0x1800, walEnd: 0x3000}, true},
		{"a later term the ledger says this process streamed last", false, slotCheck{confirmed: 0x1800, walEnd: 0x3000, holder: mem.token, holderOK: true}, true},
		{"a later term after another relay streamed it", false, slotCheck{confirmed: 0x1800, walEnd: 0x3000, holder: "other", holderOK: true}, false},
		{"a later term without a ledger to ask", false, slotCheck{confirmed: 0x1800, walEnd: 0x3000}, false},
		{"a slot behind what was confirmed (a crash)", true, slotCheck{confirmed: 0x0800, walEnd: 0x3000}, false},
		{"a slot beyond the server's end of WAL", false, slotCheck{confirmed: 0x1000, walEnd: 0x0900}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &Stream{cfg: Config{Slot: "s"}, log: zap.NewNop(), ledger: NewLedger("public"), mem: mem, identity: id}
			s.streamed.Store(tt.streamed)
			err := s.checkSlotPosition(tt.check)
			if (err != nil) != tt.fatal || err != nil && !IsFatal(err) {
				t.Fatalf("checkSlotPosition = %v, want fatal %v", err, tt.fatal)
			}
			if err != nil && !strings.Contains(err.Error(), "forget-slot") {
				t.Fatalf("no recovery in %v", err)
			}
		})
	}
	if got := mem.recall("s"); got.confirmed != pglogrepl.LSN(0x1000) || got.seen != 0x2000 {
		t.Fatalf("memory %+v changed by the checks", got)
	}
}
