package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
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
	secrets := cfg.Secrets()

	rcfg, err := relayConfig(cfg)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	r, err := relay.New(rcfg, log, m)
	if err != nil {
		return err
	}
	if cfg.MetricsAddr != "" {
		stopHTTP, err := serveHTTP(cfg.MetricsAddr, reg, log)
		if err != nil {
			return err
		}
		defer stopHTTP()
	}
	log.Info("starting",
		zap.String("version", version),
		zap.String("pg_dsn", config.RedactDSN(cfg.PGDSN)),
		zap.Strings("kafka_brokers", cfg.KafkaBrokers),
		zap.String("slot", cfg.Slot),
		zap.String("publication", cfg.Publication),
		zap.String("table", cfg.Schema+"."+cfg.Table),
		zap.String("topic_template", cfg.TopicTemplate))
	if err := r.Run(ctx); err != nil {
		// Driver errors can quote connection parameters; never let a secret reach the terminal.
		return errors.New(config.Scrub(err.Error(), secrets...))
	}
	log.Info("stopped")
	return nil
}

// serveHTTP exposes /metrics, /healthz and /readyz.
func serveHTTP(addr string, reg *prometheus.Registry, log *zap.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("config key metrics_addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
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
