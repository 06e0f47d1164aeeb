package relay

import (
	"time"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/poll"
	"github.com/outbox-relay/outbox-relay/sink"
)

// pollSource reads the outbox table by polling (package poll) instead of the WAL.
type pollSource struct {
	poller  *poll.Poller
	sink    *sink.Sink
	log     *zap.Logger
	timeout time.Duration // the relay's ShutdownTimeout, for the warning
}

// newPollSource builds the polling source over sk, which the relay owns (it closes it). cfg is the
// relay's, with New's defaults applied; cfg.Poll is set.
func newPollSource(cfg Config, sk *sink.Sink, log *zap.Logger, m *metrics.Metrics) pollSource {
	return pollSource{poller: poll.New(*cfg.Poll, sk, log.Named("poll"), m), sink: sk, log: log, timeout: cfg.ShutdownTimeout}
}

func (p pollSource) streaming() bool { return p.poller.Polling() }

// stopping: nothing to do beyond the stop itself, which claims nothing more.
func (p pollSource) stopping() {}

// run polls until the stop. A stop claims nothing more and lets the batches in progress finish:
// Kafka acknowledges what they handed over, they mark it and commit. A hard stop (a fence, or the
// shutdown timeout) rolls them back instead: their rows stay pending and are published again by
// the next claim, whoever makes it. Closing the sink waits for nothing then, nor when it halted.
func (p pollSource) run(life *lifecycle) (closeWait time.Duration, err error) {
	err = p.poller.Run(life.stop, life.hard)
	if life.timedOut() {
		events, _ := p.sink.InFlight()
		p.log.Warn("shutdown timeout: rows not marked processed stay pending and are published again by the next claim",
			zap.Int64("events", events), zap.Duration("shutdown_timeout", p.timeout))
	}
	closeWait = time.Second
	if _, _, _, halted := p.sink.Halted(); halted || life.hard.Err() != nil {
		closeWait = 0
	}
	if err == nil && !life.isFenced() {
		p.log.Info("stopped polling")
	}
	return closeWait, err
}
