package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/schemaregistry"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/slotmon"
)

// exitSlotProblem is status's exit code when the slot is missing or has lost WAL, when a standby
// given with --standby-dsn would not keep it through a promotion, or when the schema registry an
// encoding needs does not answer: scripts and probes can tell it
// from a failure to ask (1) and a usage error (2).
const exitSlotProblem = 3

// statusTimeout bounds the whole status command: it is run by people and scripts waiting for it.
const statusTimeout = 15 * time.Second

// statusReport is `outbox-relay status --json`.
type statusReport struct {
	slotmon.State
	ConfirmedFlushLSN string         `json:"confirmed_flush_lsn,omitempty"`
	RestartLSN        string         `json:"restart_lsn,omitempty"`
	CurrentWALLSN     string         `json:"current_wal_lsn"`
	LeaderLockKey     int64          `json:"leader_lock_key"`
	Leader            *leader.Holder `json:"leader"` // null when nobody holds the lock
	// Failover is whether the slot survives a promotion; Standbys what the --standby-dsn servers
	// say of their copies.
	Failover slotmon.Failover  `json:"failover"`
	Standbys []slotmon.Standby `json:"standbys,omitempty"`
	Delivery deliveryReport    `json:"delivery"`
	// SchemaRegistry is the registry as the relay's client finds it now; null without a registry
	// encoding. A registry that does not answer is a problem: events needing a schema not in the
	// relay's cache wait for it, holding the stream.
	SchemaRegistry *schemaregistry.Status `json:"schema_registry"`
	// Recovery is what the slot ledger says of lost-slot recovery: how far Kafka acknowledged,
	// a recovery under way, the last one. Null without a ledger at migration 0007.
	Recovery *recoveryReport `json:"recovery"`
	// CreationWait is set while a walsender creates the slot and waits for a transaction that
	// began before it (an open or a prepared one) to end.
	CreationWait *replication.CreationWait `json:"slot_creation_waits_for,omitempty"`
	OK           bool                      `json:"ok"`
	Problems     []string                  `json:"problems"`
	// Warnings do not change the exit code: the slot streams, but a failover would cost something.
	Warnings []string `json:"warnings"`
}

// recoveryReport is the slot ledger's record for on_slot_lost: recover.
type recoveryReport struct {
	// AcknowledgedCommitTime is the commit time of the last transaction Kafka held with every one
	// before it, as last recorded: a lost slot's gap starts after it.
	AcknowledgedCommitTime *time.Time `json:"acknowledged_commit_time"`
	// AcknowledgedXmin is the horizon recorded with it: Kafka holds the events of every
	// transaction with a lower full id, and a lost slot's gap is the rows of this id on. Null
	// when none is recorded (then only commit timestamps or slot_recovery_margin bound the gap).
	AcknowledgedXmin *uint64 `json:"acknowledged_xmin"`
	// UnderWaySince is set while a recovery is under way (the gap starts after it).
	UnderWaySince *time.Time    `json:"under_way_since,omitempty"`
	Last          *lastRecovery `json:"last,omitempty"`
}

type lastRecovery struct {
	At      time.Time `json:"at"`
	Events  int64     `json:"events"`
	After   time.Time `json:"after"`
	Rule    string    `json:"rule"`
	Seconds float64   `json:"seconds"`
}

// recoveryStatus reads rep.Recovery from the slot ledger; without one (or before migration 0007)
// it leaves it nil.
func recoveryStatus(ctx context.Context, conn *pgx.Conn, schema, slot string, rep *statusReport) error {
	ledger := replication.NewLedger(schema)
	if exists, err := ledger.Exists(ctx, conn); err != nil || !exists {
		return err
	}
	st, err := ledger.Recovery(ctx, conn, slot)
	var pgErr *pgconn.PgError
	if errors.Is(err, replication.ErrLedgerNotMigrated) || errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return nil // not migrated, or a role that may not read it: nothing to say
	}
	if err != nil {
		return err
	}
	r := &recoveryReport{}
	if t := st.Confirmed.CommitTime; !t.IsZero() {
		r.AcknowledgedCommitTime = &t
	}
	if x := st.Confirmed.Xmin; x != 0 {
		r.AcknowledgedXmin = &x
	}
	if t := st.Since; !t.IsZero() {
		r.UnderWaySince = &t
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("a recovery of lost slot %q is under way (its gap: rows committed after %s); the leader finishes it before streaming", slot, t.UTC().Format(time.RFC3339)))
	}
	if l := st.Last; !l.At.IsZero() {
		r.Last = &lastRecovery{At: l.At, Events: l.Events, After: l.From, Rule: l.Rule, Seconds: l.Took.Seconds()}
	}
	rep.Recovery = r
	return nil
}

// deliveryReport is the delivery mode and, with exactly-once, the position committed in Kafka.
type deliveryReport struct {
	Mode            string `json:"mode"`
	TransactionalID string `json:"transactional_id,omitempty"`
	PositionsTopic  string `json:"positions_topic,omitempty"`
	// Position is null when none was committed yet, or when it could not be read (PositionError).
	Position      *positionReport `json:"committed_position"`
	PositionError string          `json:"position_error,omitempty"`
}

type positionReport struct {
	CommitLSN string `json:"commit_lsn"` // of the PostgreSQL transaction of the last committed event
	Events    int    `json:"events"`     // of that transaction committed in Kafka
}

// runStatus prints the slot at a glance and returns the exit code.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if configs, rest := configArgs(args); len(configs) > 1 {
		return runStatusShards(ctx, configs, rest, stdout, stderr)
	}
	fs, loader := newFlags("status", stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	var standbyDSNs []string
	fs.Func("standby-dsn", "a standby (its connection `string`, like pg_dsn) to check for a usable copy of the failover slot (PostgreSQL 17+); repeat for several",
		func(v string) error { standbyDSNs = append(standbyDSNs, v); return nil })
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg, err := loader.Load()
	if err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %v\n", err)
		return 1
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintf(stderr, "outbox-relay: warning: %s\n", w)
	}
	for _, dsn := range standbyDSNs {
		if config.DSNHasSecret(dsn) {
			fmt.Fprintf(stderr, "outbox-relay: warning: --standby-dsn %s holds a secret on the command line, where every user of the machine can read it (ps, /proc): put the password in pg_password_file (it applies to the standby too) or a ~/.pgpass file\n",
				config.RedactDSN(dsn))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	if cfg.Source == "poll" {
		return pollStatus(ctx, cfg, *asJSON, stdout, stderr)
	}
	secrets := secrets(cfg)
	for _, dsn := range standbyDSNs {
		secrets = append(secrets, (&config.Config{PGDSN: dsn}).Secrets()...)
	}
	rep, err := slotStatus(ctx, cfg, cfg.Slot)
	if err == nil {
		err = checkFailover(ctx, &rep, cfg, standbyDSNs)
	}
	if err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %s\n", config.Scrub(err.Error(), secrets...))
		return 1
	}
	if err := deliveryStatus(ctx, cfg, &rep); err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %s\n", config.Scrub(err.Error(), secrets...))
		return 1
	}
	if err := registryStatus(ctx, cfg, &rep); err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %s\n", config.Scrub(err.Error(), secrets...))
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printStatus(stdout, rep)
	}
	if !rep.OK {
		return exitSlotProblem
	}
	return 0
}

func slotStatus(ctx context.Context, cfg *config.Config, slot string) (statusReport, error) {
	conn, err := connectPostgres(ctx, cfg)
	if err != nil {
		return statusReport{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := slotmon.Read(ctx, conn, slot)
	if err != nil {
		return statusReport{}, err
	}
	rep := statusReport{State: st, CurrentWALLSN: st.CurrentLSN.String(), LeaderLockKey: leader.Key(slot), OK: true, Problems: []string{}, Warnings: []string{}}
	if rep.Failover, err = slotmon.ReadFailover(ctx, conn, slot); err != nil {
		return statusReport{}, err
	}
	if st.Exists {
		rep.ConfirmedFlushLSN, rep.RestartLSN = st.ConfirmedFlush.String(), st.RestartLSN.String()
	}
	holder, held, err := leader.LockHolder(ctx, conn, slot)
	if err != nil {
		return statusReport{}, err
	}
	if held {
		rep.Leader = &holder
	}
	if err := recoveryStatus(ctx, conn, cfg.Schema, slot, &rep); err != nil {
		return statusReport{}, fmt.Errorf("read the slot ledger: %w", err)
	}
	// A slot being created shows in pg_replication_slots already, active, confirmed at 0/0; its
	// creation may wait for ever on a transaction nobody ends.
	w, waits, err := replication.FindSlotCreationWait(ctx, conn, slot)
	if err != nil {
		return statusReport{}, err
	}
	if waits {
		rep.CreationWait = &w
		rep.OK = false
		rep.Problems = append(rep.Problems, fmt.Sprintf("the creation of replication slot %q (walsender PID %d) waits for %s", slot, w.Walsender, w.Describe(time.Now())))
	}
	switch reason := st.Invalidated(); {
	case !st.Exists:
		rep.OK = false
		rep.Problems = append(rep.Problems, fmt.Sprintf("replication slot %q does not exist in database %q: outbox-relay run creates it (create_slot), or check the slot and pg_dsn settings", slot, st.Database))
	case reason != "":
		rep.OK = false
		rep.Problems = append(rep.Problems, fmt.Sprintf("replication slot %q is invalidated (%s): %s, so events committed since %s may never be published: drop and recreate the slot, then reconcile the outbox rows written since then",
			slot, reason, invalidationCause(reason), st.ConfirmedFlush))
	}
	return rep, nil
}

// invalidationCause explains an invalidation reason (slotmon.State.Invalidated) to an operator.
func invalidationCause(reason string) string {
	switch reason {
	case "wal_removed":
		return "PostgreSQL removed WAL it still needed (max_slot_wal_keep_size)"
	case "idle_timeout":
		return "nothing streamed it for longer than idle_replication_slot_timeout"
	case "rows_removed":
		return "catalog rows it needed were removed (on a standby: set hot_standby_feedback with a physical slot)"
	case "wal_level_insufficient":
		return "wal_level on the primary is below logical"
	case "conflicting":
		return "it conflicts with recovery on this standby (catalog rows removed or wal_level below logical on the primary)"
	}
	return "PostgreSQL can no longer decode changes for it"
}

// positionReadTimeout bounds status's read of the committed position, within statusTimeout.
const positionReadTimeout = 8 * time.Second

// deliveryStatus adds the delivery mode and, with exactly-once, the position committed in Kafka
// (read with read_committed, fencing nobody) to rep. Kafka being unreachable is reported in the
// report, not as a failure of the command; a position the slot ledger says was committed and that
// Kafka no longer holds is a problem.
func deliveryStatus(ctx context.Context, cfg *config.Config, rep *statusReport) error {
	rep.Delivery.Mode = cfg.Delivery
	if !cfg.ExactlyOnce() {
		return nil
	}
	if cfg.TransactionalID == "" {
		id, err := defaultTransactionalID(ctx, cfg, zap.NewNop())
		if err != nil {
			return err
		}
		cfg.TransactionalID = id
	}
	rep.Delivery.TransactionalID, rep.Delivery.PositionsTopic = cfg.TransactionalID, cfg.PositionsTopic
	if len(cfg.KafkaBrokers) == 0 {
		rep.Delivery.PositionError = "kafka_brokers is not set, so the position committed in Kafka cannot be read"
		return nil
	}
	rcfg, err := relayConfig(cfg)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, positionReadTimeout)
	defer cancel()
	// ReadPosition creates a missing positions topic; status only looks.
	exists, err := topicExists(rctx, rcfg.Sink, cfg.PositionsTopic)
	var pos sink.Position
	found := false
	if err == nil && exists {
		pos, found, err = sink.ReadPosition(rctx, rcfg.Sink)
	}
	switch {
	case err != nil:
		rep.Delivery.PositionError = err.Error()
		return nil
	case found:
		rep.Delivery.Position = &positionReport{CommitLSN: pos.CommitLSN.String(), Events: pos.Events}
		return nil
	}
	conn, err := connectPostgres(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ledger := replication.NewLedger(cfg.Schema)
	if exists, err := ledger.Exists(ctx, conn); err != nil || !exists {
		return err
	}
	rec, marked, err := ledger.Positions(ctx, conn, cfg.Slot)
	if err != nil {
		rep.Delivery.PositionError = err.Error()
		return nil
	}
	if marked {
		rep.OK = false
		rep.Problems = append(rep.Problems, fmt.Sprintf("exactly-once: positions_topic %q holds no position for transactional id %q, but one was committed for slot %q (under transactional id %q in %q, recorded in %s): the relay refuses to start until this is resolved (see its error, or docs/operations.md)",
			cfg.PositionsTopic, cfg.TransactionalID, cfg.Slot, rec.TransactionalID, rec.PositionsTopic, ledger.Table()))
	}
	return nil
}

// registryStatus adds the schema registry, asked now, to rep when an encoding needs one; one that
// does not answer (or refuses the relay's credentials) is a problem.
func registryStatus(ctx context.Context, cfg *config.Config, rep *statusReport) error {
	client, err := newRegistryClient(cfg, nil, nil)
	if err != nil || client == nil {
		return err
	}
	defer client.Close()
	st := client.Status(ctx)
	rep.SchemaRegistry = &st
	if !st.Up {
		rep.OK = false
		rep.Problems = append(rep.Problems, fmt.Sprintf("schema registry %s does not answer (%s): events that need a schema the relay has not cached wait, holding the stream, until it does: check the registry and schema_registry.urls",
			strings.Join(st.URLs, ", "), st.Error))
	}
	return nil
}

// topicExists asks the brokers whether topic exists.
func topicExists(ctx context.Context, c sink.Config, topic string) (bool, error) {
	client, transport := sink.NewClient(c, positionReadTimeout)
	defer transport.CloseIdleConnections()
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	switch {
	case err != nil:
		return false, fmt.Errorf("metadata of positions topic %s: %w", topic, err)
	case len(md.Topics) != 1:
		return false, fmt.Errorf("metadata of positions topic %s: %d topics in the answer", topic, len(md.Topics))
	case errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition):
		return false, nil
	case md.Topics[0].Error != nil:
		return false, fmt.Errorf("positions topic %s: %w", topic, md.Topics[0].Error)
	}
	return true, nil
}

// printStatus prints rep for a person: a table of what is known, then the problems and warnings.
func printStatus(w io.Writer, rep statusReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "slot\t%s (database %s)\n", rep.Slot, rep.Database)
	if !rep.Exists {
		fmt.Fprintf(tw, "exists\tno\n")
	} else {
		printSlot(tw, rep)
	}
	if w := rep.CreationWait; w != nil {
		fmt.Fprintf(tw, "CREATION WAITS\tfor %s\n", w.Describe(time.Now()))
	}
	printLeaderLock(tw, rep.Leader)
	if rep.Exists {
		fmt.Fprintf(tw, "failover slot\t%s\n", rep.Failover.Describe())
	}
	if r := rep.Recovery; r != nil {
		printRecovery(tw, r)
	}
	printStandbys(tw, rep)
	printDelivery(tw, rep.Delivery)
	if r := rep.SchemaRegistry; r != nil {
		state := "up"
		if !r.Up {
			state = "DOWN"
		}
		fmt.Fprintf(tw, "schema registry\t%s (%s)\n", state, strings.Join(r.URLs, ", "))
	}
	tw.Flush()
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "PROBLEM: %s\n", p)
	}
	for _, p := range rep.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", p)
	}
}

// printSlot prints the rows of a slot that exists: who streams it, its WAL and its lag.
func printSlot(tw io.Writer, rep statusReport) {
	fmt.Fprintf(tw, "exists\tyes (plugin %s)\n", rep.Plugin)
	if rep.Active {
		fmt.Fprintf(tw, "active\tyes: backend PID %d%s\n", rep.ActivePID, describe(rep.ActiveApplicationName, rep.ActiveClientAddr))
	} else {
		fmt.Fprintf(tw, "active\tno: nothing streams the slot\n")
	}
	fmt.Fprintf(tw, "wal_status\t%s\n", rep.WALStatus)
	printVersioned(tw, rep.State)
	if rep.SafeWALSize != nil {
		fmt.Fprintf(tw, "safe_wal_size\t%s\n", bytesText(*rep.SafeWALSize))
	} else {
		fmt.Fprintf(tw, "safe_wal_size\tunlimited (max_slot_wal_keep_size = -1)\n")
	}
	fmt.Fprintf(tw, "confirmed LSN\t%s\n", rep.ConfirmedFlushLSN)
	fmt.Fprintf(tw, "current LSN\t%s\n", rep.CurrentWALLSN)
	fmt.Fprintf(tw, "lag\t%s (current - confirmed)\n", bytesText(rep.LagBytes))
	if rep.AheadOfWALBytes > 0 {
		fmt.Fprintf(tw, "AHEAD OF WAL\t%s: the slot is confirmed beyond the server's end of WAL (a data directory restored from an earlier copy?); transactions below it are skipped: docs/operations.md, \"Recovering a lost or missing slot\"\n", bytesText(rep.AheadOfWALBytes))
	}
	fmt.Fprintf(tw, "retained WAL\t%s (current - restart_lsn %s)\n", bytesText(rep.RetainedBytes), rep.RestartLSN)
}

func printLeaderLock(tw io.Writer, holder *leader.Holder) {
	if holder == nil {
		fmt.Fprintf(tw, "leader lock\tnot held: no relay with leader_election runs for this slot\n")
		return
	}
	since := ""
	if !holder.BackendStart.IsZero() {
		since = ", connected since " + holder.BackendStart.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(tw, "leader lock\theld by backend PID %d%s%s\n", holder.PID, describe(holder.ApplicationName, holder.ClientAddr), since)
}

// printRecovery prints what the slot ledger says of lost-slot recovery.
func printRecovery(tw io.Writer, r *recoveryReport) {
	if r.AcknowledgedCommitTime != nil {
		fmt.Fprintf(tw, "acknowledged\tKafka holds every event committed up to %s (a lost slot's gap starts there)\n", r.AcknowledgedCommitTime.UTC().Format(time.RFC3339Nano))
	}
	if r.AcknowledgedXmin != nil {
		fmt.Fprintf(tw, "horizon\tKafka holds the events of every transaction below id %d (a lost slot's gap is the rows of that id on)\n", *r.AcknowledgedXmin)
	}
	if r.UnderWaySince != nil {
		fmt.Fprintf(tw, "RECOVERY UNDER WAY\tthe gap of a lost slot (rows committed after %s) is being published\n", r.UnderWaySince.UTC().Format(time.RFC3339))
	}
	if l := r.Last; l != nil {
		fmt.Fprintf(tw, "last recovery\t%s: %d events committed after %s (rule %s) in %.1fs\n",
			l.At.UTC().Format(time.RFC3339), l.Events, l.After.UTC().Format(time.RFC3339), l.Rule, l.Seconds)
	}
}

// printStandbys prints each --standby-dsn standby's copy of the slot, and how far it trails.
func printStandbys(tw io.Writer, rep statusReport) {
	for _, sb := range rep.Standbys {
		state := "copy ready for a promotion"
		if !sb.Ready() {
			state = "NOT ready for a promotion"
		}
		fmt.Fprintf(tw, "standby %s\t%s\n", sb.Address, state)
		if sb.Supported && sb.Recovery {
			fmt.Fprintf(tw, "  copy of the slot\t%s\n", copyState(sb))
		}
		if sb.TrailBytes != nil {
			fmt.Fprintf(tw, "  copy trails by\t%s (primary confirmed %s - copy confirmed %s)\n", bytesText(*sb.TrailBytes), rep.ConfirmedFlushLSN, sb.ConfirmedFlushLSN)
		}
		if sb.RestartTrailBytes != nil {
			fmt.Fprintf(tw, "  copy restart trails by\t%s (primary restart_lsn %s - copy restart_lsn %s)\n", bytesText(*sb.RestartTrailBytes), rep.RestartLSN, sb.RestartLSN)
		}
	}
}

// printDelivery prints the delivery mode and, with exactly-once, the position committed in Kafka.
func printDelivery(tw io.Writer, d deliveryReport) {
	fmt.Fprintf(tw, "delivery\t%s\n", d.Mode)
	if d.Mode != config.DeliveryExactlyOnce {
		return
	}
	fmt.Fprintf(tw, "transactional id\t%s\n", d.TransactionalID)
	switch {
	case d.Position != nil:
		fmt.Fprintf(tw, "committed position\t%d events of the transaction committed at %s (in %s)\n", d.Position.Events, d.Position.CommitLSN, d.PositionsTopic)
	case d.PositionError != "":
		fmt.Fprintf(tw, "committed position\tunknown: %s\n", d.PositionError)
	default:
		fmt.Fprintf(tw, "committed position\tnone yet (in %s)\n", d.PositionsTopic)
	}
}

// copyState says in a few words what a standby's copy of the slot is.
func copyState(sb slotmon.Standby) string {
	switch {
	case !sb.SlotExists:
		return "missing: a promotion now loses the slot"
	case sb.InvalidationReason != "":
		return "invalidated (" + sb.InvalidationReason + "): a promotion now loses the slot"
	case !sb.Persisted:
		return fmt.Sprintf("temporary (synced %v): not persisted yet, a promotion now drops it and loses the slot", sb.Synced)
	}
	return "persisted (synced, not temporary): a promotion keeps it"
}

// checkFailover adds what a failover would cost: warnings from the primary's view, and a problem
// for each standby given with --standby-dsn whose promotion now would lose the slot.
func checkFailover(ctx context.Context, rep *statusReport, cfg *config.Config, standbyDSNs []string) error {
	fo := rep.Failover
	switch {
	case !rep.Exists:
	case cfg.Failover && !fo.Supported:
		rep.Warnings = append(rep.Warnings, "failover is true, but this PostgreSQL has no failover slots (17+): the relay refuses to start with it")
	case cfg.Failover && !fo.Failover:
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("failover is true but slot %q is not a failover slot yet: the relay makes it one at its next connection", rep.Slot))
	case fo.Failover && len(fo.StandbySlots) == 0:
		rep.Warnings = append(rep.Warnings, "synchronized_standby_slots is empty: the relay may publish transactions no standby has received, which after a failover to such a standby are in Kafka but not in the database; set it to the physical slots of the standbys that may be promoted")
	case fo.Failover && !fo.Protected():
		rep.Warnings = append(rep.Warnings, "a slot of synchronized_standby_slots is missing or not streamed: PostgreSQL sends the relay nothing beyond what that standby has received, so the relay waits until it is back (or leaves synchronized_standby_slots)")
	}
	for _, dsn := range standbyDSNs {
		sb, err := readStandby(ctx, cfg, dsn, cfg.Slot)
		if err != nil {
			return err
		}
		sb.Trail(rep.State)
		rep.Standbys = append(rep.Standbys, sb)
		if p := sb.Problem(cfg.Slot); p != "" {
			rep.OK = false
			rep.Problems = append(rep.Problems, p)
		}
	}
	return nil
}

// readStandby reads a standby's copy of the slot, with the relay's own credentials (pg_password_file
// and TLS settings apply to the standby too).
func readStandby(ctx context.Context, cfg *config.Config, dsn, slot string) (slotmon.Standby, error) {
	conn, err := connectPostgres(ctx, &config.Config{PGDSN: dsn, PGPasswordFile: cfg.PGPasswordFile})
	if err != nil {
		return slotmon.Standby{}, fmt.Errorf("connect to the standby (--standby-dsn %s): %w", config.RedactDSN(dsn), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	addr := conn.PgConn().Conn().RemoteAddr().String()
	return slotmon.ReadStandby(ctx, conn, addr, slot)
}

// printVersioned prints the slot's columns that only newer servers have, and nothing for the
// ones this server lacks.
func printVersioned(w io.Writer, st slotmon.State) {
	if c := st.InvalidationReason; c.Known {
		if c.Value == nil {
			fmt.Fprintf(w, "invalidation_reason\tnone\n")
		} else {
			fmt.Fprintf(w, "invalidation_reason\t%s\n", *c.Value)
		}
	}
	if c := st.Conflicting; c.Known && c.Value != nil {
		fmt.Fprintf(w, "conflicting\t%s\n", map[bool]string{true: "yes", false: "no"}[*c.Value])
	}
	if c := st.InactiveSince; c.Known {
		if c.Value == nil {
			fmt.Fprintf(w, "inactive_since\t- (streamed now)\n")
		} else {
			fmt.Fprintf(w, "inactive_since\t%s (%s ago)\n", c.Value.UTC().Format(time.RFC3339), time.Since(*c.Value).Round(time.Second))
		}
	}
	if c := st.IdleTimeout; c.Value != nil {
		if *c.Value == 0 {
			fmt.Fprintf(w, "idle_replication_slot_timeout\toff\n")
		} else {
			fmt.Fprintf(w, "idle_replication_slot_timeout\t%s: a slot inactive for longer is invalidated\n", time.Duration(*c.Value)*time.Second)
		}
	}
}

func describe(app, addr string) string {
	s := ""
	if app != "" {
		s += fmt.Sprintf(", application_name %q", app)
	}
	if addr != "" {
		s += ", client " + addr
	}
	return s
}

// bytesText prints a byte count exactly and, when large, in binary units too.
func bytesText(n int64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	v, unit := float64(n), ""
	for _, u := range units {
		if v < 1024 && v > -1024 {
			break
		}
		v /= 1024
		unit = u
	}
	if unit == "" {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%d bytes (%.1f %s)", n, v, unit)
}

// configArgs splits a command line into its --config files and the other arguments.
func configArgs(args []string) (configs, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return configs, append(rest, args[i:]...)
		case (a == "--config" || a == "-config") && i+1 < len(args):
			configs = append(configs, args[i+1])
			i++
		case strings.HasPrefix(a, "--config="), strings.HasPrefix(a, "-config="):
			configs = append(configs, a[strings.Index(a, "=")+1:])
		default:
			rest = append(rest, a)
		}
	}
	return configs, rest
}

// shardStatus is one shard's entry of `outbox-relay status --json` given several --config files.
type shardStatus struct {
	Config   string          `json:"config"`
	ExitCode int             `json:"exit_code"`
	Report   json.RawMessage `json:"report"` // null when the status could not be asked (exit 1 or 2)
}

// runStatusShards is status over the shards of a sharded outbox (docs/scaling.md), one --config
// each, the other arguments applying to all: each shard's report under its file's name, its
// errors on stderr prefixed with it. The exit code is the worst of the shards': a usage error (2),
// then a failure to ask (1), then a slot problem (3), so a script sees any shard's trouble.
func runStatusShards(ctx context.Context, configs, rest []string, stdout, stderr io.Writer) int {
	asJSON := slices.ContainsFunc(rest, func(a string) bool { return a == "--json" || a == "-json" || a == "--json=true" || a == "-json=true" })
	worst := 0
	rank := map[int]int{0: 0, exitSlotProblem: 1, 1: 2, 2: 3}
	var shards []shardStatus
	for _, c := range configs {
		var out, errs bytes.Buffer
		code := runStatus(ctx, append([]string{"--config", c}, rest...), &out, &errs)
		for line := range strings.Lines(errs.String()) {
			fmt.Fprint(stderr, strings.Replace(line, "outbox-relay: ", "outbox-relay: "+c+": ", 1))
		}
		if rank[code] > rank[worst] {
			worst = code
		}
		if asJSON {
			s := shardStatus{Config: c, ExitCode: code, Report: json.RawMessage("null")}
			if json.Valid(out.Bytes()) && out.Len() > 0 {
				s.Report = bytes.TrimSpace(out.Bytes())
			}
			shards = append(shards, s)
			continue
		}
		fmt.Fprintf(stdout, "== %s (exit %d)\n", c, code)
		stdout.Write(out.Bytes())
		fmt.Fprintln(stdout)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(shards)
	}
	return worst
}
