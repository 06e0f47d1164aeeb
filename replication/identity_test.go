package replication

import (
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"
)

func TestServerIdentityIsComparedWithTheServerStreamedBefore(t *testing.T) {
	a1 := Identity{SystemID: "7300000000000000001", Timeline: 1}
	a2 := Identity{SystemID: a1.SystemID, Timeline: 2}
	b1 := Identity{SystemID: "7300000000000000002", Timeline: 1}
	tests := []struct {
		name     string
		before   Identity // in this process
		recorded Identity // in the ledger
		server   Identity
		prev     Identity // what it was compared with
		says     string   // empty: accepted
	}{
		{"a first start with nothing recorded is accepted", Identity{}, Identity{}, a1, Identity{}, ""},
		{"the same server again is accepted", a1, a1, a1, a1, ""},
		{"a promoted standby (new timeline) is accepted as a failover", a1, a1, a2, a1, ""},
		{"a failover while the relay was down is seen in the ledger", Identity{}, a1, a2, a1, ""},
		{"another cluster while streaming is refused", a1, a1, b1, a1, "another database cluster"},
		{"another cluster than the ledger records is refused, naming the ledger as SQL takes it", Identity{}, a1, b1, a1, `UPDATE "public"."outbox_relay_slots" SET system_identifier = NULL WHERE slot = 's'`},
		{"what this process saw wins over the ledger", a2, a1, a2, a2, ""},
		{"an earlier timeline while streaming (a superseded primary) is refused", a2, a2, a1, a2, "superseded primary"},
		{"an earlier timeline than the ledger records is refused", Identity{}, a2, a1, a2, "superseded primary"},
		{"a later timeline than the ledger records but another cluster is refused", Identity{}, a1, Identity{SystemID: b1.SystemID, Timeline: 3}, a1, "SET system_identifier = NULL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Stream{cfg: Config{Slot: "s"}, identity: tt.before, log: zap.NewNop(), ledger: NewLedger("public")}
			prev, err := s.compareIdentity(tt.server, tt.recorded)
			if prev != tt.prev {
				t.Errorf("compared with %v, want %v", prev, tt.prev)
			}
			switch {
			case tt.says == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.says == "":
				if s.identity != tt.server {
					t.Fatalf("identity after = %v, want %v", s.identity, tt.server)
				}
			case err == nil:
				t.Fatalf("accepted, want an error saying %q", tt.says)
			case !IsFatal(err) || !strings.Contains(err.Error(), tt.says):
				t.Fatalf("error %q (fatal %v), want a fatal one saying %q", err, IsFatal(err), tt.says)
			case s.identity != tt.before:
				t.Fatalf("identity after a refusal = %v, want it unchanged (%v)", s.identity, tt.before)
			}
		})
	}
}

type timelineCheckpoint struct {
	safe     pglogrepl.LSN
	timeline uint32
}

func (c timelineCheckpoint) Safe() pglogrepl.LSN { return c.safe }
func (c timelineCheckpoint) Timeline() uint32    { return c.timeline }

func TestOnlyPositionsOfTheServersTimelineAreConfirmed(t *testing.T) {
	tests := []struct {
		name    string
		ck      timelineCheckpoint
		server  uint32
		floor   pglogrepl.LSN
		horizon pglogrepl.LSN
		want    pglogrepl.LSN
	}{
		{"the checkpoint on the server's timeline", timelineCheckpoint{0x500, 1}, 1, 0x100, 0x900, 0x500},
		{"never below the slot's own position", timelineCheckpoint{0x50, 1}, 1, 0x100, 0x900, 0x100},
		{"an old timeline's position is not confirmed to the new one", timelineCheckpoint{0x500, 1}, 2, 0x300, 0x900, 0x300},
		{"before the consumer took up the first session", timelineCheckpoint{0, 0}, 1, 0x300, 0x900, 0x300},
		{"capped at what the publication checks covered", timelineCheckpoint{0x500, 1}, 1, 0x100, 0x400, 0x400},
		{"the slot's own position even before a check covered it", timelineCheckpoint{0x500, 1}, 1, 0x100, 0, 0x100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			guard := &horizon{}
			guard.verified.Store(uint64(tt.horizon))
			s := &Stream{ck: tt.ck, identity: Identity{SystemID: "x", Timeline: tt.server}, floor: tt.floor, guard: guard}
			if got := s.confirmable(); got != tt.want {
				t.Fatalf("confirmable() = %s, want %s", got, tt.want)
			}
		})
	}
}
