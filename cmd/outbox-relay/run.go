package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/credentials"
	"github.com/outbox-relay/outbox-relay/health"
	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/prune"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/slotmon"
)

func runRelay(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := loadConfig("run", args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()

	if cfg.ExactlyOnce() && cfg.TransactionalID == "" {
		id, err := defaultTransactionalID(ctx, cfg, log)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return scrubbed(cfg, err)
		}
		cfg.TransactionalID = id
	}
	rcfg, err := relayConfig(cfg)
	if err != nil {
		return err
	}
	// Fail on a bad configuration now, not when a standby first becomes leader.
	probe, err := relay.New(rcfg, log, metrics.New(nil))
	if err != nil {
		return err
	}
	probe.Sink().Close(ctx)
	// What the process learns of its slot outlives each leadership term's relay (replication.Memory).
	rcfg.Replication.Memory = replication.NewMemory()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	m.Source.WithLabelValues(cfg.Source).Set(1)
	state := &health.State{}
	if cfg.MetricsAddr != "" {
		stopHTTP, err := serveHTTP(cfg.MetricsAddr, reg, state, log)
		if err != nil {
			return err
		}
		defer stopHTTP()
	}
	log.Info("starting",
		zap.String("version", version),
		zap.String("pg_dsn", config.RedactDSN(cfg.PGDSN)),
		zap.String("pg_password_file", cfg.PGPasswordFile), // the path; never the content
		zap.Strings("kafka_brokers", cfg.KafkaBrokers),
		zap.Bool("kafka_tls", cfg.Kafka.TLS.Enabled),
		zap.String("kafka_sasl_mechanism", cfg.Kafka.SASL.Mechanism),
		zap.String("source", cfg.Source),
		zap.String("slot", cfg.Slot),
		zap.String("publication", cfg.Publication),
		zap.String("table", cfg.Schema+"."+cfg.Table),
		zap.String("topic_template", cfg.TopicTemplate),
		zap.Bool("leader_election", cfg.LeaderElection),
		zap.String("leader_dsn", config.RedactDSN(cfg.LeaderDSN)),
		zap.Duration("leader_kafka_timeout", cfg.LeaderKafkaTimeout),
		zap.String("delivery", cfg.Delivery))
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
	if cfg.ExactlyOnce() {
		log.Info("exactly-once delivery: events are published in Kafka transactions; consumers must read with isolation.level=read_committed",
			zap.String("transactional_id", cfg.TransactionalID), zap.String("positions_topic", cfg.PositionsTopic),
			zap.Duration("transaction_interval", cfg.TransactionInterval), zap.Int("transaction_max_events", min(cfg.TransactionMaxEvents, max(1, cfg.MaxInFlight/2))), // the sink's cap: half the window
			zap.Int("max_in_flight_events", cfg.MaxInFlight))
	}

	// The slot monitor and the readiness gauge outlive ctx, so they keep reporting through the
	// graceful drain; they stop when the relay has.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	monDone := make(chan struct{})
	defer func() {
		stopBG()
		// The monitor says nothing once it sees the cancellation: waiting for it keeps its
		// warnings ahead of the line that ends the relay (an error's, which must be the last).
		select {
		case <-monDone:
		case <-time.After(2 * time.Second):
		}
	}()
	if cfg.Source == "wal" {
		// The polling source reads its own gauges (package poll); there is no slot to watch.
		mon := slotmon.New(slotmon.Config{DSN: cfg.PGDSN, PasswordFile: cfg.PGPasswordFile, Slot: cfg.Slot, Interval: cfg.SlotPollInterval,
			StandbyDSN: cfg.FailoverStandbyDSN, OnPoll: state.PostgresPolled}, log.Named("slotmon"), m)
		go func() {
			defer close(monDone)
			mon.Run(bg)
		}()
	} else {
		close(monDone)
	}
	go publishReadiness(bg, state, m)
	stopReporting := context.AfterFunc(ctx, state.Stopping)
	defer stopReporting()
	if cfg.PruneInterval > 0 {
		stopPruning, err := startPruning(ctx, cfg, log.Named("prune"), m)
		if err != nil {
			return scrubbed(cfg, err)
		}
		defer stopPruning()
	}

	if cfg.LeaderElection {
		err = runLeaderLoop(ctx, cfg, rcfg, log, m, state)
	} else {
		err = runTerm(ctx, nil, rcfg, log, m, state, 0)
	}
	if err != nil {
		// Driver errors can quote connection parameters; never let a secret reach the terminal.
		return scrubbed(cfg, err)
	}
	log.Info("stopped")
	return nil
}

// runLeaderLoop stands by until this instance holds the leader lock, streams while it does, and
// stands by again when it loses it. It returns when ctx ends or on an error retrying cannot fix.
func runLeaderLoop(ctx context.Context, cfg *config.Config, rcfg relay.Config, log *zap.Logger, m *metrics.Metrics, state *health.State) error {
	handovers := 0 // in a row, for the pause before competing again
	el := leader.New(leader.Config{
		DSN:           cmp.Or(cfg.LeaderDSN, cfg.PGDSN),
		PasswordFile:  cfg.PGPasswordFile,
		Slot:          cfg.Slot,
		RetryInterval: cfg.LeaderRetryInterval,
		CheckTimeout:  cfg.LeaderCheckTimeout,
		OnStandby:     state.Standby,
		OnSlowCheck:   func(time.Duration) { m.LeaderSlowChecks.Inc() },
		BeforeLock:    kafkaAnswers(cfg, rcfg, func() bool { return handovers > 0 }),
	}, log.Named("leader"))
	var busySince time.Time // while this instance holds the lock but someone else streams the slot
	for {
		state.Standby(false)
		term, err := el.Campaign(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		log.Info("leader: holding the leader lock; streaming the slot",
			zap.String("slot", cfg.Slot), zap.Uint32("lock_backend_pid", term.PID()))
		began := time.Now()
		err = runTerm(ctx, term, rcfg, log, m, state, cfg.LeaderKafkaTimeout)
		term.Release()
		if !errors.Is(err, replication.ErrSlotActive) {
			busySince = time.Time{}
		}
		if !errors.Is(err, errKafkaSilent) || time.Since(began) > maxHandoverPause {
			handovers = 0
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errKafkaSilent):
			handovers++
			pause := handoverPause(handoverBase(cfg.LeaderRetryInterval), handovers)
			log.Warn("released the leader lock, cut off from Kafka; competing again after a pause, and only once Kafka answers",
				zap.String("slot", cfg.Slot), zap.Duration("pause", pause), zap.Int("handovers_in_a_row", handovers))
			state.Standby(true)
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return nil
			}
		case errors.Is(err, relay.ErrFenced):
			// Campaign again at once: usually another instance has the lock by now and this one
			// becomes its standby; if PostgreSQL restarted, this one may simply lead again.
			continue
		case errors.Is(err, replication.ErrSlotActive):
			// Someone outside the election streams the slot (a relay with leader_election off,
			// Debezium, or a walsender PostgreSQL has not reaped yet): not a crash, wait our turn.
			// Past slot_busy_wait it is no longer a walsender being reaped, so say so louder.
			if busySince.IsZero() {
				busySince = time.Now()
			}
			level := zap.InfoLevel
			msg := "another process streams the slot; standing by and retrying"
			if time.Since(busySince) > cfg.SlotBusyWait {
				level = zap.WarnLevel
				msg = "a process outside the leader election has streamed the slot for longer than slot_busy_wait (another relay with leader_election off, or Debezium?); standing by until it stops"
			}
			log.Check(level, msg).Write(
				zap.String("slot", cfg.Slot), zap.String("detail", config.Scrub(err.Error(), secrets(cfg)...)),
				zap.Duration("retry_in", cfg.LeaderRetryInterval))
			state.Standby(true)
			select {
			case <-time.After(cfg.LeaderRetryInterval):
			case <-ctx.Done():
				return nil
			}
		case err != nil:
			return err
		}
	}
}

// runTerm runs relays until ctx ends or, with a term, until the term is lost: then the relay is
// fenced, stopping at once without the graceful drain. Relays are single-use: one that asks to
// start afresh (relay.ErrRestart: an aborted Kafka transaction) is replaced by a new one.
//
// A relay that Kafka fenced (relay.ErrSuperseded: another producer took its transactional id) has
// stopped publishing already. Its term decides what follows: a zombie (a leader paused past its
// lease, whose lock is gone and whose standby took over) finds its term lost within a check or
// two, and stands by like any fenced leader; a relay that still holds its lock was fenced by
// something outside the election (two slots configured with one transactional_id, or a relay with
// leader_election off), and ends with an error rather than fence that one in turn.
func runTerm(ctx context.Context, term *leader.Term, rcfg relay.Config, log *zap.Logger, m *metrics.Metrics, state *health.State, kafkaTimeout time.Duration) error {
	restarts := 0
	for {
		started := time.Now()
		err := runRelayOnce(ctx, term, rcfg, log, m, state, kafkaTimeout)
		switch {
		case errors.Is(err, relay.ErrRestart) && ctx.Err() == nil:
			if time.Since(started) > time.Minute {
				restarts = 0 // it ran a while: a new failure, not the same one again
			}
			delay := min(restartDelay<<min(restarts, 5), 30*time.Second)
			restarts++
			log.Warn("exactly-once: a Kafka transaction was aborted; starting afresh from the position committed in Kafka (what the aborted transaction held is published again, in a new transaction)",
				zap.Error(err), zap.Duration("retry_in", delay))
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			if term != nil && term.Err() != nil {
				// Lost meanwhile: a fresh relay's producer would fence the new leader's.
				return relay.ErrFenced
			}
			continue
		case errors.Is(err, relay.ErrSuperseded) && term != nil:
			return supersededTerm(ctx, term, err, log)
		case errors.Is(err, relay.ErrSuperseded):
			return fmt.Errorf("%w; with leader_election off, stop the other relay that uses this transactional_id (or give each slot its own)", err)
		}
		return err
	}
}

// restartDelay is the first pause before a relay starts afresh after an aborted Kafka transaction;
// it doubles, up to 30s, while the fresh relays keep failing within a minute, so a broker that
// keeps aborting them is not hammered.
const restartDelay = time.Second

// supersededGrace is how long a relay fenced by Kafka waits for its term to be found lost: the
// term checks its lock connection every second, and a check gets leader_check_timeout (5s by
// default) at most; a resumed zombie fails its first check at once, its lease being long past.
const supersededGrace = 10 * time.Second

// supersededTerm decides what a relay that Kafka fenced does next (see runTerm): stand by when its
// term is lost too, end with an error when it still holds the lock.
func supersededTerm(ctx context.Context, term *leader.Term, err error, log *zap.Logger) error {
	select {
	case <-term.Lost():
		log.Error("fenced by Kafka and lost the leader lock: another instance leads now (this one was paused past its lease); it published nothing more, and nothing of its open Kafka transaction is visible to read_committed consumers. Standing by",
			zap.Error(err), zap.NamedError("lock", term.Err()))
		return relay.ErrFenced
	case <-time.After(supersededGrace):
	case <-ctx.Done():
		return nil
	}
	return fmt.Errorf("%w, while this instance still holds the leader lock of its slot: a producer outside the leader election uses the same transactional_id (two slots configured with one transactional_id, or a relay with leader_election off). Give each slot its own transactional_id, and stop relays that run without the election", err)
}

// runRelayOnce builds a relay and runs it until ctx ends or, with a term, until the term is lost or
// (kafkaTimeout > 0) Kafka has not answered for kafkaTimeout while events waited (handover.go).
func runRelayOnce(ctx context.Context, term *leader.Term, rcfg relay.Config, log *zap.Logger, m *metrics.Metrics, state *health.State, kafkaTimeout time.Duration) error {
	if term != nil {
		// The next leader ends exactly this relay's walsender should this one be cut off: each
		// session publishes it before it uses the slot.
		rcfg.Replication.OnWalsender = term.PublishWalsender
	}
	r, err := relay.New(rcfg, log, m)
	if err != nil {
		return err
	}
	m.Halted.Set(0)
	m.Leader.Set(1)
	state.Lead(relayHealth{r})
	defer m.EndTerm()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	// fence says why (an ERROR line), stops the relay at once and waits for its run to end. This
	// instance stops leading at the fence, not once the run has ended: another instance may take
	// over at once, and two instances reporting leadership at the same time are two leaders to
	// whoever watches.
	fence := func(why string, fields ...zap.Field) error {
		m.Leader.Set(0)
		log.Error(why, fields...)
		began := time.Now()
		r.Fence()
		err := <-done
		log.Info("the fenced relay stopped; standing by", zap.Duration("took", time.Since(began).Round(time.Millisecond)))
		return err
	}
	var lost <-chan struct{}
	var silent <-chan time.Duration
	if term != nil {
		lost = term.Lost()
		if kafkaTimeout > 0 {
			wctx, stopWatch := context.WithCancel(ctx)
			defer stopWatch()
			silent = watchKafka(wctx, r.Sink(), kafkaTimeout, func() bool { return term.Standbys() > 0 })
		}
	}
	select {
	case err := <-done:
		return err
	case <-lost:
	case d := <-silent:
		err := fence("no Kafka acknowledgement while events waited for leader_kafka_timeout; handing over: streaming stops now without confirming what Kafka did not acknowledge, and the leader lock is released for a standby that can reach Kafka",
			zap.Duration("silent_for", d.Round(time.Millisecond)), zap.Duration("leader_kafka_timeout", kafkaTimeout), zap.Strings("kafka_brokers", rcfg.Sink.Brokers),
			zap.Int("standbys_ready", term.Standbys()))
		if err != nil && !errors.Is(err, relay.ErrFenced) {
			return err
		}
		return fmt.Errorf("%w for %s (leader_kafka_timeout %s)", errKafkaSilent, d.Round(time.Millisecond), kafkaTimeout)
	}
	m.Fenced.Inc()
	err = fence("lost the leader lock connection; fencing: streaming stops now and unconfirmed events are replayed by the next leader",
		zap.Error(term.Err()))
	if err == nil {
		err = relay.ErrFenced // ctx ended at the same moment; the loop sees ctx first
	}
	return err
}

// startPruning deletes relayed rows periodically. It runs on every instance, leader or not: the
// WAL already holds every committed event, so deleting rows does not affect streaming, and batches
// skip rows another pruner has locked. What reads the table (polling, a lost slot's recovery) is
// guarded: OnlyProcessed, and guardPrune's ledger bounds.
func startPruning(ctx context.Context, cfg *config.Config, log *zap.Logger, m *metrics.Metrics) (stop func(), err error) {
	pcfg, err := pgxpool.ParseConfig(cfg.PGDSN)
	if err != nil {
		return nil, fmt.Errorf("prune: config key pg_dsn: %w", err)
	}
	// The pool opens connections as it needs them: each reads the password file and the TLS files
	// as they are then, like every other connection of the relay.
	pcfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		fresh, err := credentials.PostgresConfig(cfg.PGDSN, cfg.PGPasswordFile)
		if err != nil {
			return err
		}
		cc.Password, cc.TLSConfig, cc.Fallbacks = fresh.Password, fresh.TLSConfig, fresh.Fallbacks
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("prune: connect to PostgreSQL: %w", err)
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	opts := prune.Options{
		Table:     cfg.Schema + "." + cfg.Table,
		Column:    cfg.Columns.CreatedAt,
		OlderThan: cfg.PruneOlderThan,
		BatchSize: cfg.PruneBatchSize,
		// Polling reads the table: only rows it has processed may go.
		OnlyProcessed: cfg.Source == "poll",
	}
	guardPrune(&opts, cfg, pool)
	go func() {
		defer close(done)
		prune.Loop(pctx, pool, opts, cfg.PruneInterval, func(deleted int64, err error) {
			m.PrunedRows.Add(float64(deleted))
			if err != nil && pctx.Err() == nil {
				log.Warn("prune failed; retrying at the next interval", zap.Error(err))
			} else if deleted > 0 {
				log.Info("pruned relayed outbox rows", zap.Int64("rows", deleted), zap.Duration("older_than", cfg.PruneOlderThan))
			}
		})
	}()
	return func() {
		cancel()
		<-done
		pool.Close()
	}, nil
}

// relayHealth adapts a relay to what readiness needs.
type relayHealth struct{ r *relay.Relay }

func (h relayHealth) Streaming() bool { return h.r.Streaming() }

func (h relayHealth) Halted() (string, bool) {
	_, reason, _, halted := h.r.Sink().Halted()
	return reason, halted
}

// Stalled reports a Kafka topic every event waits for (health.Staller).
func (h relayHealth) Stalled() (string, bool) { return h.r.Sink().Stalled() }

// readinessPeriod is how often the ready gauge is refreshed; /readyz itself is computed per request.
const readinessPeriod = time.Second

func publishReadiness(ctx context.Context, state *health.State, m *metrics.Metrics) {
	ticker := time.NewTicker(readinessPeriod)
	defer ticker.Stop()
	for {
		if ok, _ := state.Ready(); ok {
			m.Ready.Set(1)
		} else {
			m.Ready.Set(0)
		}
		select {
		case <-ticker.C:
		case <-ctx.Done():
			return
		}
	}
}

// newHTTPServer is the metrics and health server: every phase of a connection is bounded, so
// clients that open connections and send or read nothing (or slowly) cannot hold goroutines and
// file descriptors for ever. A scrape reads a few hundred KB at most; the limits are generous.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
}

// serveHTTP exposes /metrics, /healthz and /readyz.
func serveHTTP(addr string, reg *prometheus.Registry, state *health.State, log *zap.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("config key metrics_addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("/healthz", health.LiveHandler())
	mux.Handle("/readyz", state.ReadyHandler())
	srv := newHTTPServer(mux)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", zap.Error(err))
		}
	}()
	log.Info("serving metrics", zap.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}
