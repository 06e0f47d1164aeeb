package leader

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Holder describes the session that holds a slot's leader lock.
type Holder struct {
	PID             int32     `json:"pid"`
	ApplicationName string    `json:"application_name"` // as configured, without the published walsender
	ClientAddr      string    `json:"client_addr"`      // "local" for a Unix socket; empty when not visible to this role
	BackendStart    time.Time `json:"backend_start,omitzero"`
	// WalsenderPID is the walsender the holder published as its own (see Term.PublishWalsender); 0 if none.
	WalsenderPID int32 `json:"walsender_pid,omitempty"`

	exiting bool // listed in pg_locks without a pg_stat_activity row: its backend is exiting
}

// LockHolder finds who holds the leader lock of slot in the connected database. pg_locks shows a
// bigint advisory key as its high half in classid and its low half in objid, with objsubid 1.
// Another role's client address and start time are visible only with pg_read_all_stats.
func LockHolder(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, slot string) (Holder, bool, error) {
	key := uint64(Key(slot))
	var h Holder
	var app, addr *string
	var start *time.Time
	err := q.QueryRow(ctx, `SELECT l.pid, a.pid IS NULL, a.application_name, CASE WHEN a.pid IS NULL THEN NULL
			WHEN a.client_addr IS NULL AND a.backend_start IS NOT NULL THEN 'local' ELSE host(a.client_addr) END, a.backend_start
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid::bigint = $1 AND l.objid::bigint = $2
		LIMIT 1`, int64(key>>32), int64(key&0xffffffff)).Scan(&h.PID, &h.exiting, &app, &addr, &start)
	if errors.Is(err, pgx.ErrNoRows) {
		return Holder{}, false, nil
	}
	if err != nil {
		return Holder{}, false, fmt.Errorf("read the leader lock holder from pg_locks: %w", err)
	}
	if app != nil {
		h.ApplicationName = *app
		if i := strings.LastIndex(*app, walsenderTag); i >= 0 {
			if pid, err := strconv.ParseInt((*app)[i+len(walsenderTag):], 10, 32); err == nil {
				h.ApplicationName, h.WalsenderPID = (*app)[:i], int32(pid)
			}
		}
	}
	if addr != nil {
		h.ClientAddr = *addr
	}
	if start != nil {
		h.BackendStart = *start
	}
	return h, true, nil
}

// rememberHolder is the holder a standby keeps after seeing h hold the lock, having seen
// previous before (nil if none). LockHolder reads pg_locks and pg_stat_activity at slightly
// different moments, so a holder seen while its backend exits can be listed with the lock but
// without its activity row, and so without the walsender it published (3 in 300 sightings of an
// exiting holder here): that sighting must not make the standby forget the walsender it is to end
// when it takes over. A sighting with the row is believed, also for the same PID (a new session
// may reuse an exited one's PID).
func rememberHolder(previous *Holder, h Holder) *Holder {
	if previous != nil && previous.PID == h.PID && h.exiting {
		return previous
	}
	return &h
}
