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

// awaitStandbys waits, before a claimed batch goes to Kafka, until every physical slot that the
// primary's synchronized_standby_slots names (PostgreSQL 17+) has flushed the WAL up to now: the
// commits of every row the claim's snapshot sees are then on the standbys a failover may promote.
// It is the walsender's rule for logical slots (WaitForStandbyConfirmation), which a poller, reading
// the table over an ordinary connection, does not get from the server: without it a failover could
// lose a transaction whose events the poller had already published. Unset, it costs one query.
//
// A named slot that is missing, logical or invalidated is never caught up, as the walsender has it:
// the relay waits (and says so) rather than publish what a promotion could lose.
func awaitStandbys(ctx context.Context, tx pgx.Tx, log *zap.Logger) error {
	var setting, lsn string
	if err := tx.QueryRow(ctx, `SELECT coalesce(current_setting('synchronized_standby_slots', true), ''), pg_current_wal_insert_lsn()::text`).
		Scan(&setting, &lsn); err != nil {
		return fmt.Errorf("read synchronized_standby_slots and the WAL position: %w", err)
	}
	names := standbySlotNames(setting)
	if len(names) == 0 {
		return nil
	}
	started, warned := time.Now(), false
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		var caughtUp int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots
			WHERE slot_name = ANY($1) AND slot_type = 'physical' AND invalidation_reason IS NULL AND restart_lsn >= $2::pg_lsn`,
			names, lsn).Scan(&caughtUp); err != nil {
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
				zap.Strings("synchronized_standby_slots", names), zap.String("wal_position", lsn))
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
