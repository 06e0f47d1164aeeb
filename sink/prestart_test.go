package sink_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zapcore"

	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/internal/fakebroker"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// Prestart makes WaitReady's first attempt early, so Kafka's round trips overlap the relay's
// PostgreSQL checks, but it decides nothing: what it meets (a refusal, a broker that is down) is
// reported by WaitReady, at its place in the start, and nothing of it is asked twice.
func TestPrestartDecidesNothingAndWaitReadyReportsWhatItMet(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		down      bool        // nothing listens at the brokers' address
		initCode  kafka.Error // the answer to InitProducerId
		mode      sink.Idempotence
		wantErr   string // in WaitReady's error; "" for none
		wantWarn  string // a warning WaitReady logs, none before it
		producers int    // InitProducerId requests the broker answered, in all
	}{
		{name: "the brokers answer: WaitReady takes the producer id Prestart asked for", mode: sink.IdempotenceOn, producers: 1},
		{name: "the producer id refused: WaitReady reports it, the sink fails only then", initCode: kafka.ClusterAuthorizationFailed,
			mode: sink.IdempotenceOn, wantErr: "kafka.idempotence", producers: 1},
		{name: "a broker that is down: WaitReady's first warning is Prestart's attempt", down: true, mode: sink.IdempotenceOn,
			wantErr: context.DeadlineExceeded.Error(), wantWarn: "kafka unreachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fb := fakebroker.New(t)
			fb.SetIdempotent(true, tt.initCode)
			addr := fb.Addr()
			if tt.down {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				addr = ln.Addr().String()
				ln.Close()
			}
			s := newSink(t, "", sink.Config{Brokers: []string{addr}, Record: record.Options{TopicTemplate: "events"}, DeadLetterTopic: "dlq",
				Linger: -1, WriteTimeout: 5 * time.Second, Idempotence: tt.mode})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s.Prestart(ctx)
			select {
			case <-sink.PrestartDone(s.Sink):
			case <-ctx.Done():
				t.Fatal("Prestart's attempt did not end")
			}
			select {
			case <-s.Failed():
				t.Fatalf("the sink failed before WaitReady: %v", s.Err())
			default:
			}
			if n := s.logs.FilterLevelExact(zapcore.WarnLevel).Len() + s.logs.FilterLevelExact(zapcore.ErrorLevel).Len(); n != 0 {
				t.Fatalf("Prestart logged %d warnings or errors: %v", n, s.logs.All())
			}

			waitCtx := ctx
			if tt.down {
				var cancelWait context.CancelFunc
				waitCtx, cancelWait = context.WithTimeout(ctx, 100*time.Millisecond) // shorter than the first retry delay
				defer cancelWait()
			}
			err := s.WaitReady(waitCtx)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("WaitReady: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("WaitReady = %v, want an error with %q", err, tt.wantErr)
			}
			if tt.wantWarn != "" {
				// The warning of the first attempt comes at once, not after an attempt of its own.
				if warns := s.logs.FilterMessageSnippet(tt.wantWarn).AllUntimed(); len(warns) != 1 || warns[0].ContextMap()["attempt"] != int64(1) {
					t.Errorf("WaitReady's warnings %v, want one for attempt 1", warns)
				}
			}
			if tt.initCode != 0 {
				select {
				case <-s.Failed():
				default:
					t.Error("the refusal did not fail the sink")
				}
			}
			producers := fb.Producers()
			if producers != tt.producers {
				t.Errorf("the broker answered %d InitProducerId requests, want %d", producers, tt.producers)
			}
		})
	}
}
