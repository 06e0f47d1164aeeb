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
	"github.com/outbox-relay/outbox-relay/leadership"
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
	// The registry client that streams reports its health and requests in the metrics.
	if rcfg.Sink.Serializer, err = swapSerializer(ctx, cfg, m, log, rcfg.Sink.Serializer); err != nil {
		return err
	}
	if c, ok := rcfg.Sink.Serializer.(interface{ Close() }); ok {
		defer c.Close()
	}
	state := &health.State{}
	if cfg.MetricsAddr != "" {
		stopHTTP, err := serveHTTP(cfg.MetricsAddr, reg, state, log)
		if err != nil {
			return err
		}
		defer stopHTTP()
	}
	logStart(cfg, log)
	stopMonitors := startMonitors(ctx, cfg, log, m, state)
	defer stopMonitors()
	stopReporting := context.AfterFunc(ctx, state.Stopping)
	defer stopReporting()
	if cfg.PruneInterval > 0 {
		stopPruning, err := startPruning(ctx, cfg, log.Named("prune"), m)
		if err != nil {
			return scrubbed(cfg, err)
		}
		defer stopPruning()
	}

	if err := leadership.Run(ctx, leadershipConfig(cfg, rcfg), log, m, state); err != nil {
		// Driver errors can quote connection parameters; never let a secret reach the terminal.
		return scrubbed(cfg, err)
	}
	log.Info("stopped")
	return nil
}

// logStart says what the relay starts with (no secret: DSNs redacted, the password file's path
// alone), the configuration's warnings, and what exactly-once asks of consumers.
func logStart(cfg *config.Config, log *zap.Logger) {
	build := thisBuild()
	log.Info("starting",
		zap.String("version", build.Version), zap.String("commit", build.Commit), zap.Bool("modified", build.Modified),
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
		zap.String("primary_dsn", config.RedactDSN(cfg.PrimaryDSN)),
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
}

// startMonitors starts the slot monitor (WAL source) and the readiness gauge. They outlive ctx, so
// they keep reporting through the graceful drain; stop ends them once the relay has stopped.
func startMonitors(ctx context.Context, cfg *config.Config, log *zap.Logger, m *metrics.Metrics, state *health.State) (stop func()) {
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	monDone := make(chan struct{})
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
	return func() {
		stopBG()
		// The monitor says nothing once it sees the cancellation: waiting for it keeps its
		// warnings ahead of the line that ends the relay (an error's, which must be the last).
		select {
		case <-monDone:
		case <-time.After(2 * time.Second):
		}
	}
}

// leadershipConfig is what the leader loop needs of the configuration: the relay's, and the
// election's when leader_election is on.
func leadershipConfig(cfg *config.Config, rcfg relay.Config) leadership.Config {
	lc := leadership.Config{
		Relay:        rcfg,
		SlotBusyWait: cfg.SlotBusyWait,
		Scrub:        func(s string) string { return config.Scrub(s, secrets(cfg)...) },
	}
	if cfg.LeaderElection {
		lc.Election = &leader.Config{
			DSN:           cmp.Or(cfg.LeaderDSN, cfg.PrimaryDSN, cfg.PGDSN), // a standby's advisory locks are its own
			PasswordFile:  cfg.PGPasswordFile,
			Slot:          cfg.Slot,
			RetryInterval: cfg.LeaderRetryInterval,
			CheckTimeout:  cfg.LeaderCheckTimeout,
		}
		if cfg.PrimaryDSN != "" {
			// Decoding on a standby, the walsender is the standby's, out of the lock session's sight.
			lc.Election.WalsenderDSN = cfg.PGDSN
		}
		lc.KafkaTimeout = cfg.LeaderKafkaTimeout
	}
	return lc
}

// startPruning deletes relayed rows periodically. It runs on every instance, leader or not: the
// WAL already holds every committed event, so deleting rows does not affect streaming, and batches
// skip rows another pruner has locked. What reads the table (polling, a lost slot's recovery) is
// guarded: OnlyProcessed, and guardPrune's ledger bounds.
func startPruning(ctx context.Context, cfg *config.Config, log *zap.Logger, m *metrics.Metrics) (stop func(), err error) {
	dsn, key := cfg.PGDSN, "pg_dsn"
	if cfg.PrimaryDSN != "" {
		dsn, key = cfg.PrimaryDSN, "primary_dsn" // a standby refuses the deletes
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("prune: config key %s: %w", key, err)
	}
	// The pool opens connections as it needs them: each reads the password file and the TLS files
	// as they are then, like every other connection of the relay.
	pcfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		fresh, err := credentials.PostgresConfig(dsn, cfg.PGPasswordFile)
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
