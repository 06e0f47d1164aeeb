package faults

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestSigtermUnderLoadStopsWithinSecondsWithoutDuplicates stops the relay with SIGTERM several
// times while writers commit one-event transactions as fast as they can, so most stops land in the
// middle of a transaction the relay is reading. Each stop must finish the open transaction, drain
// and exit well within shutdown_timeout (30s here, the default) without logging a shutdown timeout,
// and confirm exactly what it published: after the restarts every event must be in Kafka once, in
// order per aggregate, with zero duplicates.
func TestSigtermUnderLoadStopsWithinSecondsWithoutDuplicates(t *testing.T) {
	t.Parallel()
	const (
		stops = 4
		// A stop waits for the open transaction's Commit (already on its way: pgoutput sends a
		// transaction only after it committed) and for Kafka's acknowledgements: milliseconds
		// normally, a few seconds on a loaded machine. The old stop waited all of shutdown_timeout.
		// A relay built with -race (go test -race) adds 1s at exit: the race runtime's
		// atexit_sleep_ms.
		maxStop         = 3 * time.Second
		shutdownTimeout = 30 * time.Second
	)
	d := newDB(t, testenv.SharedPostgres(t), 2)
	brokers := testenv.SharedKafka(t).Brokers()
	args := []string{"--shutdown-timeout=" + shutdownTimeout.String(), "--status-interval=200ms"}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))

	r := d.startRelay(brokers, args...)
	r.waitSessions(1, 90*time.Second)
	// Unpaced one-event transactions keep the stream busy, so a stop rarely finds the relay between
	// transactions.
	load := harness.StartLoad(d.outbox, harness.LoadConfig{
		Types: d.types, Writers: 4, Aggregates: 10, MaxPerTx: 1, Seed: seed,
	})
	defer load.Stop(context.Background())

	var took []string
	for i := range stops {
		if i > 0 {
			r = d.startRelay(brokers, args...)
			r.waitSessions(1, 90*time.Second)
		}
		before := r.mustMetric("events_published_total", "")
		await.True(t, time.Minute, "the relay to publish under load", func() bool {
			return r.mustMetric("events_published_total", "") > before+100
		})
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		r.Terminate()
		stopped := time.Now()
		code, ok := r.Wait(shutdownTimeout + 10*time.Second)
		elapsed := time.Since(stopped)
		took = append(took, elapsed.Round(time.Millisecond).String())
		if !ok {
			t.Fatalf("stop %d: the relay did not exit within %s of SIGTERM", i+1, shutdownTimeout+10*time.Second)
		}
		if code != 0 {
			t.Fatalf("stop %d: exit status %d after SIGTERM, want 0", i+1, code)
		}
		if strings.Contains(r.Output(), "shutdown timeout") {
			t.Errorf("stop %d: the relay logged a shutdown timeout (took %s)", i+1, elapsed.Round(time.Millisecond))
		}
		if elapsed > maxStop {
			t.Errorf("stop %d: the relay took %s to exit after SIGTERM, want at most %s", i+1, elapsed.Round(time.Millisecond), maxStop)
		}
	}
	t.Logf("exit after SIGTERM took %s", strings.Join(took, ", "))

	final := d.startRelay(brokers, args...)
	final.waitSessions(1, 90*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, brokers, d.outbox.Written(), 3*time.Minute, final)
	t.Logf("load: %s; delivery: %s", stats, rep)
	if rep.Duplicates != 0 {
		t.Errorf("%d duplicates after %d clean stops; a clean stop must confirm exactly what it published", rep.Duplicates, stops)
	}
	if stats.Transactions < 1000 {
		t.Errorf("only %d transactions were written: the stops did not happen under load", stats.Transactions)
	}
}
