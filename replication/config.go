package replication

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/credentials"
)

// Config configures a Stream.
type Config struct {
	DSN string
	// PrimaryDSN, when set, is the primary of a hot standby that DSN points at (decoding on a
	// standby, PostgreSQL 16+): what a standby cannot do runs there (the slot ledger's writes,
	// heartbeats, the publication's creation, pg_log_standby_snapshot to speed up the slot's
	// creation). Empty: DSN is the primary, and everything runs there.
	PrimaryDSN        string
	PasswordFile      string // pg_password_file: read for every connection, so a rotated password is used at the next reconnect
	Slot              string
	Publication       string
	Schema            string   // of the outbox table; default "public"
	Table             string   // the outbox table
	Columns           []string // columns that must exist in the outbox table
	CreateSlot        bool
	CreatePublication bool
	// StatusInterval is how often the confirmed position is reported. It is capped at a third of
	// the server's wal_sender_timeout so the server never gives up on a busy relay, and at a third
	// of ReceiveTimeout so a silent server is asked for a reply in time.
	StatusInterval time.Duration
	// ReceiveTimeout is how long the server may stay silent before the connection is presumed dead.
	// A walsender that receives the relay's status updates sends nothing on an idle database, so
	// after a third of it in silence the status updates ask for a reply. Default 2m.
	ReceiveTimeout time.Duration
	// SlotBusyWait is how long a first start waits for a slot another process holds (for example
	// the walsender of a relay that was just killed) before giving up. Default 30s.
	SlotBusyWait time.Duration
	// Messages asks pgoutput for logical decoding messages (heartbeats, the table-free outbox).
	Messages bool
	// NoTable: the outbox is logical decoding messages only (Messages must be set). There is no
	// table to check, and the publication need only exist (pgoutput requires one; created empty
	// when missing and CreatePublication is set): pgoutput sends every message whatever the
	// publication holds, so no position is capped at a publication check either.
	NoTable bool
	// Buffer is how many messages may wait for the consumer. Default 32.
	Buffer int
	// BufferBytes caps the bytes of the Data messages handed to the consumer and not yet released
	// (Message.Release): those waiting in the channel and the one the consumer is working on. Each
	// holds a copy of its row outside the sink's in-flight limits, so with large rows the message
	// count alone would let the buffer hold Buffer rows. A message larger than the cap is admitted
	// when nothing else is held, so a huge row cannot wedge the stream. Default 16 MiB.
	BufferBytes int64
	// The three hooks below are the relay's policy, called by the slot's life at fixed points of a
	// session, each from one place, in this order: OnWalsender (Stream.publishWalsender), then
	// BeforeStream (Stream.beforeStream), then Recover (Stream.recover), all before
	// START_REPLICATION and on the session's goroutine. The wire loop calls none of them.
	//
	// OnWalsender, when set, runs in each session as soon as the replication connection is up,
	// before the session creates, recovers or streams the slot, with that connection's backend
	// PID: the walsender that will hold the slot. The leader publishes it there
	// (leader.Term.PublishWalsender), so the next leader knows which walsender to end before the
	// slot can show it active. An error ends the session, which is retried.
	OnWalsender func(ctx context.Context, pid int32) error
	// BeforeStream, when set, runs in the first session that gets this far, after the slot exists
	// (so nothing committed from here on can be missed) and before START_REPLICATION: the relay
	// waits for Kafka and backfills there. snapshot names the snapshot exported when this session
	// created the slot with ExportSnapshot (the rows it shows are exactly those committed before the
	// slot's consistent point); it is "" when the slot already existed, and for a replacement slot,
	// whose snapshot is Recover's.
	BeforeStream func(ctx context.Context, snapshot string) error
	// Recover publishes a lost slot's gap from the outbox table, as of snapshot (the replacement
	// slot's: exactly the transactions committed before its consistent point), and returns once
	// Kafka holds it all. An error leaves the recovery under way: the next session starts it again.
	// It is where the two halves of a lost slot's recovery meet: the stream's (lost.go decides,
	// recovery.go replaces the slot, owns the recovery and records its end) and the relay's, which
	// publishes the gap. Its context ends when the recovery lock is lost.
	Recover func(ctx context.Context, snapshot string, lost LostSlot) (Recovery, error)
	// ExportSnapshot creates a missing slot with an exported snapshot, for BeforeStream.
	ExportSnapshot bool
	// Failover makes the slot a failover slot (PostgreSQL 17+; a fatal error on older servers):
	// created with FAILOVER, or altered when it exists without it.
	Failover bool
	// OnSlotLost is what a lost slot makes the stream do: SlotLostStop (the default) or
	// SlotLostRecover, which replaces the slot and calls Recover with the replacement's exported
	// snapshot before streaming from it (recovery.go). It needs the slot ledger at migration 0008.
	OnSlotLost string
	// MessageEvents: events also come as logical decoding messages, which are stored nowhere but
	// the WAL, so a lost slot's gap cannot be recovered whole (with NoTable, not at all).
	MessageEvents bool
	// Memory is the process's memory of the slots it streamed (history.go), shared by every
	// Stream the process builds (one per leadership term). Nil: this Stream's own.
	Memory *Memory
}

// ConnConfig parses DSN for a new connection, with the password read from PasswordFile now.
func (c *Config) ConnConfig() (*pgx.ConnConfig, error) {
	return credentials.PostgresConfig(c.DSN, c.PasswordFile)
}

// Connect opens an ordinary connection with the stream's settings: what the checks, the ledger and
// the relay's helpers (backfill, heartbeat) use.
func (c *Config) Connect(ctx context.Context) (*pgx.Conn, error) {
	conf, err := c.ConnConfig()
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, conf)
}

// ConnectPrimary opens an ordinary connection to the primary: PrimaryDSN when set, else DSN.
// Writes go here, which a hot standby refuses.
func (c *Config) ConnectPrimary(ctx context.Context) (*pgx.Conn, error) {
	if c.PrimaryDSN == "" {
		return c.Connect(ctx)
	}
	conf, err := credentials.PostgresConfig(c.PrimaryDSN, c.PasswordFile)
	if err != nil {
		return nil, fmt.Errorf("primary_dsn: %w", err)
	}
	return pgx.ConnectConfig(ctx, conf)
}

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = time.Second
	}
	if c.ReceiveTimeout <= 0 {
		c.ReceiveTimeout = 2 * time.Minute
	}
	if c.SlotBusyWait <= 0 {
		c.SlotBusyWait = 30 * time.Second
	}
	if c.Buffer <= 0 {
		c.Buffer = 32
	}
	if c.BufferBytes <= 0 {
		c.BufferBytes = 16 << 20
	}
}

func (c *Config) qualifiedTable() string { return pgx.Identifier{c.Schema, c.Table}.Sanitize() }
