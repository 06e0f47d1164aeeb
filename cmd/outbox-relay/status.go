package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/slotmon"
)

// exitSlotProblem is status's exit code when the slot is missing or has lost WAL: scripts and
// probes can tell it from a failure to ask (1) and a usage error (2).
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
	Delivery          deliveryReport `json:"delivery"`
	OK                bool           `json:"ok"`
	Problems          []string       `json:"problems"`
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
	fs := flag.NewFlagSet("outbox-relay status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	loader := config.NewLoader(fs, nil).WithoutKafka()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outbox-relay status: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg, err := loader.Load()
	if err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	rep, err := slotStatus(ctx, cfg.PGDSN, cfg.Slot)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %s\n", config.Scrub(err.Error(), cfg.Secrets()...))
		return 1
	}
	if err := deliveryStatus(ctx, cfg, &rep); err != nil {
		fmt.Fprintf(stderr, "outbox-relay: %s\n", config.Scrub(err.Error(), cfg.Secrets()...))
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

func slotStatus(ctx context.Context, dsn, slot string) (statusReport, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return statusReport{}, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st, err := slotmon.Read(ctx, conn, slot)
	if err != nil {
		return statusReport{}, err
	}
	rep := statusReport{State: st, CurrentWALLSN: st.CurrentLSN.String(), LeaderLockKey: leader.Key(slot), OK: true, Problems: []string{}}
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
	switch {
	case !st.Exists:
		rep.OK = false
		rep.Problems = append(rep.Problems, fmt.Sprintf("replication slot %q does not exist in database %q: outbox-relay run creates it (create_slot), or check the slot and pg_dsn settings", slot, st.Database))
	case st.WALStatus == "lost":
		rep.OK = false
		rep.Problems = append(rep.Problems, fmt.Sprintf("replication slot %q has wal_status \"lost\": PostgreSQL removed WAL it still needed, so events committed since %s may never be published: drop and recreate the slot, then reconcile the outbox rows written since then", slot, st.ConfirmedFlush))
	}
	return rep, nil
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
		id, err := relay.TransactionalID(ctx, cfg.PGDSN, cfg.Slot, zap.NewNop())
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
	conn, err := pgx.Connect(ctx, cfg.PGDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
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

// topicExists asks the brokers whether topic exists.
func topicExists(ctx context.Context, c sink.Config, topic string) (bool, error) {
	transport := &kafka.Transport{ClientID: c.ClientID, TLS: c.TLS, SASL: c.SASL, DialTimeout: 5 * time.Second}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(c.Brokers...), Transport: transport}
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

func printStatus(w io.Writer, rep statusReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "slot\t%s (database %s)\n", rep.Slot, rep.Database)
	if !rep.Exists {
		fmt.Fprintf(tw, "exists\tno\n")
	} else {
		fmt.Fprintf(tw, "exists\tyes (plugin %s)\n", rep.Plugin)
		if rep.Active {
			fmt.Fprintf(tw, "active\tyes: backend PID %d%s\n", rep.ActivePID, describe(rep.ActiveApplicationName, rep.ActiveClientAddr))
		} else {
			fmt.Fprintf(tw, "active\tno: nothing streams the slot\n")
		}
		fmt.Fprintf(tw, "wal_status\t%s\n", rep.WALStatus)
		if rep.SafeWALSize != nil {
			fmt.Fprintf(tw, "safe_wal_size\t%s\n", bytesText(*rep.SafeWALSize))
		} else {
			fmt.Fprintf(tw, "safe_wal_size\tunlimited (max_slot_wal_keep_size = -1)\n")
		}
		fmt.Fprintf(tw, "confirmed LSN\t%s\n", rep.ConfirmedFlushLSN)
		fmt.Fprintf(tw, "current LSN\t%s\n", rep.CurrentWALLSN)
		fmt.Fprintf(tw, "lag\t%s (current - confirmed)\n", bytesText(rep.LagBytes))
		fmt.Fprintf(tw, "retained WAL\t%s (current - restart_lsn %s)\n", bytesText(rep.RetainedBytes), rep.RestartLSN)
	}
	if rep.Leader != nil {
		since := ""
		if !rep.Leader.BackendStart.IsZero() {
			since = ", connected since " + rep.Leader.BackendStart.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "leader lock\theld by backend PID %d%s%s\n", rep.Leader.PID, describe(rep.Leader.ApplicationName, rep.Leader.ClientAddr), since)
	} else {
		fmt.Fprintf(tw, "leader lock\tnot held: no relay with leader_election runs for this slot\n")
	}
	d := rep.Delivery
	fmt.Fprintf(tw, "delivery\t%s\n", d.Mode)
	if d.Mode == config.DeliveryExactlyOnce {
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
	tw.Flush()
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "PROBLEM: %s\n", p)
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
