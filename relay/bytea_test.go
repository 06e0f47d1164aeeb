package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/relay"
)

// bytea_output = 'escape' on the database (or the role) changes the text form of every bytea value
// in the sessions that the relay opens, the replication connection's pgoutput output included.
// Payloads must still arrive byte for byte, from the backfill and from the stream.
func TestByteaPayloadsArriveByteIdenticalWithByteaOutputEscape(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	dbName := func() string {
		cfg, err := pgx.ParseConfig(f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Database
	}()
	if _, err := f.outbox.Pool().Exec(ctx, fmt.Sprintf(`ALTER TABLE outbox_events ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8');
		ALTER DATABASE %s SET bytea_output = 'escape'`, pgx.Identifier{dbName}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	fresh, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	var output string
	if err := fresh.QueryRow(ctx, "SHOW bytea_output").Scan(&output); err != nil || output != "escape" {
		t.Fatalf("bytea_output on a new connection = %q, %v; want escape", output, err)
	}
	fresh.Close(ctx)

	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	payloads := [][]byte{every, []byte(`{"a":"back\\slash"}`), []byte(`\x41`), {}, bytes.Repeat([]byte{0, '\\', 0xff}, 100)}
	want := map[string][]byte{}
	write := func(prefix string) {
		t.Helper()
		for i, p := range payloads {
			var id string
			err := f.outbox.Pool().QueryRow(ctx, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
				VALUES ($1, $2, 'bytes', $3) RETURNING id::text`, f.types[0], fmt.Sprintf("%s-%d", prefix, i), p).Scan(&id)
			if err != nil {
				t.Fatal(err)
			}
			want[id] = p
		}
	}
	write("backfilled")
	cfg := f.config()
	cfg.Backfill = &relay.Backfill{}
	f.start(cfg)
	write("streamed")

	c := harness.NewConsumer(f.brokers, harness.TopicFor(f.types[0]))
	defer c.Close()
	readCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	readErr := c.ReadUntil(readCtx, time.Second, func(recs []harness.Record) bool { return len(recs) >= len(want) })
	got := map[string][]byte{}
	for _, r := range c.Records() {
		got[r.Header("id")] = r.Value
	}
	for id, p := range want {
		v, ok := got[id]
		switch {
		case !ok:
			t.Errorf("event %s never arrived (read error: %v)", id, readErr)
		case !bytes.Equal(v, p):
			t.Errorf("event %s: payload %q, want %q", id, v, p)
		}
	}
}
