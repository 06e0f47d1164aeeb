package relay

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// runPoll is Run for the polling source. A stop (ctx ends) claims nothing more and lets the batches
// in progress finish: Kafka acknowledges what they handed over, they mark it and commit. A fence,
// or ShutdownTimeout after ctx ended, rolls them back instead: their rows stay pending and are
// published again by the next claim, whoever makes it.
func (r *Relay) runPoll(ctx context.Context) error {
	hard, stopAll := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopAll(nil)
	defer context.AfterFunc(r.fenced, func() { stopAll(ErrFenced) })()
	defer context.AfterFunc(ctx, func() {
		timer := time.AfterFunc(r.cfg.ShutdownTimeout, func() { stopAll(errShutdownTimeout) })
		context.AfterFunc(hard, func() { timer.Stop() })
	})()
	// A fence stops claiming too.
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.fenced, cancel)()

	err := r.poller.Run(stop, hard)
	if context.Cause(hard) == errShutdownTimeout {
		events, _ := r.sink.InFlight()
		r.log.Warn("shutdown timeout: rows not marked processed stay pending and are published again by the next claim",
			zap.Int64("events", events), zap.Duration("shutdown_timeout", r.cfg.ShutdownTimeout))
	}
	closeWait := time.Second
	if _, _, _, halted := r.sink.Halted(); halted || hard.Err() != nil {
		closeWait = 0
	}
	closeCtx, cancelClose := context.WithTimeout(context.Background(), closeWait)
	defer cancelClose()
	r.closeSink(closeCtx)
	switch {
	case err != nil:
		return err
	case r.fenced.Err() != nil:
		return ErrFenced
	}
	r.log.Info("stopped polling")
	return nil
}
