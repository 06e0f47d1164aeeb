package replication

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestParsePGDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"60s", time.Minute},
		{"1min", time.Minute},
		{"500ms", 500 * time.Millisecond},
		{"2h", 2 * time.Hour},
		{"1d", 24 * time.Hour},
		{"0", 0},
		{"30000", 30 * time.Second}, // a bare number is milliseconds
		{"nonsense", 0},
	}
	for _, tt := range tests {
		if got := parsePGDuration(tt.in); got != tt.want {
			t.Errorf("parsePGDuration(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestQuoteLiteralDoublesQuotes(t *testing.T) {
	if got := quoteLiteral("it's"); got != "'it''s'" {
		t.Fatalf("quoteLiteral = %s", got)
	}
}

func TestConnectErrorsSayWhetherRetryingHelps(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		fatal bool
		says  string
	}{
		{"a role without REPLICATION is fatal", &pgconn.PgError{Code: "42501", Message: "must be superuser or replication role to start walsender"}, true, "REPLICATION"},
		{"a wrong password is fatal", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}, true, "credentials"},
		{"a missing database is fatal", &pgconn.PgError{Code: "3D000", Message: `database "x" does not exist`}, true, "database"},
		{"too many connections is retried", &pgconn.PgError{Code: "53300", Message: "too many clients"}, false, "too many"},
		{"a refused connection is retried", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"), false, "connection refused"},
		{"a server certificate of an unknown CA is fatal and names sslrootcert",
			fmt.Errorf("tls error: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), true, "sslrootcert in pg_dsn"},
		{"a server certificate for another name is fatal and names the host",
			fmt.Errorf("tls error: %w", &tls.CertificateVerificationError{Err: x509.HostnameError{Certificate: &x509.Certificate{}, Host: "db"}}), true, "the host in pg_dsn"},
		{"pg_hba.conf refusing a connection without TLS is fatal and names sslmode",
			&pgconn.PgError{Code: "28000", Message: `pg_hba.conf rejects replication connection for host "10.0.0.1", user "relay", no encryption`}, true, "sslmode=verify-full"},
		{"a missing client certificate is fatal and names sslcert",
			&pgconn.PgError{Code: "28000", Message: "connection requires a valid client certificate"}, true, "sslcert and sslkey"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := classifyConnect(tt.err, "replication")
			if IsFatal(err) != tt.fatal {
				t.Fatalf("IsFatal(%v) = %v, want %v", err, IsFatal(err), tt.fatal)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("%q does not mention %q", err, tt.says)
			}
		})
	}
}

func TestCheckSlotRefusesSlotsTheRelayCannotUse(t *testing.T) {
	cfg := &Config{Slot: "s"}
	good := SlotInfo{Exists: true, SlotType: "logical", Plugin: "pgoutput", Database: "app", WALStatus: "reserved"}
	tests := []struct {
		name   string
		mutate func(*SlotInfo)
		says   string // empty: accepted
		lost   bool
	}{
		{"a healthy pgoutput slot is accepted", func(*SlotInfo) {}, "", false},
		{"a physical slot is refused", func(s *SlotInfo) { s.SlotType = "physical" }, "logical slot", false},
		{"another plugin is refused", func(s *SlotInfo) { s.Plugin = "wal2json" }, "pgoutput", false},
		{"another database is refused", func(s *SlotInfo) { s.Database = "other" }, `belongs to database "other"`, false},
		{"a lost slot is refused as lost", func(s *SlotInfo) { s.WALStatus = "lost" }, "lost", true},
		{"a slot invalidated for idleness (18) is refused with the setting to raise", func(s *SlotInfo) {
			s.WALStatus, s.InvalidationReason = "lost", "idle_timeout"
		}, "raise idle_replication_slot_timeout", true},
		{"a slot invalidated for rows removed is refused with the reason", func(s *SlotInfo) { s.InvalidationReason = "rows_removed" }, "invalidated (rows_removed)", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			slot := good
			tt.mutate(&slot)
			err := checkSlot(slot, cfg, "app")
			if tt.says == "" {
				if err != nil {
					t.Fatalf("checkSlot = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("checkSlot = %v, want it to mention %q", err, tt.says)
			}
			if !IsFatal(err) {
				t.Fatalf("%v is not fatal", err)
			}
			if errors.Is(err, ErrSlotLost) != tt.lost {
				t.Fatalf("errors.Is(%v, ErrSlotLost) = %v", err, !tt.lost)
			}
		})
	}
}

func TestStreamErrorsMapToWhatTheCallerActsOn(t *testing.T) {
	tests := []struct {
		name     string
		code     string
		streamed bool
		is       error
		fatal    bool
	}{
		{"an active slot means someone else streams it", "55006", false, ErrSlotActive, false},
		{"a missing slot before streaming is a configuration problem", "42704", false, nil, true},
		{"a missing slot after streaming is a lost slot", "42704", true, ErrSlotLost, true},
		{"removed WAL is a lost slot", "55000", true, ErrSlotLost, true},
		{"a shutting-down server is retried", "57P01", true, nil, false},
		{"a dropped publication is not a lost slot", "42704", true, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Stream{cfg: Config{Publication: "p", Schema: "public", Table: "outbox"}}
			s.streamed.Store(tt.streamed)
			msg := "x"
			if strings.HasPrefix(tt.name, "a dropped publication") {
				msg = `publication "p" does not exist`
			}
			err := s.streamError(&pgconn.PgError{Code: tt.code, Message: msg})
			if tt.is == nil && errors.Is(err, ErrSlotLost) {
				t.Fatalf("%v is reported as a lost slot", err)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Fatalf("%v is not %v", err, tt.is)
			}
			if IsFatal(err) != tt.fatal {
				t.Fatalf("IsFatal(%v) = %v, want %v", err, IsFatal(err), tt.fatal)
			}
		})
	}
}

type fixedCheckpoint pglogrepl.LSN

func (c fixedCheckpoint) Safe() pglogrepl.LSN { return pglogrepl.LSN(c) }
func (c fixedCheckpoint) Timeline() uint32    { return 0 }

func TestStatusIsDueOnTheIntervalOrSoonAfterTheCheckpointMoves(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name       string
		safe       pglogrepl.LSN
		verified   pglogrepl.LSN
		reported   pglogrepl.LSN
		lastStatus time.Time
		nextStatus time.Time
		want       bool
	}{
		{"the interval passed", 10, 100, 10, now.Add(-time.Second), now.Add(-time.Millisecond), true},
		{"nothing moved and the interval has not passed", 10, 100, 10, now.Add(-time.Second), now.Add(time.Second), false},
		{"the checkpoint moved a while ago", 20, 100, 10, now.Add(-time.Second), now.Add(time.Second), true},
		{"the checkpoint moved but an update just went out", 20, 100, 10, now, now.Add(time.Second), false},
		{"the checkpoint moved past the verified horizon, which did not move", 20, 10, 10, now.Add(-time.Second), now.Add(time.Second), false},
		{"the checkpoint moved and the verified horizon partly", 20, 15, 10, now.Add(-time.Second), now.Add(time.Second), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &horizon{}
			g.verified.Store(uint64(tt.verified))
			s := &Stream{ck: fixedCheckpoint(tt.safe), guard: g}
			s.wire = wire{above: s, reported: tt.reported, lastStatus: tt.lastStatus, nextStatus: tt.nextStatus}
			if got := s.statusDue(now); got != tt.want {
				t.Fatalf("statusDue = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestTheReadDeadlineComesForwardWhenEventsAwaitConfirmation: the receive loop's read deadline
// is the next status update, or sooner (eagerStatusGap) while received events await
// confirmation. A message that arrives after a quiet spell, with the deadline a status interval
// away, brings it forward, so its confirmation does not wait for the interval; on a busy stream it
// stays put until it passes.
func TestTheReadDeadlineComesForwardWhenEventsAwaitConfirmation(t *testing.T) {
	now := time.Now()
	nextStatus := now.Add(900 * time.Millisecond)
	soon := now.Add(eagerStatusGap)
	tests := []struct {
		name               string
		received, reported pglogrepl.LSN
		deadline           time.Time
		want               time.Time
		move               bool
	}{
		{"quiet, nothing awaits confirmation: the deadline stays the next status update", 10, 10, nextStatus, nextStatus, false},
		{"a message after a quiet spell: the deadline comes forward", 20, 10, nextStatus, soon, true},
		{"a busy stream: the earlier deadline stays until it passes", 20, 10, now.Add(50 * time.Millisecond), soon, false},
		{"the deadline passed with events awaiting confirmation", 20, 10, now, soon, true},
		{"the deadline passed, nothing awaits confirmation", 10, 10, now.Add(-time.Millisecond), nextStatus, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &wire{received: tt.received, reported: tt.reported, nextStatus: nextStatus}
			got, move := s.readDeadline(now, tt.deadline)
			if move != tt.move || (move && !got.Equal(tt.want)) {
				t.Fatalf("readDeadline = %v, %v; want %v, %v", got.Sub(now), move, tt.want.Sub(now), tt.move)
			}
		})
	}
}
