package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/schemas/avro"
)

// TestAvroThroughTheRelayAndAKill9LosesNothing runs the relay with value_encoding and
// key_encoding avro against a real registry and broker while a writer commits, kills it with
// SIGKILL mid-stream and starts it again: a consumer that knows nothing but the registry's URL
// decodes every committed event, in order per aggregate, none lost. The records are binary
// CloudEvents: the framed value as the data, the attributes in ce_ headers, content-type
// application/avro.
func TestAvroThroughTheRelayAndAKill9LosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, k, reg := testenv.SharedPostgres(t), testenv.SharedKafka(t), testenv.SharedRegistry(t)
	e := newE2E(t, pgPassword)
	db := newDatabase(t, pg)
	slot := testenv.UniqueName(t, "slot")
	env := relayEnv("OUTBOX_PG_DSN="+db.dsn, "OUTBOX_KAFKA_BROKERS="+k.Brokers(),
		"OUTBOX_VALUE_ENCODING=avro", "OUTBOX_KEY_ENCODING=avro", "OUTBOX_SCHEMA_REGISTRY_URLS="+reg.ConfluentURL(),
		"OUTBOX_ENVELOPE=cloudevents", "OUTBOX_CLOUDEVENTS_MODE=binary")
	args := []string{"run", "--slot=" + slot, "--publication=" + slot, "--status-interval=200ms",
		"--shutdown-timeout=" + shutdownTimeout.String()}
	e.mustRun("migrate", env, "migrate", "--publication="+slot)
	ob, err := harness.NewOutbox(ctx, db.dsn, "public.outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	types := []string{testenv.UniqueName(t, "avro")}

	relay := e.relay("relay #1", env, args...)
	waitSlotActive(t, db.pool, slot, relay)
	stopWriting := keepWriting(ctx, t, ob, types, 41, 10)
	flowed := func(what string) {
		t.Helper()
		from, err := harness.CurrentLSN(ctx, db.pool)
		if err != nil {
			t.Fatal(err)
		}
		await.True(t, startTimeout, what, func() bool {
			lsn, err := harness.ConfirmedFlushLSN(ctx, db.pool, slot)
			return err == nil && lsn >= from
		})
	}
	flowed("relay #1 to confirm events written while it streams")
	relay.signal(t, syscall.SIGKILL)
	if _, ok := relay.wait(10 * time.Second); !ok {
		t.Fatal("relay #1 still runs after SIGKILL")
	}
	t.Logf("SIGKILL with %d events committed", len(ob.Written()))
	relay = e.relay("relay #2", env, args...)
	waitSlotActive(t, db.pool, slot, relay)
	flowed("relay #2 to confirm events written while it streams")
	if err := stopWriting(); err != nil {
		t.Fatalf("writer: %v", err)
	}

	// The consumer: the registry's URL and nothing else.
	cl, err := sr.NewClient(sr.URLs(reg.ConfluentURL()), sr.HTTPClient(&http.Client{Timeout: 10 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	consumer := schemas.NewDeserializer(schemas.ClientRegistry{Client: cl}, avro.New())
	written := ob.Written()
	byID := make(map[string]harness.Written, len(written))
	for _, w := range written {
		byID[w.ID] = w
	}
	// decoded is the records as the consumer reads them: the key and the value decoded, the value
	// standing as the payload was written when the two are the same JSON document.
	decoded := func(recs []harness.Record) []harness.Record {
		out := make([]harness.Record, len(recs))
		for i, r := range recs {
			out[i] = r
			for h, want := range map[string]string{"ce_id": r.Header("id"), "ce_type": r.Header("event_type"),
				"ce_specversion": "1.0", "content-type": "application/avro"} {
				if got := r.Header(h); got != want || want == "" {
					t.Fatalf("record %s/%d@%d: header %s = %q, want %q", r.Topic, r.Partition, r.Offset, h, got, want)
				}
			}
			key, _, err := consumer.Decode(ctx, r.Key)
			if err != nil {
				t.Fatalf("record %s/%d@%d: key: %v", r.Topic, r.Partition, r.Offset, err)
			}
			if id, err := strconv.Unquote(string(key)); err == nil {
				out[i].Key = []byte(id)
			}
			value, _, err := consumer.Decode(ctx, r.Value)
			if err != nil {
				t.Fatalf("record %s/%d@%d: value: %v", r.Topic, r.Partition, r.Offset, err)
			}
			out[i].Value = value
			if w, ok := byID[r.Header("id")]; ok && sameJSON(value, []byte(w.Payload)) {
				out[i].Value = []byte(w.Payload)
			}
		}
		return out
	}
	c := harness.NewConsumer(k.Brokers(), harness.Topics(written, nil)...)
	defer c.Close()
	readCtx, cancel := context.WithTimeout(ctx, deliverTimeout)
	defer cancel()
	if err := c.ReadUntil(readCtx, time.Second, func(recs []harness.Record) bool {
		return len(recs) >= len(written)
	}); err != nil {
		t.Fatalf("reading back: %v", err)
	}
	rep := harness.Verify(written, decoded(c.Records()), nil)
	if !rep.OK() {
		t.Fatalf("after SIGKILL with Avro: %s", rep)
	}
	t.Logf("after SIGKILL with Avro: %s", rep)
	stopRelay(t, relay)
}

// sameJSON reports whether a and b are the same JSON document (member order and spacing aside).
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return bytes.Equal(ja, jb)
}
