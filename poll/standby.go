package poll

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// FlushMessagePrefix is the prefix of the empty logical decoding messages with which a poller
// flushes the WAL its claim waits for (awaitStandbys).
const FlushMessagePrefix = "outbox-relay.poll.flush"

// awaitStandbys waits, before a claimed batch goes to Kafka, until every physical slot that the
// primary's synchronized_standby_slots names (PostgreSQL 17+) has flushed the WAL of the commits
// of every row the claim's snapshots saw: a promotion of a standby it names then keeps every
// transaction whose events the batch publishes. It is the walsender's rule for logical slots
// (WaitForStandbyConfirmation), which a poller, reading the table over an ordinary connection,
// does not get from the server: without it a failover could lose a transaction whose events the
// poller had already published. Unset, it costs one query.
//
// The target is the insert position read after the claim, the one position that the commit record
// of every transaction the claim saw is provably before (a commit with synchronous_commit off is
// visible before its record is flushed, so the flush position is no such bound). But WAL that is
// inserted and not flushed reaches no standby until something flushes it, and what lies just
// before that position is mostly the claim's own row locks, which nothing flushes until some
// transaction commits: on a quiet primary, the next running-transactions record, up to 15 s later,
// and the wait stalled every batch that long. So when the primary has not flushed up to the
// target, the claim flushes it: an empty non-transactional logical decoding message with flush
// (PostgreSQL 17, like synchronized_standby_slots; callable by any role) is written and flushed at
// once with every record before it, needs no transaction id, and is ignored by every decoder not
// asking for its prefix. A commit would not do: one that wrote nothing else is not flushed.
//
// A named slot that is missing, logical or invalidated is never caught up, as the walsender has it:
// the relay waits (and says so) rather than publish what a promotion could lose.
func awaitStandbys(ctx context.Context, tx pgx.Tx, log *zap.Logger) error {
	var setting, target string
	var flushed bool
	if err := tx.QueryRow(ctx, `SELECT coalesce(current_setting('synchronized_standby_slots', true), ''), l::text, pg_current_wal_flush_lsn() >= l
		FROM pg_current_wal_insert_lsn() AS l`).
		Scan(&setting, &target, &flushed); err != nil {
		return fmt.Errorf("read synchronized_standby_slots and the WAL position: %w", err)
	}
	names := standbySlotNames(setting)
	if len(names) == 0 {
		return nil
	}
	if !flushed {
		if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(false, $1, ''::bytea, true)", FlushMessagePrefix); err != nil {
			return fmt.Errorf("flush the WAL of the claim's commits for the standbys of synchronized_standby_slots: %w", err)
		}
	}
	started, warned := time.Now(), false
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		var caughtUp int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots
			WHERE slot_name = ANY($1) AND slot_type = 'physical' AND invalidation_reason IS NULL AND restart_lsn >= $2::pg_lsn`,
			names, target).Scan(&caughtUp); err != nil {
			return fmt.Errorf("read the standby slots of synchronized_standby_slots: %w", err)
		}
		if caughtUp == len(names) {
			if warned {
				log.Info("the standbys of synchronized_standby_slots caught up; publishing", zap.Duration("waited", time.Since(started)))
			}
			return nil
		}
		if !warned && time.Since(started) > 10*time.Second {
			warned = true
			log.Warn("a claimed batch waits for the standbys of synchronized_standby_slots to receive its commits (a failover could otherwise lose what was published); check that every slot listed there is active and streaming",
				zap.Strings("synchronized_standby_slots", names), zap.String("wal_position", target))
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// standbySlotNames are the slots synchronized_standby_slots lists, each once, named as PostgreSQL
// reads the list (SplitIdentifierString): an unquoted name in lower case, a quoted one as written.
// The wait counts the named slots that caught up, so a name kept as written ('Standby1' for slot
// standby1) or listed twice would never be caught up.
func standbySlotNames(setting string) []string {
	var names []string
	for _, n := range strings.Split(setting, ",") {
		n = strings.TrimSpace(n)
		if len(n) >= 2 && n[0] == '"' && n[len(n)-1] == '"' {
			n = strings.ReplaceAll(n[1:len(n)-1], `""`, `"`)
		} else {
			n = strings.ToLower(n)
		}
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}
