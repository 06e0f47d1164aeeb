package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replay"
	"github.com/outbox-relay/outbox-relay/sink"
)

// runReplay publishes outbox rows still in the table again, through the sink and the failure
// policy of `run`, marked outbox.replay=true. It reads the table only, never the slot: it runs next
// to a streaming relay.
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sel, loader, err := replayArgs(args, stderr)
	if err != nil {
		return err
	}
	cfg, err := loader.Load()
	if err != nil {
		return err
	}
	if !cfg.UsesTable() {
		return errors.New("config key outbox_shape is messages: a logical decoding message is stored nowhere but the WAL, so there is no outbox row to replay")
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	rc, err := relayConfig(cfg)
	if err != nil {
		return err
	}
	table := replay.Table{Schema: cfg.Schema, Name: cfg.Table, Columns: rc.Decoder.Columns, Extra: rc.Decoder.Extra,
		Created: cfg.Columns.CreatedAt, Order: cfg.BackfillOrder}
	if err := table.Validate(sel); err != nil {
		fmt.Fprintf(stderr, "outbox-relay %v\n", err)
		return errUsage
	}
	reg := prometheus.NewRegistry()
	res, took, err := publishReplay(ctx, cfg, rc.Sink, table, sel, log, reg)
	if err != nil {
		return err
	}
	target := cfg.Schema + "." + cfg.Table
	if sel.DryRun {
		fmt.Fprintf(stdout, "dry run: %d events of %s selected, nothing published\n", res.Selected, target)
		return nil
	}
	dead := counterSum(reg, "outbox_relay_events_dead_lettered_total")
	fmt.Fprintf(stdout, "replayed %d events of %s (header %s=true) in %s: %d acknowledged by Kafka, %d dead-lettered\n",
		res.Published, target, replay.Header, took.Round(time.Millisecond), res.Published-int64(dead), int64(dead))
	return nil
}

// replayArgs reads replay's command line: the selection, checked as far as it can be without the
// configuration, and the loader of the configuration.
func replayArgs(args []string, stderr io.Writer) (replay.Selection, *config.Loader, error) {
	fs, loader := newFlags("replay", stderr)
	var ids listFlag
	fs.Var(&ids, "event-id", "replay the event with this `id` (repeat the flag, or separate ids with commas)")
	aggType := fs.String("aggregate-type", "", "replay the events of one aggregate: its type (with --aggregate-id)")
	aggID := fs.String("aggregate-id", "", "replay the events of one aggregate: its id (with --aggregate-type)")
	fromVersion := fs.Int64("from-version", 0, "with an aggregate: from this aggregate version on (needs columns.aggregate_version)")
	toVersion := fs.Int64("to-version", 0, "with an aggregate: up to this aggregate version (inclusive)")
	since := fs.String("since", "", "replay the events created at or after this RFC 3339 time, or this long ago (e.g. 2h)")
	until := fs.String("until", "", "with --since: only events created before this RFC 3339 time, or this long ago")
	partial := fs.Bool("partial", false, "publish what is left of a selection some rows of which were pruned, instead of refusing")
	dryRun := fs.Bool("dry-run", false, "check and count the selection, publish nothing")
	if err := parseFlags(fs, args); err != nil {
		return replay.Selection{}, nil, err
	}
	now := time.Now()
	sel := replay.Selection{EventIDs: ids, AggregateType: *aggType, AggregateID: *aggID,
		FromVersion: *fromVersion, ToVersion: *toVersion, Partial: *partial, DryRun: *dryRun}
	for _, f := range []struct {
		name, value string
		dst         *time.Time
	}{{"since", *since, &sel.Since}, {"until", *until, &sel.Until}} {
		if f.value == "" {
			continue
		}
		t, err := timeOrAgo(f.value, now)
		if err != nil {
			fmt.Fprintf(stderr, "outbox-relay replay: --%s: %v\n", f.name, err)
			return replay.Selection{}, nil, errUsage
		}
		*f.dst = t
	}
	if *fromVersion < 0 || *toVersion < 0 {
		fmt.Fprintln(stderr, "outbox-relay replay: --from-version and --to-version must not be negative")
		return replay.Selection{}, nil, errUsage
	}
	return sel, loader, nil
}

// publishReplay publishes the selected rows through a sink of their own, counted in reg, and
// closes it: the result counts what was published, took is how long reading, publishing and
// closing took (once the sink was ready and the database connected), and an error says how far it
// got.
func publishReplay(ctx context.Context, cfg *config.Config, sinkCfg sink.Config, table replay.Table, sel replay.Selection, log *zap.Logger, reg *prometheus.Registry) (res replay.Result, took time.Duration, err error) {
	s, err := sink.New(replay.SinkConfig(sinkCfg), log, metrics.New(reg))
	if err != nil {
		return replay.Result{}, 0, err
	}
	// A halt (on_failure: halt) never acknowledges its event: end the wait for it with the reason.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go watchSinkHalt(ctx, s, cancel)
	if !sel.DryRun {
		if err := s.WaitReady(ctx); err != nil {
			return replay.Result{}, 0, fmt.Errorf("kafka: %w", err)
		}
	}
	conn, err := connect(ctx, cfg)
	if err != nil {
		return replay.Result{}, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	started := time.Now()
	res, runErr := replay.Run(ctx, conn, table, sel, s)
	closeCtx, closeCancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer closeCancel()
	closeErr := s.Close(closeCtx) // waits for Kafka's last acknowledgements: part of the replay's time
	took = time.Since(started)
	if cause := context.Cause(ctx); runErr != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		runErr = cause
	}
	if runErr != nil {
		return res, took, scrubbed(cfg, fmt.Errorf("%w (%d of %d selected events published before)", runErr, res.Published, res.Selected))
	}
	return res, took, closeErr
}

// watchSinkHalt ends ctx with the halt's reason once the sink halts.
func watchSinkHalt(ctx context.Context, s *sink.Sink, cancel context.CancelCauseFunc) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if id, reason, err, halted := s.Halted(); halted {
			cancel(fmt.Errorf("halted (on_failure: halt) on event %s: %s: %v", id, reason, err))
			return
		}
	}
}

// counterSum adds up every series of a counter in reg.
func counterSum(reg *prometheus.Registry, name string) float64 {
	families, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// timeOrAgo reads an RFC 3339 time, or a duration before now.
func timeOrAgo(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("want an RFC 3339 time (2026-01-02T15:04:05Z) or a positive duration (24h), got %q", v)
}

// listFlag collects a repeatable, comma-separated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
