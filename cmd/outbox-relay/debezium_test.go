package main_test

// Drop-in replacement for Debezium's outbox event router, checked at the binary level: the
// debezium profile against Debezium's table layout, taking over a slot and publication made the
// way Debezium makes them, and the insert-then-delete pattern. Identifiers here start with dbz so
// they stay clear of the other test files of this package.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// dbzTable is the outbox table of Debezium's documentation, plus a tenant column that a
// deployment placed in a header with table.fields.additional.placement=tenant:header.
const dbzTable = `CREATE TABLE outbox (
	id            uuid         NOT NULL PRIMARY KEY,
	aggregatetype varchar(255) NOT NULL,
	aggregateid   varchar(255) NOT NULL,
	type          varchar(255) NOT NULL,
	payload       jsonb,
	tenant        text
)`

// Bounds of the waits below, generous for a loaded two-core machine.
const (
	dbzStartTimeout   = 60 * time.Second
	dbzDeliverTimeout = 90 * time.Second
	dbzStopTimeout    = 30 * time.Second
)

type dbzFixture struct {
	t       *testing.T
	dsn     string
	pool    *pgxpool.Pool
	brokers string
	created map[string]bool // topics created up front
}

func newDbzFixture(t *testing.T, ddl ...string) *dbzFixture {
	t.Helper()
	ctx := context.Background()
	dsn, err := testenv.SharedPostgres(t).CreateDatabase(ctx, testenv.UniqueName(t, "db"))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	f := &dbzFixture{t: t, dsn: dsn, pool: pool, brokers: testenv.SharedKafka(t).Brokers(), created: map[string]bool{}}
	for _, sql := range ddl {
		f.exec(sql)
	}
	return f
}

func (f *dbzFixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// aggregateType returns a unique aggregate type (so a unique topic on the shared broker) starting
// with prefix, and creates its topic: the relay would otherwise wait and retry while Kafka
// auto-creates it, which only slows the test.
func (f *dbzFixture) aggregateType(prefix string) string {
	f.t.Helper()
	typ := prefix + "_" + testenv.UniqueName(f.t, "t")
	if err := testenv.SharedKafka(f.t).CreateTopic(context.Background(), harness.TopicFor(typ), 3); err != nil {
		f.t.Fatal(err)
	}
	return typ
}

// relay starts `outbox-relay run` with the database and broker in its environment and waits until
// it streams slot.
func (f *dbzFixture) relay(slot string, args ...string) *relayproc.Proc {
	f.t.Helper()
	args = append([]string{"--status-interval=200ms", "--shutdown-timeout=10s", "--slot=" + slot}, args...)
	p := relayproc.Start(f.t, relayproc.Options{Args: args, Env: map[string]string{
		"OUTBOX_PG_DSN": f.dsn, "OUTBOX_KAFKA_BROKERS": f.brokers,
		"GORACE": "atexit_sleep_ms=0", // a race-enabled binary would sleep a second at exit
	}})
	deadline := time.Now().Add(dbzStartTimeout)
	for {
		var active bool
		err := f.pool.QueryRow(context.Background(), "SELECT active AND confirmed_flush_lsn IS NOT NULL FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		if err == nil && active {
			return p
		}
		if p.Exited() || time.Now().After(deadline) {
			f.t.Fatalf("the relay did not start streaming slot %s (exited: %v)", slot, p.Exited())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM and requires a clean exit.
func (f *dbzFixture) stop(p *relayproc.Proc) {
	f.t.Helper()
	p.Terminate()
	code, ok := p.Wait(dbzStopTimeout)
	if !ok || code != 0 {
		f.t.Fatalf("the relay did not exit cleanly after SIGTERM (exited: %v, status %d)", ok, code)
	}
}

// dbzEvent is one row written to a Debezium-style outbox table, as PostgreSQL stored it.
type dbzEvent struct {
	ID, AggregateType, AggregateID string
	Seq                            int
	Payload                        string // payload::text
	Tenant                         *string
}

// dbzPayload exercises what an encoding could get wrong: quotes, backslashes, non-ASCII, the
// characters encoding/json would escape for HTML (<, >, &, U+2028), a control character (escaped
// inside the JSON text), and a number no float64 holds.
func dbzPayload(aggID string, seq int) string {
	return fmt.Sprintf(`{"order": %q, "seq": %d, "note": "<b>Tom & \"Jerry\"</b> \\ grüße 世界 \u2028 \u0007",
		"total": 12345678901234567890.10, "lines": [{"item": "Debezium in Action", "qty": 2}]}`, aggID, seq)
}

// insert writes one event per aggregate id in tx (table outbox) and returns them as stored.
func (f *dbzFixture) insert(ctx context.Context, tx pgx.Tx, aggType string, seq int, tenant *string, aggIDs ...string) []dbzEvent {
	f.t.Helper()
	var out []dbzEvent
	for _, aggID := range aggIDs {
		e := dbzEvent{AggregateType: aggType, AggregateID: aggID, Seq: seq, Tenant: tenant}
		err := tx.QueryRow(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tenant)
			VALUES (gen_random_uuid(), $1, $2, 'OrderCreated', $3::jsonb, $4) RETURNING id::text, payload::text`,
			aggType, aggID, dbzPayload(aggID, seq), tenant).Scan(&e.ID, &e.Payload)
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// read reads the topics until every event of want arrived (or the timeout), lingering a little
// for duplicates, and returns the records.
func (f *dbzFixture) read(want []dbzEvent, topics ...string) []harness.Record {
	f.t.Helper()
	c := harness.NewConsumer(f.brokers, topics...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dbzDeliverTimeout)
	defer cancel()
	err := c.ReadUntil(ctx, time.Second, func(recs []harness.Record) bool {
		seen := map[string]bool{}
		for _, r := range recs {
			seen[r.Header("id")] = true
		}
		for _, e := range want {
			if !seen[e.ID] {
				return false
			}
		}
		return true
	})
	if err != nil {
		f.t.Fatalf("not every event arrived: %v", err)
	}
	return c.Records()
}

// jacksonString is what Kafka Connect's JsonConverter (Jackson) writes for a string: only '"',
// '\' and control characters escaped (short forms where JSON has them, else \u00XX in upper-case
// hex); '<', '>', '&' and U+2028 stay as they are. Written rune by rune, independently of the
// relay's byte-wise encoder.
func jacksonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04X`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// checkRecords requires every event of want exactly once, with Debezium's topic, key, headers (id,
// plus tenant when set: nothing else) and value; per aggregate in insertion order; and no record
// whose id is neither in want nor in tolerated. (A delete that produced a record, or a row of
// another table taken for an event, shows up as a duplicate or an unknown id.)
func checkRecords(t *testing.T, recs []harness.Record, want []dbzEvent, tolerated map[string]bool, value func(payload string) string) {
	t.Helper()
	byID := map[string]dbzEvent{}
	for _, e := range want {
		byID[e.ID] = e
	}
	seen := map[string]int{}
	lastSeq := map[string]int{}
	problems := 0
	fail := func(format string, args ...any) {
		problems++
		if problems <= 10 {
			t.Errorf(format, args...)
		}
	}
	for _, r := range recs {
		id := r.Header("id")
		e, ok := byID[id]
		if !ok {
			if !tolerated[id] {
				fail("record %s/%d@%d has an id %q that was never written (or belongs to another table)", r.Topic, r.Partition, r.Offset, id)
			}
			continue
		}
		seen[id]++
		if seen[id] > 1 {
			fail("event %s delivered %d times", id, seen[id])
			continue
		}
		wantHeaders := map[string]string{"id": e.ID}
		if e.Tenant != nil {
			wantHeaders["tenant"] = *e.Tenant
		}
		switch {
		case r.Topic != harness.TopicFor(e.AggregateType):
			fail("event %s: topic %q, want %q", id, r.Topic, harness.TopicFor(e.AggregateType))
		case string(r.Key) != e.AggregateID:
			fail("event %s: key %q, want %q", id, r.Key, e.AggregateID)
		case fmt.Sprint(r.Headers) != fmt.Sprint(wantHeaders):
			fail("event %s: headers %v, want exactly %v", id, r.Headers, wantHeaders)
		case string(r.Value) != value(e.Payload):
			fail("event %s: value\n  %s\nwant\n  %s", id, r.Value, value(e.Payload))
		}
		agg := e.AggregateType + "/" + e.AggregateID
		if e.Seq < lastSeq[agg] {
			fail("aggregate %s: seq %d delivered after seq %d", agg, e.Seq, lastSeq[agg])
		}
		lastSeq[agg] = max(lastSeq[agg], e.Seq)
	}
	for _, e := range want {
		if seen[e.ID] == 0 {
			fail("event %s (%s/%s seq %d) missing", e.ID, e.AggregateType, e.AggregateID, e.Seq)
		}
	}
}

func TestTheDebeziumProfileProducesTheRecordsOfDebeziumsOutboxRouter(t *testing.T) {
	cases := []struct {
		name     string
		encoding string
		// value is the record value Debezium's outbox router produces for a payload (jsonb as text)
		// with the converter the case stands for.
		value func(payload string) string
	}{
		{"raw JSON, as with a converter that passes the payload through", "raw",
			func(p string) string { return p }},
		{"a JSON string, as with JsonConverter and schemas disabled", "json-string", jacksonString},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newDbzFixture(t, dbzTable)
			slot := testenv.UniqueName(t, "slot")
			orders, customers := f.aggregateType("Order"), f.aggregateType("Customer")
			p := f.relay(slot, "--profile=debezium", "--table=outbox", "--extra-headers=tenant",
				"--publication="+slot, "--value-encoding="+c.encoding)

			ctx := context.Background()
			acme := "acme"
			var written []dbzEvent
			for seq := 1; seq <= 5; seq++ {
				tenant := &acme
				if seq%2 == 0 {
					tenant = nil // NULL column: no header
				}
				if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
					written = append(written, f.insert(ctx, tx, orders, seq, tenant, "1", "2")...)
					written = append(written, f.insert(ctx, tx, customers, seq, tenant, "c-9")...)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			if !utf8.ValidString(written[0].Payload) || !strings.Contains(written[0].Payload, "<b>Tom & ") {
				t.Fatalf("the payload lost what it should exercise: %s", written[0].Payload)
			}
			recs := f.read(written, harness.TopicFor(orders), harness.TopicFor(customers))
			checkRecords(t, recs, written, nil, c.value)
			if c.encoding == "json-string" {
				var decoded string
				if err := json.Unmarshal(recs[0].Value, &decoded); err != nil || !json.Valid([]byte(decoded)) {
					t.Errorf("a json-string value does not decode to the JSON payload: %v", err)
				}
			}
			f.stop(p)
		})
	}
}

// A migration from Debezium: its connector created a pgoutput slot and a publication (which may
// cover other tables too) and confirmed the slot up to where it had delivered. The relay, started
// on that slot and publication, must deliver every event committed after that position and nothing
// from the other tables; events before it were Debezium's to deliver (re-sending some is the
// at-least-once overlap, allowed).
func TestTakingOverDebeziumsSlotAndPublicationDeliversEverythingAfterItsConfirmedPosition(t *testing.T) {
	f := newDbzFixture(t, dbzTable,
		// Another table in Debezium's publication, shaped like the outbox on purpose: were its rows
		// taken for events, they would show up in the topic with ids never written to the outbox.
		`CREATE TABLE outbox_archive (LIKE outbox INCLUDING ALL)`,
		`CREATE TABLE customers (id serial PRIMARY KEY, name text NOT NULL)`,
		// Debezium's publication.autocreate.mode=filtered creates it like this (all operations).
		`CREATE PUBLICATION dbz_publication FOR TABLE outbox, outbox_archive, customers`,
	)
	ctx := context.Background()
	// slot.name defaults to "debezium"; the cluster is shared with other tests, so the name is made
	// unique. The plugin, and how the slot is created, are Debezium's.
	slot := testenv.UniqueName(t, "debezium")
	f.exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	orders := f.aggregateType("Order")

	// otherChanges writes to the other tables of the publication: inserts, updates, deletes, and a
	// copy of an outbox row into the look-alike table.
	otherChanges := func(tx pgx.Tx, i int) {
		for _, sql := range []string{
			fmt.Sprintf("INSERT INTO customers (name) VALUES ('c%d')", i),
			fmt.Sprintf("UPDATE customers SET name = name || '!' WHERE id %% 3 = %d", i%3),
			fmt.Sprintf("DELETE FROM customers WHERE id %% 5 = %d", i%5),
			fmt.Sprintf(`INSERT INTO outbox_archive SELECT gen_random_uuid(), '%s', 'archived', 'X', '{}', NULL`, orders),
		} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
	}
	writeRound := func(from, to int) []dbzEvent {
		var out []dbzEvent
		for seq := from; seq < to; seq++ {
			if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
				out = append(out, f.insert(ctx, tx, orders, seq, nil, "1", "2", "3")...)
				otherChanges(tx, seq)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			// Transactions that touch only the other tables, between the outbox ones.
			if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error { otherChanges(tx, seq); return nil }); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}

	// Debezium delivered these, then confirmed the slot up to here and stopped.
	before := writeRound(1, 11)
	var confirmed string
	if err := f.pool.QueryRow(ctx, "SELECT lsn::text FROM pg_replication_slot_advance($1, pg_current_wal_lsn()) AS a(slot, lsn)", slot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	// Committed while nobody streamed: these must all arrive. An UPDATE and a DELETE of outbox rows
	// go by too (ignored, as Debezium's router ignores them).
	after := writeRound(11, 31)
	f.exec("UPDATE outbox SET type = 'Changed' WHERE aggregateid = '1'")
	f.exec("DELETE FROM outbox WHERE aggregateid = '2'")
	after = append(after, writeRound(31, 36)...)

	p := f.relay(slot, "--publication=dbz_publication", "--profile=debezium", "--table=outbox",
		"--create-publication=false", "--create-slot=false")
	// And some while the relay streams.
	after = append(after, writeRound(36, 41)...)

	tolerated := map[string]bool{}
	for _, e := range before {
		tolerated[e.ID] = true
	}
	recs := f.read(after, harness.TopicFor(orders))
	checkRecords(t, recs, after, tolerated, func(p string) string { return p })
	overlap := 0
	for _, r := range recs {
		if tolerated[r.Header("id")] {
			overlap++
		}
	}
	t.Logf("slot confirmed at %s by \"Debezium\"; %d events after it delivered; %d of the %d before it sent again",
		confirmed, len(after), overlap, len(before))
	f.stop(p)
}

func TestInsertThenDeleteInOneTransactionPublishesTheInsert(t *testing.T) {
	cases := []struct {
		name string
		ddl  []string
		args []string
		// insert writes one event in tx and returns its id.
		insert func(ctx context.Context, tx pgx.Tx, aggType string, seq int) (id, payload string, err error)
		delete string
	}{
		{
			name: "a Debezium-style table whose publication also publishes the deletes",
			ddl:  []string{dbzTable},
			args: []string{"--profile=debezium", "--table=outbox"},
			insert: func(ctx context.Context, tx pgx.Tx, aggType string, seq int) (string, string, error) {
				var id, payload string
				err := tx.QueryRow(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
					VALUES (gen_random_uuid(), $1, 'o-1', 'OrderCreated', $2::jsonb) RETURNING id::text, payload::text`,
					aggType, fmt.Sprintf(`{"seq": %d}`, seq)).Scan(&id, &payload)
				return id, payload, err
			},
			delete: "DELETE FROM outbox WHERE id = $1::uuid",
		},
		{
			name: "the relay's default table",
			args: nil,
			insert: func(ctx context.Context, tx pgx.Tx, aggType string, seq int) (string, string, error) {
				var id, payload string
				err := tx.QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
					VALUES ($1, 'o-1', 'OrderCreated', $2::jsonb) RETURNING id::text, payload::text`,
					aggType, fmt.Sprintf(`{"seq": %d}`, seq)).Scan(&id, &payload)
				return id, payload, err
			},
			delete: "DELETE FROM outbox_events WHERE id = $1::uuid",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newDbzFixture(t, c.ddl...)
			slot := testenv.UniqueName(t, "slot")
			if c.ddl == nil {
				// The default table comes from `outbox-relay migrate`, as an operator would make it.
				code, out := relayproc.Run(t, relayproc.Options{Subcommand: "migrate", Args: []string{"--publication=" + slot},
					Env: map[string]string{"OUTBOX_PG_DSN": f.dsn, "OUTBOX_KAFKA_BROKERS": f.brokers}}, time.Minute)
				if code != 0 {
					t.Fatalf("migrate: exit status %d:\n%s", code, out)
				}
			}
			// A publication for every operation, so the DELETE really reaches the relay (the one
			// the relay creates publishes only INSERTs).
			table := "outbox"
			if c.ddl == nil {
				table = "outbox_events"
				f.exec("DROP PUBLICATION " + slot)
			}
			f.exec(fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert, update, delete, truncate')", slot, table))
			aggType := f.aggregateType("Order")
			p := f.relay(slot, append([]string{"--publication=" + slot}, c.args...)...)

			ctx := context.Background()
			var written []dbzEvent
			for seq := 1; seq <= 5; seq++ {
				if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
					id, payload, err := c.insert(ctx, tx, aggType, seq)
					if err != nil {
						return err
					}
					written = append(written, dbzEvent{ID: id, AggregateType: aggType, AggregateID: "o-1", Seq: seq, Payload: payload})
					_, err = tx.Exec(ctx, c.delete, id)
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
			var left int
			if err := f.pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&left); err != nil || left != 0 {
				t.Fatalf("%d rows left in %s (err %v): the pattern keeps the table empty", left, table, err)
			}
			recs := f.read(written, harness.TopicFor(aggType))
			if c.ddl == nil {
				// The default profile adds the event_type and aggregate_type headers.
				for i := range recs {
					if recs[i].Header("event_type") != "OrderCreated" || recs[i].Header("aggregate_type") != aggType {
						t.Errorf("record %d headers %v", i, recs[i].Headers)
					}
					recs[i].Headers = map[string]string{"id": recs[i].Header("id")}
				}
			}
			checkRecords(t, recs, written, nil, func(p string) string { return p })
			f.stop(p)
		})
	}
}
