package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// maxTxEvents is the largest backlog and steady-state transaction; sizes are uniform in 1..50.
const maxTxEvents = 50

// writeBacklog writes n events in transactions of 1 to 50 events: table rows, or with a prefix,
// logical decoding messages. The server-side procedure commits each transaction itself, so the
// backlog costs no client round trips; two sessions write at once to use both cores.
func writeBacklog(ctx context.Context, pool *pgxpool.Pool, n int, prefix string) error {
	arg := "NULL"
	if prefix != "" {
		arg = "'" + strings.ReplaceAll(prefix, "'", "''") + "'"
	}
	const writers = 2
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		share := n / writers
		if w == 0 {
			share += n % writers
		}
		wg.Go(func() {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				errs[w] = err
				return
			}
			defer conn.Release()
			// The simple protocol: a procedure may COMMIT only when CALL is not inside a transaction
			// block, which the extended protocol's implicit block would be.
			_, errs[w] = conn.Conn().PgConn().Exec(ctx, fmt.Sprintf("CALL bench_backlog(%d, %d, %s)", share, maxTxEvents, arg)).ReadAll()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("write backlog: %w", err)
		}
	}
	return nil
}

// writeOneTx writes n events in a single transaction (the large-transaction run).
func writeOneTx(ctx context.Context, pool *pgxpool.Pool, n int) error {
	if _, err := pool.Exec(ctx, "SELECT bench_insert($1, 1, 0, false)", n); err != nil {
		return fmt.Errorf("write one transaction of %d events: %w", n, err)
	}
	return nil
}

// writeWarmup writes a few small transactions marked warm, which the latency reader counts apart.
func writeWarmup(ctx context.Context, pool *pgxpool.Pool, txs, perTx int) error {
	for range txs {
		if _, err := pool.Exec(ctx, "SELECT bench_insert($1, 0, $2, true)", perTx, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("warm-up write: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// steadyWriter writes at a fixed rate in transactions of 1 to 50 events. Each event carries the
// writer's clock just before its transaction was sent (sent_ns), so latency is measured from
// before the commit: it includes the commit itself.
type steadyWriter struct {
	pool     *pgxpool.Pool
	rate     int
	duration time.Duration
}

// run writes for the configured duration and returns the number of events written and the rate
// achieved.
func (w steadyWriter) run(ctx context.Context) (written int, achieved float64, err error) {
	// Four sessions, each paced at a quarter of the rate, so one slow commit does not stall the
	// schedule.
	const sessions = 4
	var wg sync.WaitGroup
	counts := make([]int, sessions)
	errs := make([]error, sessions)
	start := time.Now()
	for s := range sessions {
		wg.Go(func() {
			counts[s], errs[s] = w.session(ctx, start, float64(w.rate)/sessions)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for s := range sessions {
		written += counts[s]
		if errs[s] != nil && err == nil {
			err = errs[s]
		}
	}
	return written, float64(written) / elapsed.Seconds(), err
}

func (w steadyWriter) session(ctx context.Context, start time.Time, rate float64) (int, error) {
	rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), rand.Uint64()))
	written := 0
	for {
		k := 1 + rng.IntN(maxTxEvents)
		// Send this transaction when the schedule has room for all of its events.
		due := start.Add(time.Duration(float64(written+k) / rate * float64(time.Second)))
		if due.Sub(start) > w.duration {
			return written, nil
		}
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				return written, ctx.Err()
			case <-time.After(d):
			}
		}
		if _, err := w.pool.Exec(ctx, "SELECT bench_insert($1, $2, $3, false)", k, int64(written+1), time.Now().UnixNano()); err != nil {
			return written, fmt.Errorf("steady write: %w", err)
		}
		written += k
	}
}
