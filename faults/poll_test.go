package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestKill9OfThreePollersLosesNothingKeepsOrderAndBoundsDuplicates runs three relays with source
// poll on one table while writers commit, and SIGKILLs one of them ten times at random moments,
// starting it again each time. A killed relay's transactions end with its connections, so what it
// had claimed is pending again at once: every event must arrive, in order per aggregate, and the
// duplicates per kill are at most what its open transactions held (poll_workers x poll_batch_size
// rows handed to Kafka but not yet marked). The binary's migrate --source poll and retry are
// exercised on the way.
func TestKill9OfThreePollersLosesNothingKeepsOrderAndBoundsDuplicates(t *testing.T) {
	t.Parallel()
	const (
		kills     = 10
		workers   = 2
		batchSize = 50
	)
	ctx := context.Background()
	d := newDB(t, testenv.SharedPostgres(t), 3)
	brokers := testenv.SharedKafka(t).Brokers()
	env := map[string]string{"OUTBOX_PG_DSN": d.dsn, "OUTBOX_SOURCE": "poll"}
	code, out := relayproc.Run(t, relayproc.Options{Subcommand: "migrate", Env: env}, time.Minute)
	if code != 0 || !strings.Contains(out, "applied 1001_poll_mode.sql") {
		t.Fatalf("migrate --source poll: exit %d, output:\n%s", code, out)
	}
	args := []string{"--source=poll", fmt.Sprintf("--poll-workers=%d", workers), fmt.Sprintf("--poll-batch-size=%d", batchSize),
		"--poll-interval=200ms"}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))

	// Started one after the other: each takes a free port for its metrics, and two started at once
	// could be handed the same one.
	start := func() *relay {
		r := d.startRelay(brokers, args...)
		if _, ok := r.waitLog(0, `"msg":"serving metrics"`, 60*time.Second); !ok {
			t.Fatalf("relay pid %d did not serve its metrics:\n%s", r.PID(), r.Output())
		}
		return r
	}
	var relays [3]*relay
	for i := range relays {
		relays[i] = start()
	}
	for _, r := range relays {
		if _, ok := r.waitLog(0, `"msg":"polling"`, 90*time.Second); !ok {
			t.Fatalf("relay pid %d did not start polling", r.PID())
		}
	}
	load := harness.StartLoad(d.outbox, harness.LoadConfig{
		Types: d.types, Writers: 3, Aggregates: 8, MaxPerTx: 5, TxPerSecond: 60, Seed: seed,
	})
	for range kills {
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
		i := rng.IntN(len(relays))
		relays[i].Kill()
		relays[i] = start()
	}
	d.outbox.AwaitMore(t, 400, "after the last kill")
	stats, err := load.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep := deliver(t, brokers, d.outbox.Written(), 3*time.Minute, relays[:]...)
	window := kills * workers * batchSize
	t.Logf("load: %s", stats)
	t.Logf("delivery: %s; duplicate window %d (%d kills x %d workers x %d rows)", rep, window, kills, workers, batchSize)
	if err := rep.DuplicatesWithin(window); err != nil {
		t.Error(err)
	}
	await.True(t, 60*time.Second, "every row marked processed", func() bool {
		var n int
		if err := d.outbox.Pool().QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})

	// The manual retry path: one event by id goes out once more.
	again := d.outbox.Written()[0]
	code, out = relayproc.Run(t, relayproc.Options{Subcommand: "retry", Env: env, Args: []string{"--ids=" + again.ID}}, time.Minute)
	if code != 0 || !strings.Contains(out, "reset 1 rows") {
		t.Fatalf("retry --ids: exit %d, output:\n%s", code, out)
	}
	c := harness.NewConsumer(brokers, harness.TopicFor(again.AggregateType))
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := c.ReadUntil(rctx, 0, func(recs []harness.Record) bool {
		n := 0
		for _, r := range recs {
			if r.Header("id") == again.ID {
				n++
			}
		}
		return n >= 2
	}); err != nil {
		t.Fatalf("the retried event was not published again: %v", err)
	}
	await.True(t, 30*time.Second, "status to show an empty queue", func() bool {
		code, out = relayproc.Run(t, relayproc.Options{Subcommand: "status", Env: env}, time.Minute)
		return code == 0 && strings.Contains(out, "pending rows:        0") && strings.Contains(out, "dead letters:        0")
	})
	for _, r := range relays {
		r.Terminate()
		if code, ok := r.Wait(30 * time.Second); !ok || code != 0 {
			t.Fatalf("relay pid %d: exit code %d (exited: %v) after SIGTERM, want 0", r.PID(), code, ok)
		}
	}
}
