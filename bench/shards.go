package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
)

// The shards measurement (Config.Shards, docs/scaling.md): N relays, each on its own outbox
// table, publication and slot, drain a backlog written to the N tables together, the events
// spread over them by their aggregate's shard (outbox_shard, Kafka's murmur2). Every walsender
// reads and decodes all of the WAL, so the walsenders' CPU per event grows with N: that, and the
// aggregate drain, are what it measures, for each N against N = 1.

// ShardResult is one drain of the sharded backlog by N relays at once.
type ShardResult struct {
	N      int
	Round  int
	Events int64         // the backlog, over every shard
	Wall   time.Duration // from the relays' start until the last one is done
	// RelayCPU is the relays' CPU (user+sys), SenderCPU their walsenders', PrimaryCPU the bench
	// cluster's (clusterCPU), BrokerCPU the broker's, all during the drain.
	RelayCPU, SenderCPU, PrimaryCPU, BrokerCPU time.Duration
	Senders                                    []time.Duration // each shard's walsender
	Shares                                     []int64         // each shard's events
	Err                                        error
}

func (r ShardResult) rate() float64 {
	if r.Err != nil || r.Wall <= 0 {
		return 0
	}
	return float64(r.Events) / r.Wall.Seconds()
}

// senderPerEvent is the walsenders' CPU per event of the backlog, in seconds.
func (r ShardResult) senderPerEvent() float64 {
	return r.SenderCPU.Seconds() / float64(max(r.Events, 1))
}

func (r ShardResult) line() string {
	if r.Err != nil {
		return fmt.Sprintf("shards N=%d: FAILED: %v", r.N, r.Err)
	}
	return fmt.Sprintf("shards N=%d: %d events in %s (%.0f events/s), relays' CPU %s, walsenders' CPU %s (%.1f µs/event)",
		r.N, r.Events, r.Wall.Round(time.Millisecond), r.rate(), r.RelayCPU.Round(10*time.Millisecond),
		r.SenderCPU.Round(10*time.Millisecond), 1e6*r.senderPerEvent())
}

// parseShards reads BENCH_SHARDS: slot counts such as 1,2,4.
func parseShards(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > maxShards {
			return nil, fmt.Errorf("shards: %q is not a slot count from 1 to %d (BENCH_SHARDS takes a list such as 1,2,4)", f, maxShards)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// maxShards keeps the shards' slots and walsenders within the bench server's limits.
const maxShards = 16

// shardTable, shardPub and shardSlot name shard k of N's table, publication and slot (the slot
// per round).
func (b *bench) shardTable(n, k int) string { return fmt.Sprintf("bench_shards%d_%d", n, k) }
func (b *bench) shardPub(n, k int) string   { return fmt.Sprintf("%s_shards%d_%d", b.run, n, k) }
func (b *bench) shardSlot(n, k int) string {
	return fmt.Sprintf("%s_shards%d_%d%s", b.run, n, k, b.roundSuffix("_"))
}

// shardsName names N's run: its topics (shared by its shards, as docs/scaling.md has it) and logs.
func shardsName(n int) string { return fmt.Sprintf("shards%d", n) }

// measureShards drains the sharded backlog for every N of Config.Shards, the Ns in turn each
// round (1 2 4 1 2 4 ...), so that the machine's drift does not pass for scaling.
func (b *bench) measureShards(ctx context.Context, rep *Report) error {
	if len(b.cfg.Shards) == 0 {
		return nil
	}
	if cores := runtime.NumCPU(); cores < slices.Max(b.cfg.Shards)+2 {
		b.note(fmt.Sprintf("The shards measurement ran on %d cores: N walsenders, N relays, the broker and the bench share them, so where N + 2 exceeds the cores the aggregate drain cannot grow with N; the walsenders' CPU per event is the figure that carries over to a larger machine.", cores))
	}
	defer func() { b.round = 0 }()
	for round := range b.rounds() {
		b.round = round
		for _, n := range b.cfg.Shards {
			r := b.shardDrain(ctx, n)
			r.N, r.Round = n, round
			rep.Shards = append(rep.Shards, r)
			b.logf("%s", r.line())
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	return nil
}

// shardDrain writes the sharded backlog for n slots, created just before it (so each decodes this
// backlog and nothing else), and drains it with n relays started at once; it drops the slots.
func (b *bench) shardDrain(ctx context.Context, n int) (r ShardResult) {
	r.Events = int64(b.cfg.Events)
	if err := b.setupShards(ctx, n); err != nil {
		r.Err = err
		return r
	}
	var tables []string
	for k := range n {
		tables = append(tables, "public."+pgx.Identifier{b.shardTable(n, k)}.Sanitize())
	}
	// Each round counts its own shares.
	if _, err := b.pool.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
		r.Err = fmt.Errorf("shards: empty the tables: %w", err)
		return r
	}
	for k := range n {
		if err := createSlot(ctx, b.pool, b.shardSlot(n, k)); err != nil {
			r.Err = err
			return r
		}
		defer func() {
			if err := dropSlot(context.WithoutCancel(ctx), b.pool, b.shardSlot(n, k)); err != nil && r.Err == nil {
				r.Err = err
			}
		}()
	}
	name := shardsName(n)
	if err := b.createTopics(ctx, name); err != nil {
		r.Err = err
		return r
	}
	defer func() { // after the relays have stopped (deferred below)
		if err := b.dropTopics(ctx, name); err != nil && r.Err == nil {
			r.Err = err
		}
	}()
	b.logf("shards N=%d: writing a backlog of %d events over %d tables", n, b.cfg.Events, n)
	if err := b.writeShardBacklog(ctx, n, b.cfg.Events); err != nil {
		r.Err = err
		return r
	}
	end, err := currentLSN(ctx, b.pool)
	if err != nil {
		r.Err = err
		return r
	}
	r.Shares = make([]int64, n)
	for k, t := range tables {
		if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+t).Scan(&r.Shares[k]); err != nil {
			r.Err = fmt.Errorf("shards: count %s: %w", t, err)
			return r
		}
	}

	b.logf("shards N=%d: draining it with %d relays at once", n, n)
	broker0, primary0 := b.brokerCPU(), b.primaryCPU()
	started := time.Now()
	relays := make([]*child, 0, n)
	defer func() {
		for _, c := range relays {
			c.stop(30 * time.Second)
		}
	}()
	for k := range n {
		c, err := b.startRelayOn(relayTarget{dsn: b.svc.DSN, pub: b.shardPub(n, k), table: "public." + b.shardTable(n, k)},
			fmt.Sprintf("%s-%d", name, k), b.shardSlot(n, k), b.topicPrefix(name))
		if err != nil {
			r.Err = err
			return r
		}
		relays = append(relays, c)
	}
	senders := make([]senderCPU, n)
	for k := range senders {
		senders[k] = newSenderCPU()
	}
	deadline := started.Add(b.drainTimeout())
	for {
		onKafka, err := b.onKafka(ctx, b.topics(name))
		if err != nil {
			onKafka = 0
		}
		done := onKafka >= r.Events
		for k := range n {
			confirmed, pid, err := slotState(ctx, b.pool, b.shardSlot(n, k))
			if err != nil {
				r.Err = err
				return r
			}
			if pid != 0 {
				if cpu, err := procCPU(pid); err == nil {
					senders[k][pid] = cpu
				}
			}
			done = done && confirmed >= end
		}
		if done {
			r.Wall = time.Since(started)
			break
		}
		for _, c := range relays {
			if c.exited() {
				r.Err = c.failure()
				return r
			}
		}
		if time.Now().After(deadline) {
			r.Err = fmt.Errorf("shards N=%d: %d of %d events on Kafka (or a slot not confirmed up to the backlog's end) after %s", n, onKafka, r.Events, b.drainTimeout())
			return r
		}
		select {
		case <-ctx.Done():
			r.Err = ctx.Err()
			return r
		case <-time.After(25 * time.Millisecond):
		}
	}
	r.BrokerCPU, r.PrimaryCPU = b.brokerCPU()-broker0, b.primaryCPU()-primary0
	for k, c := range relays {
		cpu, _, err := c.usage()
		if err != nil {
			r.Err = err
			return r
		}
		r.RelayCPU += cpu
		r.Senders = append(r.Senders, senders[k].total())
		r.SenderCPU += senders[k].total()
	}
	return r
}

// setupShards creates N's tables (the project's migrations), publications and insert function,
// and the map of the bench's aggregates to their shards, once per N.
func (b *bench) setupShards(ctx context.Context, n int) error {
	if slices.Contains(b.shardsReady, n) {
		return nil
	}
	conn, err := pgx.Connect(ctx, b.svc.DSN)
	if err != nil {
		return fmt.Errorf("shards: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, outbox.ShardFunctionSQL); err != nil {
		return fmt.Errorf("shards: create outbox_shard: %w", err)
	}
	var tables []string
	for k := range n {
		t := b.shardTable(n, k)
		tables = append(tables, t)
		if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: t}); err != nil {
			return fmt.Errorf("shards: migrations of %s: %w", t, err)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE public.%s WITH (publish = 'insert')",
			pgx.Identifier{b.shardPub(n, k)}.Sanitize(), pgx.Identifier{t}.Sanitize())); err != nil {
			return fmt.Errorf("shards: publication of %s: %w", t, err)
		}
	}
	if _, err := conn.Exec(ctx, shardSetupSQL(n, tables)); err != nil {
		return fmt.Errorf("shards: helpers for N=%d: %w", n, err)
	}
	b.shardsReady = append(b.shardsReady, n)
	return nil
}

// shardSetupSQL maps the bench's 1,000 aggregates to their shard of n (outbox_shard, as a writer
// would choose) and creates bench_insert_shards<n>(k, first): k events, as bench_insert writes
// them, each into its aggregate's shard's table, in the caller's transaction.
func shardSetupSQL(n int, tables []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `CREATE TABLE IF NOT EXISTS bench_shard_map (shards int, a int, shard int, PRIMARY KEY (shards, a));
INSERT INTO bench_shard_map SELECT %d, a, outbox_shard('agg-' || a, %d) FROM generate_series(0, 999) AS a ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION bench_insert_shards%d(k int, first bigint) RETURNS void LANGUAGE sql AS $$
  WITH ev AS MATERIALIZED (
    SELECT s.a, s.n, m.shard FROM (SELECT floor(random() * 1000)::int AS a, n FROM generate_series(first, first + k - 1) AS n) AS s
    JOIN bench_shard_map AS m ON m.shards = %d AND m.a = s.a)`, n, n, n, n)
	for k, t := range tables {
		fmt.Fprintf(&b, `,
  i%d AS (INSERT INTO public.%s (aggregate_type, aggregate_id, event_type, payload, headers)
    SELECT bench_type(a), 'agg-' || a, 'Happened', bench_payload(a, n, 0, false), jsonb_build_object('tenant', 't' || (a %% 10))
    FROM ev WHERE shard = %d)`, k, pgx.Identifier{t}.Sanitize(), k)
	}
	b.WriteString(`
  SELECT
$$;
CREATE OR REPLACE PROCEDURE bench_backlog_shards(total bigint, max_tx int, shards int) LANGUAGE plpgsql AS $p$
DECLARE
  written bigint := 0;
  k int;
BEGIN
  WHILE written < total LOOP
    k := least(total - written, 1 + floor(random() * max_tx)::int);
    EXECUTE format('SELECT bench_insert_shards%s($1, $2)', shards) USING k, written + 1;
    written := written + k;
    COMMIT;
  END LOOP;
END $p$;
`)
	return b.String()
}

// writeShardBacklog writes n events spread over the shards' tables, in transactions of 1 to 50
// events, from two sessions at once (as writeBacklog).
func (b *bench) writeShardBacklog(ctx context.Context, shards, n int) error {
	const writers = 2
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		share := n / writers
		if w == 0 {
			share += n % writers
		}
		wg.Go(func() {
			conn, err := b.pool.Acquire(ctx)
			if err != nil {
				errs[w] = err
				return
			}
			defer conn.Release()
			_, errs[w] = conn.Conn().PgConn().Exec(ctx, fmt.Sprintf("CALL bench_backlog_shards(%d, %d, %d)", share, maxTxEvents, shards)).ReadAll()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shards: write the backlog: %w", err)
	}
	return nil
}

// shardIn is N's successful drain of round, if any.
func (r *Report) shardIn(n, round int) *ShardResult {
	for i := range r.Shards {
		if s := &r.Shards[i]; s.N == n && s.Round == round && s.Err == nil {
			return s
		}
	}
	return nil
}

// shardRatios are, round by round, of for the largest N measured against N = 1 of the same round.
func (r *Report) shardRatios(of func(s, base *ShardResult) float64) []float64 {
	top := 0
	for _, s := range r.Shards {
		top = max(top, s.N)
	}
	if top <= 1 {
		return nil
	}
	var out []float64
	for round := range max(r.Config.Rounds, 1) {
		if s, base := r.shardIn(top, round), r.shardIn(1, round); s != nil && base != nil {
			out = append(out, of(s, base))
		}
	}
	return out
}

func shardDrainRatio(s, base *ShardResult) float64 { return s.rate() / base.rate() }
func shardSenderRatio(s, base *ShardResult) float64 {
	return s.senderPerEvent() / base.senderPerEvent()
}

// shardsSummary is the summary line's part: the largest N's aggregate drain and walsenders' CPU
// per event against N = 1's, medians over the rounds.
func (r *Report) shardsSummary() string {
	median := func(v []float64) string {
		if sp, ok := spreadOf(v); ok {
			return fmt.Sprintf("%.2f", sp.median)
		}
		return "n/a"
	}
	return fmt.Sprintf("shards_drain_x=%s shards_walsender_cpu_x=%s", median(r.shardRatios(shardDrainRatio)), median(r.shardRatios(shardSenderRatio)))
}

// shardsTable renders the shards measurement, one row per N and round.
func (r *Report) shardsTable(b *strings.Builder) {
	if len(r.Shards) == 0 {
		return
	}
	fmt.Fprintf(b, "\nN slots on one machine (docs/scaling.md): N relays, each on its own outbox table, publication and slot, drain one backlog of %d events written to the N tables together "+
		"(each event in its aggregate's shard, outbox_shard); the drain ends when every event is on Kafka and every slot is confirmed past the backlog. "+
		"Every walsender reads and decodes all of the WAL. This machine has %d cores, shared by the N walsenders, the N relays, the broker and the bench: "+
		"where N + 2 exceeds them the aggregate drain cannot grow with N, and the walsenders' CPU per event is the figure that carries over.\n\n",
		r.Config.Events, runtime.NumCPU())
	b.WriteString("| slots | events/s | vs N = 1 | wall s | relays' CPU µs/event | walsenders' CPU s | walsenders' CPU µs/event | vs N = 1 | primary CPU µs/event | broker CPU µs/event |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.Shards {
		name := fmt.Sprintf("N = %d", s.N)
		if r.Config.Rounds > 1 {
			name += fmt.Sprintf(" (round %d)", s.Round+1)
		}
		if s.Err != nil {
			fmt.Fprintf(b, "| %s | failed: %s |||||||||\n", name, oneLine(s.Err))
			continue
		}
		drainX, senderX := "-", "-"
		if base := r.shardIn(1, s.Round); base != nil && base.rate() > 0 && base.senderPerEvent() > 0 {
			drainX, senderX = fmt.Sprintf("%.2f", shardDrainRatio(&s, base)), fmt.Sprintf("%.2f", shardSenderRatio(&s, base))
		}
		perEvent := func(d time.Duration) float64 { return 1e6 * d.Seconds() / float64(max(s.Events, 1)) }
		fmt.Fprintf(b, "| %s | %.0f | %s | %.2f | %.1f | %.2f | %.1f | %s | %.1f | %.1f |\n", name, s.rate(), drainX, s.Wall.Seconds(),
			perEvent(s.RelayCPU), s.SenderCPU.Seconds(), perEvent(s.SenderCPU), senderX, perEvent(s.PrimaryCPU), perEvent(s.BrokerCPU))
	}
}
