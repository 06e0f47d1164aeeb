package replication

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// A PostgreSQL shutdown (pg_ctl stop -m fast, a restart, a failover drill) ends the ordinary
// backends, refuses new connections (SQLSTATE 57P03), writes the shutdown checkpoint and then waits
// for every walsender. A walsender leaves only once its client has confirmed everything it was
// sent, the shutdown checkpoint included (WalSndDone in walsender.c), or once the client has gone.
// The relay confirms no further than its publication checks covered (horizon), and those are
// refused during the shutdown, so it could never confirm that far: it would hold the shutdown for
// as long as it streamed (the walsender's requests for a reply keep the connection busy, so no
// receive timeout ends it), until a grace period kills PostgreSQL and forces crash recovery.
// Confirming unchecked is no way out (a publication change in the last
// interval would go unseen), so the relay leaves the stream instead: it closes the replication
// connection, the walsender exits, and the session reconnects with the usual backoff once the
// server is back. What was not confirmed is streamed again: duplicates within the window, no loss.
//
// Two signs tell the relay, whichever comes first:
//   - a publication check refused with 57P03 (cannot_connect_now: shutting down, or not yet up);
//   - the walsender's own: once the shutdown checkpoint is written, WalSndDone asks for a reply
//     with a keepalive each time it has read the previous reply, so keepalives that request a
//     reply arrive back to back. A walsender otherwise asks at most once per half its
//     wal_sender_timeout without a reply from the relay, and sends no reply request at all when
//     that is 0.

// errServerStopping ends a session when PostgreSQL shuts down. It is not fatal: Run reconnects.
var errServerStopping = errors.New("PostgreSQL is shutting down: the relay leaves the replication stream so that the server can stop (a walsender waits for its client to confirm everything it was sent, which the relay cannot while its publication checks are refused), and reconnects after the restart; what was not confirmed is streamed again")

// errWalsenderStopping and errCheckRefused say which sign ended the session (for the log).
var (
	errWalsenderStopping = fmt.Errorf("%w (seen in the walsender's keepalives, each asking for a reply as only its shutdown does)", errServerStopping)
	errCheckRefused      = fmt.Errorf("%w (seen in a publication check refused with SQLSTATE 57P03)", errServerStopping)
)

// isCannotConnectNow reports whether err is PostgreSQL's cannot_connect_now (57P03): "the database
// system is shutting down", "is starting up", "is not yet accepting connections".
func isCannotConnectNow(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57P03"
}

// noteStopping records that a check begun at began was refused because the server is shutting
// down (or not up yet).
func (h *horizon) noteStopping(began time.Time) {
	h.stoppingAt.Store(began.UnixNano())
}

// stoppingSince reports whether a check begun after since was refused because the server is
// shutting down. A check begun before a session started says nothing about the server that session
// reached: a refusal while the server was still starting up must not end the session that followed.
func (h *horizon) stoppingSince(since time.Time) bool {
	at := h.stoppingAt.Load()
	return at != 0 && at > since.UnixNano()
}

// shutdownPings is how many keepalives that request a reply, back to back with nothing else
// between them, the walsender's shutdown takes to be recognised (see stopSigns).
const shutdownPings = 5

// stopSigns watches the keepalives of one session for the walsender's shutdown pattern: requests
// for a reply at the same WAL end, one after the other, with no data and no other keepalive
// between them, within one status interval.
type stopSigns struct {
	pings int
	first time.Time
	end   pglogrepl.LSN
}

// keepalive notes a keepalive and reports whether the walsender is shutting down.
func (p *stopSigns) keepalive(replyRequested bool, walEnd pglogrepl.LSN, now time.Time, interval time.Duration) bool {
	if !replyRequested || walEnd != p.end || now.Sub(p.first) > interval {
		*p = stopSigns{}
		if !replyRequested {
			return false
		}
		p.first, p.end = now, walEnd
	}
	p.pings++
	return p.pings >= shutdownPings
}

// data notes that something else than a keepalive arrived.
func (p *stopSigns) data() { *p = stopSigns{} }

// serverStopping says whether this session should leave the stream because the server shuts down.
func (s *Stream) serverStopping() error {
	if s.copying && s.guard.stoppingSince(s.streamingSince) {
		return errCheckRefused
	}
	return nil
}
