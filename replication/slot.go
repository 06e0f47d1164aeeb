package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// prepareSlot runs the checks of a session on the checks' connection: the database and the
// publication (preflight), the outbox table's OID for the publication checks, the session's
// timing, and the slot. It returns the slot as the session should see it: missing when the
// session is to create it (a first start, or the replacement of a lost slot).
func (s *Stream) prepareSlot(ctx context.Context, conn *pgx.Conn) (SlotInfo, error) {
	if err := preflight(ctx, conn, &s.cfg); err != nil {
		return SlotInfo{}, err
	}
	if !s.cfg.NoTable {
		var oid uint32
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1)::oid", s.cfg.qualifiedTable()).Scan(&oid); err != nil {
			return SlotInfo{}, fmt.Errorf("read the OID of %s: %w", s.cfg.qualifiedTable(), err)
		}
		if err := s.guard.start(oid); err != nil {
			return SlotInfo{}, err
		}
	}
	database, err := s.readTiming(ctx, conn)
	if err != nil {
		return SlotInfo{}, err
	}
	slot, err := ReadSlot(ctx, conn, s.cfg.Slot)
	if err != nil {
		return SlotInfo{}, err
	}
	if slot, err = s.decideLost(ctx, conn, slot); err != nil {
		return SlotInfo{}, err
	}
	if !slot.Exists {
		return slot, nil
	}
	if err := checkSlot(slot, &s.cfg, database); err != nil {
		return SlotInfo{}, err
	}
	if slot.Active {
		return SlotInfo{}, fmt.Errorf("%w: slot %q is being streamed by PostgreSQL backend PID %d%s", ErrSlotActive, s.cfg.Slot, slot.ActivePID, describeBackend(ctx, conn, slot.ActivePID))
	}
	return slot, nil
}

// readTiming sets the session's status interval and receive timeout from the server's
// wal_sender_timeout (see Config.StatusInterval and receiveTimeout), and returns the database the
// checks' connection is on.
func (s *Stream) readTiming(ctx context.Context, conn *pgx.Conn) (database string, err error) {
	var timeoutText string
	if err := conn.QueryRow(ctx, "SELECT current_database(), current_setting('wal_sender_timeout')").Scan(&database, &timeoutText); err != nil {
		return "", fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	senderTimeout := parsePGDuration(timeoutText)
	s.interval = s.cfg.StatusInterval
	if senderTimeout > 0 && s.interval > senderTimeout/3 {
		s.interval = senderTimeout / 3
	}
	s.interval = min(s.interval, s.cfg.ReceiveTimeout/3)
	s.receiveTimeout = receiveTimeout(s.cfg.ReceiveTimeout, senderTimeout, s.interval)
	s.guard.setStatusInterval(s.interval)
	return database, nil
}

// describeBackend says who holds the slot, to make "slot is active" actionable.
func describeBackend(ctx context.Context, conn *pgx.Conn, pid int32) string {
	var app, addr string
	err := conn.QueryRow(ctx, "SELECT coalesce(application_name, ''), coalesce(host(client_addr), 'local') FROM pg_stat_activity WHERE pid = $1", pid).Scan(&app, &addr)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" (application_name=%q, client %s)", app, addr)
}

// ledgerWriteTimeout bounds recording a new slot in the ledger, which outlives a stop.
const ledgerWriteTimeout = 10 * time.Second

func (s *Stream) createSlot(ctx context.Context) (slot SlotInfo, snapshot string, err error) {
	stopWatch := s.watchSlotCreation(ctx, int32(s.conn.PID()))
	res, err := pglogrepl.ParseCreateReplicationSlot(s.conn.Exec(ctx, s.createSlotCommand()))
	stopWatch()
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch pgErr.Code {
			case "42710":
				return SlotInfo{}, "", fmt.Errorf("slot %q was created by another process meanwhile: %w", s.cfg.Slot, err)
			case "53400":
				return SlotInfo{}, "", fatalf("cannot create replication slot %q: %s: raise max_replication_slots or drop an unused slot", s.cfg.Slot, pgErr.Message)
			}
		}
		return SlotInfo{}, "", fmt.Errorf("create replication slot %q: %w", s.cfg.Slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return SlotInfo{}, "", fmt.Errorf("slot %q consistent point %q: %w", s.cfg.Slot, res.ConsistentPoint, err)
	}
	s.log.Info("created replication slot", zap.String("slot", s.cfg.Slot), zap.Stringer("consistent_point", lsn), zap.Bool("failover", s.cfg.Failover),
		zap.Bool("replaces_a_lost_slot", s.lost != nil))
	// The process owns the slot from here on, as if it had streamed it: should the session end
	// before it streams (Kafka down for BeforeStream, say) and the slot vanish, the next session or
	// term must take it for lost, ledger or not, not for a first start that skips the gap.
	s.mem.note(s.cfg.Slot, s.identity, true, s.serverEnd, 0, 0, false)
	if err := s.recordSlot(ctx, lsn); err != nil && s.lost != nil {
		// A replacement's recovery is ended only for the slot the ledger names: without the
		// record, another process's replacement could end it.
		return SlotInfo{}, "", fmt.Errorf("record the replacement of lost slot %q in %s (retrying the recovery): %w", s.cfg.Slot, s.ledger.Table(), err)
	}
	return SlotInfo{Exists: true, Plugin: "pgoutput", ConfirmedFlush: lsn}, res.SnapshotName, nil
}

// recordSlot notes the new slot in the ledger, so that its loss is recognised after a restart.
// Not being able to is worth a warning, not a failure: the slot works without it.
//
// It is the one write that does not end with the caller's context: the slot exists from here on,
// whether or not the relay is stopping. Missing it, a stop during a first start would leave a slot
// unknown to the ledger until a later session records the server's identity; if the slot were
// lost before that (or the ledger predates identities), its loss would read as a first start, and
// a new slot would skip what was committed in between. ledgerWriteTimeout bounds the wait
// instead. (A stop that interrupts CREATE_REPLICATION_SLOT itself may still leave a slot the
// relay never saw created.)
func (s *Stream) recordSlot(ctx context.Context, lsn pglogrepl.LSN) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerWriteTimeout)
	defer cancel()
	if s.lost != nil && s.owner != nil {
		// A replacement is recorded by the recovery's owner, on the connection that holds the
		// recovery lock; its recorded creation identifies it to EndRecovery.
		created, err := s.ledger.RecordReplacementSlot(ctx, s.owner.conn, s.cfg.Slot, lsn)
		if err != nil {
			s.log.Warn("cannot record the replacement slot in the ledger", zap.String("table", LedgerTable), zap.Error(err))
			return err
		}
		s.lost.Created = created
		return nil
	}
	conn, err := s.cfg.ConnectPrimary(ctx) // a standby refuses the write
	if err == nil {
		defer conn.Close(context.WithoutCancel(ctx))
		var exists bool
		if exists, err = s.ledger.Exists(ctx, conn); err == nil && !exists {
			s.log.Warn("the slot ledger table does not exist (run outbox-relay migrate); if this slot is ever lost, a restart cannot tell and creates a new one", zap.String("table", LedgerTable))
			return errors.New("the slot ledger table does not exist")
		}
		if err == nil {
			err = s.ledger.RecordSlot(ctx, conn, s.cfg.Slot, lsn)
		}
	}
	if err != nil {
		s.log.Warn("cannot record the new slot in the ledger; if it is ever lost, a restart cannot tell", zap.String("table", LedgerTable), zap.Error(err))
	}
	return err
}

// parsePGDuration reads a time setting as current_setting returns it ("60s", "1min", "500ms", "0").
func parsePGDuration(v string) time.Duration {
	units := []struct {
		suffix string
		unit   time.Duration
	}{{"ms", time.Millisecond}, {"min", time.Minute}, {"s", time.Second}, {"h", time.Hour}, {"d", 24 * time.Hour}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			var x int64
			if _, err := fmt.Sscan(n, &x); err == nil {
				return time.Duration(x) * u.unit
			}
		}
	}
	var ms int64
	if _, err := fmt.Sscan(v, &ms); err == nil {
		return time.Duration(ms) * time.Millisecond
	}
	return 0
}

// receiveTimeout is how long a session lets the server stay silent before presuming the
// connection dead: the configured ReceiveTimeout, or longer where a healthy walsender may take
// longer to answer. A walsender decoding a large transaction that gives it nothing to send (rows of
// tables outside the publication) reads the relay's messages, the requests for a reply among them,
// only once it has not heard from the relay for half its wal_sender_timeout; it then sends a
// keepalive itself, and it gives the relay up after a whole wal_sender_timeout without reading
// anything. So it answers within about wal_sender_timeout, plus up to a status interval on either
// side before the relay's next message goes out and is read. With wal_sender_timeout 0 it reads
// the relay's messages at every progress update of such a decode, so ReceiveTimeout stands.
func receiveTimeout(configured, senderTimeout, interval time.Duration) time.Duration {
	return max(configured, senderTimeout+2*interval)
}
