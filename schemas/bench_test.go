package schemas_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/schemas/avro"
)

// benchPayloads are payloads as make bench writes them (bench_payload, printed by PostgreSQL as
// jsonb text, about 314 bytes): a few shapes, since sent_ns is 0 (an int) in the backlog and a
// clock reading (a long) in the latency rounds, and warm flips.
func benchPayloads() [][]byte {
	var out [][]byte
	for i := range 64 {
		sent := int64(0)
		if i%4 == 3 {
			sent = 1765065600123456789 + int64(i)
		}
		out = append(out, fmt.Appendf(nil, `{"n": %d, "note": %q, "warm": %t, "amount": %d.%02d, "sent_ns": %d, "currency": "EUR", "aggregate": "agg-%d"}`,
			1000+i, strings.Repeat("x", 200), i%8 == 5, 100+i, i%100, sent, i%1000))
	}
	return out
}

// BenchmarkAvroSerialize is the relay's Avro drain per record (value_encoding and key_encoding
// avro, auto-registered): the steady state, every id cached, over bench payloads of a few shapes
// routed to three topics; by the payload's shape (the Serializer's way) and inferring every
// payload (its way before, kept for any Format but Avro: the yardstick).
func BenchmarkAvroSerialize(b *testing.B) {
	formats := []struct {
		name  string
		value schemas.Format
	}{
		{"by shape", avro.New()},
		{"inferring each payload", inferring{avro.New()}},
	}
	for _, f := range formats {
		b.Run(f.name, func(b *testing.B) {
			s, err := schemas.New(&fakeRegistry{}, schemas.Options{Value: f.value, AvroKey: true, AutoRegister: true})
			if err != nil {
				b.Fatal(err)
			}
			payloads := benchPayloads()
			topics := []string{"outbox.event.order", "outbox.event.customer", "outbox.event.shipment"}
			ctx := context.Background()
			for i := range 2 * len(payloads) { // warm: every subject's schema widened and registered
				if _, _, err := s.Serialize(ctx, topics[i%3], "Happened", []byte("agg-1"), payloads[i%len(payloads)]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, _, err := s.Serialize(ctx, topics[i%3], "Happened", []byte("agg-1"), payloads[i%len(payloads)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
