package faults

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// testEmptyTransactionsWithPausedBroker: on PostgreSQL 14, pgoutput sends a Begin and a Commit for
// every transaction of the database, with or without a change of the outbox. While the broker is
// paused (SIGSTOP) with an event in flight, another table takes single-row transactions as fast
// as the machine allows, and a few outbox events keep coming. Each transaction without events used
// to stay queued in the checkpoint behind the unacknowledged event (measured before the fix: ~90
// bytes of RSS per transaction, 309 MB after 90 s at 36k transactions/s); now it is folded into
// the transaction before it. The relay's RSS must stay flat, the slot must stay behind the first
// unacknowledged event, every event must arrive in order once the broker is back, and the slot
// must then be confirmed past the transactions without events (no WAL pinned by them).
func testEmptyTransactionsWithPausedBroker(t *testing.T, fb *faultBroker) {
	const (
		// The pause ends after pausedFor, or once the relay has taken in enough transactions
		// to tell a queue that grows from one that does not.
		pausedFor = 25 * time.Second
		enough    = 500_000
		busy      = 2 // sessions committing transactions without events
		maxLag    = 20_000
		// The first warmFor of the load brings the heap to its working size under that load (the
		// collector lets garbage reach about the live heap again: ~6 MB here). From then on the
		// relay's RSS may grow by maxGrowth plus perTx bytes per transaction taken in. A queue entry
		// per transaction costs 90-130 bytes of RSS (the measurement: 289 MB over 3.2M
		// transactions; 131 bytes here), so a queue that grows breaks the bound from ~50k
		// transactions on: on a quiet machine within a second or two, on a loaded one within the
		// pause (~3,700 transactions/s reached the relay on the 2-core machine under load).
		warmFor   = 5 * time.Second
		maxGrowth = 4 << 20
		perTx     = 16
	)
	ctx := context.Background()
	d := newDB(t, testenv.SharedPostgresVersion(t, "14"), 1)
	pool := d.outbox.Pool()
	// One procedure call commits a thousand transactions without a client round trip each.
	for _, sql := range []string{
		"CREATE TABLE busy (id bigserial PRIMARY KEY, n int)",
		`CREATE PROCEDURE busy_burst(count int) LANGUAGE plpgsql AS $$
		BEGIN
			FOR i IN 1..count LOOP
				INSERT INTO busy (n) VALUES (i);
				COMMIT;
			END LOOP;
		END $$`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	r := d.startRelay(fb.brokers)
	r.waitSessions(1, 90*time.Second)
	if err := d.outbox.WriteTx(ctx, harness.Spec{AggregateType: d.types[0], AggregateID: "warm-up"}); err != nil {
		t.Fatal(err)
	}
	await.True(t, time.Minute, "the warm-up event to be published", func() bool {
		return r.mustMetric("events_published_total", "") >= 1
	})
	idle, err := r.RSS()
	if err != nil {
		t.Fatal(err)
	}
	var warm atomic.Bool
	var peaks [2]atomic.Int64 // while warming up, and after
	rss := sample(100*time.Millisecond, func(time.Time) {
		p := &peaks[0]
		if warm.Load() {
			p = &peaks[1]
		}
		if v, err := r.RSS(); err == nil && v > p.Load() {
			p.Store(v)
		}
	})
	defer rss.Stop()

	if err := fb.k.Pause(); err != nil {
		t.Fatal(err)
	}
	// The first event of the pause: it goes in flight and is never acknowledged while the broker is
	// paused, so everything after it waits in the checkpoint.
	first := d.writeMarked(harness.Spec{AggregateType: d.types[0], AggregateID: "first"})
	await.True(t, time.Minute, "the first event to be in flight", func() bool {
		return r.mustMetric("in_flight_events", "") >= 1
	})
	txsBefore := r.mustMetric("transactions_total", "")
	events := harness.StartLoad(d.outbox, harness.LoadConfig{Types: d.types, Writers: 2, Aggregates: 5, MaxPerTx: 3, TxPerSecond: 5})
	defer events.Stop(ctx) // after a failure; a second Stop returns at once
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopLoad()
	var burstErr atomic.Pointer[error]
	// The sessions commit far faster than the walsender and the relay take transactions in (on a
	// loaded machine, several times): they wait while the relay trails by more than maxLag, so
	// the catch-up after the pause stays short and the machine is not flooded for nothing.
	var committed, processed atomic.Int64
	for range busy {
		wg.Go(func() {
			conn, err := pool.Acquire(loadCtx)
			if err != nil {
				return
			}
			defer conn.Release()
			// Each commit waits for no WAL flush: only the rate of transactions matters here.
			if _, err := conn.Exec(loadCtx, "SET synchronous_commit = off"); err != nil {
				burstErr.Store(&err)
				return
			}
			for loadCtx.Err() == nil {
				if committed.Load()-processed.Load() > maxLag {
					select {
					case <-loadCtx.Done():
					case <-time.After(50 * time.Millisecond):
					}
					continue
				}
				if _, err := conn.Exec(loadCtx, "CALL busy_burst(1000)"); err != nil {
					if loadCtx.Err() == nil {
						burstErr.Store(&err)
					}
					return
				}
				committed.Add(1000)
			}
		})
	}
	paused := time.Now()
	var warmTxs int64
	for time.Since(paused) < pausedFor && processed.Load() < enough {
		if !warm.Load() && time.Since(paused) >= warmFor {
			warmTxs = processed.Load()
			warm.Store(true)
		}
		if r.Exited() {
			t.Fatal("the relay exited while the broker was paused")
		}
		if err := burstErr.Load(); err != nil {
			t.Fatalf("busy_burst: %v", *err)
		}
		time.Sleep(250 * time.Millisecond)
		processed.Store(int64(r.mustMetric("transactions_total", "") - txsBefore))
	}
	stopLoad()
	wg.Wait()
	took := time.Since(paused)
	busyEnd := currentLSN(t, pool)
	rss.Stop()
	n := processed.Load() - warmTxs
	base, peak := peaks[0].Load(), peaks[1].Load()
	grew := peak - base
	bound := maxGrowth + perTx*n
	mb := func(v int64) float64 { return float64(v) / (1 << 20) }
	t.Logf("broker paused %s: %d transactions without events committed, %d taken in by the relay (%.0f/s); RSS %.1f MB idle, %.1f MB after %s of load (%d transactions), then %.1f MB after %d more (%+.1f MB, %.0f bytes per transaction; bound %+.1f MB)",
		took.Round(time.Millisecond), committed.Load(), processed.Load(), float64(processed.Load())/took.Seconds(), mb(idle), mb(base), warmFor, warmTxs,
		mb(peak), n, mb(grew), float64(grew)/float64(max(n, 1)), mb(bound))
	if !warm.Load() || base == 0 || peak == 0 {
		t.Fatal("no RSS sample in one of the phases")
	}
	if grew > bound {
		t.Errorf("the relay's RSS grew by %.1f MB over %d transactions without events behind an unacknowledged event, want under %.1f MB",
			mb(grew), n, mb(bound))
	}
	if confirmed := confirmedLSN(t, pool, d.slot); confirmed >= first.CommitEnd {
		t.Errorf("the slot was confirmed to %s while the first event of the pause (commit record ends at %s) was unacknowledged",
			lsnString(confirmed), lsnString(first.CommitEnd))
	}

	if err := fb.k.Resume(); err != nil {
		t.Fatal(err)
	}
	stats, err := events.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Failures > 0 {
		t.Fatalf("event load: %s", stats)
	}
	written := d.outbox.Written()
	rep := deliver(t, fb.brokers, written, 2*time.Minute, r)
	t.Logf("events: %s; delivered %d of %d", stats, rep.Received, len(written))
	await.True(t, time.Minute, "the slot to be confirmed past the transactions without events", func() bool {
		return confirmedLSN(t, pool, d.slot) >= busyEnd
	})
}
