package replication

import (
	"bufio"
	"context"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// dialling is a replication connection being opened (dialReplication).
type dialling struct {
	cancel context.CancelFunc
	done   chan struct{}
	conn   *pgconn.PgConn
	err    error
}

// asReplication makes cfg open a replication connection (replication=database: the replication
// commands, and simple-protocol SQL), named outbox-relay unless pg_dsn names it.
func asReplication(cfg *pgconn.Config) {
	cfg.RuntimeParams["replication"] = "database"
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "outbox-relay"
	}
}

// dialReplication opens a session's replication connection in the background.
func dialReplication(ctx context.Context, conf *pgx.ConnConfig) *dialling {
	rcfg := &conf.Config
	asReplication(rcfg)
	// pgoutput sends values in their text form, which for bytea follows the session's bytea_output,
	// and ALTER DATABASE/ROLE ... SET bytea_output = 'escape' reaches the walsender too: the
	// decoder reads hex. Startup options win over database and role settings.
	rcfg.RuntimeParams["bytea_output"] = "hex"
	// Timestamps (columns.timestamp) are read in the ISO format, whatever DateStyle the database
	// or role sets.
	rcfg.RuntimeParams["DateStyle"] = "ISO"
	// pgproto3 reads the socket 8 KiB at a time; a busy stream is tens of MB/s, so read it in
	// larger pieces and spare the syscalls.
	rcfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, 256<<10), w)
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &dialling{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		d.conn, d.err = pgconn.ConnectConfig(ctx, rcfg)
	}()
	return d
}

// wait returns the connection once it is open.
func (d *dialling) wait(ctx context.Context) (*pgconn.PgConn, error) {
	defer d.cancel()
	select {
	case <-d.done:
		return d.conn, d.err
	case <-ctx.Done():
		d.discard()
		return nil, ctx.Err()
	}
}

// discard gives the connection up: the dial ends at once, and what it opened is closed.
func (d *dialling) discard() {
	d.cancel()
	<-d.done // the dial honours its cancelled context
	if d.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // an unused connection: the goodbye goes out at once
		defer cancel()
		d.conn.Close(ctx)
	}
}
