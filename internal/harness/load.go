package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

func (o *Outbox) keepUncertain(batch []pending) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.uncertain = append(o.uncertain, batch)
}

// ResolveUncertain looks up transactions whose commit could not be checked when it failed (the
// server was unreachable) and records the committed ones. It returns how many are still unknown
// because the lookup failed again.
func (o *Outbox) ResolveUncertain(ctx context.Context) (remaining int, err error) {
	o.mu.Lock()
	batches := o.uncertain
	o.uncertain = nil
	o.mu.Unlock()
	var errs []error
	for _, batch := range batches {
		committed, lookErr := o.reconcile(ctx, batch)
		switch {
		case lookErr != nil:
			o.keepUncertain(batch)
			errs = append(errs, lookErr)
		case committed:
			o.record(batch)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.uncertain), errors.Join(errs...)
}

// LoadConfig shapes the events a Load writes. Zero values get the defaults in the comments.
type LoadConfig struct {
	Types      []string // aggregate types (one topic each); required
	Writers    int      // concurrent writers; 3
	Aggregates int      // aggregates per writer; 20
	MaxPerTx   int      // events per transaction, uniformly 1..MaxPerTx; 5
	// TxPerSecond paces each writer; 0 writes as fast as the database allows.
	TxPerSecond float64
	// LargeEvery gives one event in LargeEvery a payload of LargeBytes; 0 for none.
	LargeEvery int
	LargeBytes int // 256 KiB
	// BigTxEvents, when positive, makes writer 0 write one transaction of that many events once
	// BigTxAfter has passed.
	BigTxEvents int
	BigTxAfter  time.Duration
	Seed        uint64
}

// nonASCIIPrefixes make aggregate ids (record keys) that are not ASCII.
var nonASCIIPrefixes = []string{"order", "kunde-müller", "订单", "παραγγελία", "заказ"}

// Load writes outbox transactions from several goroutines until stopped, the way a busy service
// would. Each writer owns its aggregates, so an aggregate's sequence numbers follow commit order
// even though writers commit concurrently. Failed writes (a database restart) are counted and
// retried with new events after a short pause; uncertain commits are settled by Stop.
type Load struct {
	o      *Outbox
	cfg    LoadConfig
	cancel context.CancelFunc
	wg     sync.WaitGroup
	paused atomic.Bool
	active atomic.Int32 // writers inside a transaction

	txs, events, failures atomic.Int64
	lastErr               atomic.Value // string
	bigDone               atomic.Bool
}

// LoadStats summarises what a Load wrote.
type LoadStats struct {
	Transactions, Events int64 // committed, as known when the writer returned
	Failures             int64 // transactions that returned an error (committed or not)
	LastError            string
	BigTxWritten         bool
}

func (s LoadStats) String() string {
	return fmt.Sprintf("transactions=%d events=%d failures=%d big_tx=%v last_error=%q",
		s.Transactions, s.Events, s.Failures, s.BigTxWritten, s.LastError)
}

// StartLoad starts the writers.
func StartLoad(o *Outbox, cfg LoadConfig) *Load {
	if len(cfg.Types) == 0 {
		panic("harness: LoadConfig.Types is empty")
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 3
	}
	if cfg.Aggregates <= 0 {
		cfg.Aggregates = 20
	}
	if cfg.MaxPerTx <= 0 {
		cfg.MaxPerTx = 5
	}
	if cfg.LargeBytes <= 0 {
		cfg.LargeBytes = 256 << 10
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{o: o, cfg: cfg, cancel: cancel}
	started := time.Now()
	for w := range cfg.Writers {
		l.wg.Go(func() { l.write(ctx, w, started) })
	}
	return l
}

// Pause stops the writers after their current transaction and returns once none is writing;
// Resume lets them go on.
func (l *Load) Pause() {
	l.paused.Store(true)
	for l.active.Load() > 0 {
		time.Sleep(5 * time.Millisecond)
	}
}

// Resume lets paused writers go on.
func (l *Load) Resume() { l.paused.Store(false) }

// Stats returns the counts so far.
func (l *Load) Stats() LoadStats {
	s := LoadStats{Transactions: l.txs.Load(), Events: l.events.Load(), Failures: l.failures.Load(), BigTxWritten: l.bigDone.Load()}
	s.LastError, _ = l.lastErr.Load().(string)
	return s
}

// Stop stops the writers and settles uncertain commits, retrying until ctx ends.
func (l *Load) Stop(ctx context.Context) (LoadStats, error) {
	l.cancel()
	l.wg.Wait()
	for {
		remaining, err := l.o.ResolveUncertain(ctx)
		if remaining == 0 {
			return l.Stats(), nil
		}
		select {
		case <-ctx.Done():
			return l.Stats(), fmt.Errorf("%d transactions with an unknown commit outcome (last error: %v): %w", remaining, err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (l *Load) write(ctx context.Context, w int, started time.Time) {
	rng := rand.New(rand.NewPCG(l.cfg.Seed, uint64(w)))
	var pace time.Duration
	if l.cfg.TxPerSecond > 0 {
		pace = time.Duration(float64(time.Second) / l.cfg.TxPerSecond)
	}
	next := time.Now()
	n := 0
	for ctx.Err() == nil {
		// Announce the write before checking for a pause, so Pause never misses one starting.
		l.active.Add(1)
		if l.paused.Load() {
			l.active.Add(-1)
			sleep(ctx, 10*time.Millisecond)
			continue
		}
		var specs []Spec
		big := w == 0 && l.cfg.BigTxEvents > 0 && !l.bigDone.Load() && time.Since(started) >= l.cfg.BigTxAfter
		if big {
			specs = make([]Spec, l.cfg.BigTxEvents)
			for i := range specs {
				specs[i] = l.spec(rng, w, &n)
			}
		} else {
			specs = make([]Spec, 1+rng.IntN(l.cfg.MaxPerTx))
			for i := range specs {
				specs[i] = l.spec(rng, w, &n)
			}
		}
		// The test's context must not cancel a commit in flight: that would make its outcome
		// unknown for a reason the test itself caused.
		err := l.o.WriteTx(context.WithoutCancel(ctx), specs...)
		l.active.Add(-1)
		if err != nil {
			l.failures.Add(1)
			l.lastErr.Store(err.Error())
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		if big {
			l.bigDone.Store(true)
		}
		l.txs.Add(1)
		l.events.Add(int64(len(specs)))
		if pace > 0 {
			next = next.Add(pace)
			if d := time.Until(next); d > 0 {
				sleep(ctx, d)
			} else if d < -time.Second {
				next = time.Now() // fell behind (a pause, an outage): do not burst to catch up
			}
		}
	}
}

func (l *Load) spec(rng *rand.Rand, w int, n *int) Spec {
	*n++
	agg := rng.IntN(l.cfg.Aggregates)
	s := Spec{
		AggregateType: l.cfg.Types[rng.IntN(len(l.cfg.Types))],
		AggregateID:   fmt.Sprintf("%s-w%d-%d", nonASCIIPrefixes[agg%len(nonASCIIPrefixes)], w, agg),
		EventType:     []string{"Created", "Updated", "Shipped"}[rng.IntN(3)],
	}
	if l.cfg.LargeEvery > 0 && rng.IntN(l.cfg.LargeEvery) == 0 {
		s.PadBytes = l.cfg.LargeBytes/2 + rng.IntN(l.cfg.LargeBytes/2+1)
	}
	if rng.IntN(4) == 0 {
		s.Headers = map[string]string{"tenant": fmt.Sprintf("t-%d", rng.IntN(3)), "trace": "ü-" + fmt.Sprint(*n)}
	}
	return s
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
