package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// A walsender leaves a fast shutdown only once its client has confirmed everything it was sent, or
// has gone. While PostgreSQL shuts down it refuses the relay's publication checks, so the relay
// cannot confirm: it must leave the stream at once (never confirm unchecked), so that the stop
// takes seconds, not the minutes until a receive timeout, and reconnect after the restart without
// losing anything (what was not confirmed is streamed again).
func TestAFastShutdownOfPostgreSQLUnderLoadIsNotHeldUpByAStreamingRelay(t *testing.T) {
	const maxStop = 10 * time.Second // without a relay it takes a fraction of a second
	pg := testenv.Postgres(t, devenv.PostgresOptions{})
	f := newFixture(t, pg, testenv.SharedKafka(t).Brokers(), 2)
	stop := f.start(f.config())

	// About 300 events a second: 3 writers, 40 transactions a second each, 1 to 4 events each.
	load := harness.StartLoad(f.outbox, harness.LoadConfig{Types: f.types, Writers: 3, Aggregates: 10, MaxPerTx: 4, TxPerSecond: 40, Seed: 14})
	time.Sleep(2 * time.Second)
	ctx := context.Background()
	stopping := time.Now()
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(stopping)
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if took > maxStop {
		t.Errorf("PostgreSQL's fast shutdown took %s with the relay streaming under load, want under %s", took.Round(time.Millisecond), maxStop)
	} else {
		t.Logf("PostgreSQL's fast shutdown took %s with the relay streaming under load", took.Round(time.Millisecond))
	}
	f.waitSlotActive()
	time.Sleep(time.Second) // load after the restart too
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stats, err := load.Stop(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Failures == 0 {
		t.Fatalf("no write failed during the restart (%s): the stop did not happen under load", stats)
	}
	rep := f.verify(time.Minute, true)
	t.Logf("load: %s; delivery: %s", stats, rep)
	if err := stop(); err != nil {
		t.Fatalf("relay: %v", err)
	}
}
