package producer

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// BenchmarkEncodeRecordSet is the produce encoding of the table-free outbox's path: a batch of 25
// records (the bench's transactions hold 1 to 50 events) shaped like the bench's, with its
// built-in headers and one from the headers member. ns/op is per record.
func BenchmarkEncodeRecordSet(b *testing.B) {
	const n = 25
	t0 := time.UnixMilli(1_733_500_000_123)
	value := []byte(`{"n": 4711, "note": "` + strings.Repeat("x", 200) + `", "warm": false, "amount": 47.11, ` +
		`"sent_ns": 1733500000000000000, "currency": "EUR", "aggregate": "agg-42"}`)
	batch := make([]*Record, n)
	for i := range batch {
		batch[i] = &Record{Msg: kafka.Message{Key: []byte("agg-42"), Value: value, Time: t0,
			Headers: []kafka.Header{{Key: "id", Value: []byte("0b4e5c8e-1d2f-4a3b-9c8d-7e6f5a4b3c2d")},
				{Key: "event_type", Value: []byte("Happened")}, {Key: "aggregate_type", Value: []byte("order")},
				{Key: "tenant", Value: []byte("t2")}}}}
	}
	var buf []byte // reused, as produce reuses its pooled buffers
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = encodeRecordSet(buf[:0], batch, State{ID: 4711, Epoch: 3, Seq: 42}, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
}

// BenchmarkMessagePath is the table-free outbox's path from decoded CopyData to the produce
// request's bytes, per transaction of 25 events: each logical decoding message decoded
// (decoder.Decode), built into its record with the default options (record.Builder.Build), and
// the transaction's records encoded as one record set. The replication connection's read before
// it and the sink's bookkeeping and the request's round trip after it are not included.
func BenchmarkMessagePath(b *testing.B) {
	const n = 25
	d := decoder.New(decoder.Config{Table: "outbox", Columns: decoder.DefaultColumns(), MessagePrefix: "outbox"})
	builder, err := record.NewBuilder(record.Options{})
	if err != nil {
		b.Fatal(err)
	}
	be := binary.BigEndian
	begin := be.AppendUint32(be.AppendUint64(be.AppendUint64([]byte{'B'}, 0x16B3800), 786_000_000_000_000), 4711)
	commit := be.AppendUint64(be.AppendUint64(be.AppendUint64([]byte{'C', 0}, 0x16B3800), 0x16B3830), 786_000_000_000_000)
	msgs := make([][]byte, n)
	for i := range msgs {
		// The bench's content (bench/services.go's bench_emit), as jsonb prints it.
		content := fmt.Sprintf(`{"id": "0b4e5c8e-1d2f-4a3b-9c8d-%012d", "headers": {"tenant": "t%d"}, "payload": `+
			`{"n": %d, "note": "%s", "warm": false, "amount": 47.11, "sent_ns": 1733500000000000000, "currency": "EUR", `+
			`"aggregate": "agg-%d"}, "event_type": "Happened", "aggregate_id": "agg-%d", "aggregate_type": "%s"}`,
			i, i%10, i, strings.Repeat("x", 200), i, i, []string{"order", "customer", "shipment"}[i%3])
		m := be.AppendUint64([]byte{'M', 1}, uint64(0x16B3720+i))
		m = append(append(m, "outbox"...), 0)
		m = be.AppendUint32(m, uint32(len(content)))
		msgs[i] = append(m, content...)
	}
	batch := make([]*Record, n)
	for i := range batch {
		batch[i] = &Record{}
	}
	var buf []byte // reused, as produce reuses its pooled buffers
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode(0x16B3700, begin); err != nil {
			b.Fatal(err)
		}
		for i, m := range msgs {
			ch, err := d.Decode(0x16B3720, m)
			if err != nil || ch.Kind != decoder.Insert || ch.Unusable != nil {
				b.Fatalf("Decode = %s, %v, %v", ch.Kind, err, ch.Unusable)
			}
			r := builder.Build(ch.Event, now)
			if r.TopicErr != nil || r.HeadersErr != nil {
				b.Fatal(r.TopicErr, r.HeadersErr)
			}
			batch[i].Msg = r.Msg
		}
		if _, err := d.Decode(0x16B3830, commit); err != nil {
			b.Fatal(err)
		}
		if buf, err = encodeRecordSet(buf[:0], batch, State{ID: 4711, Epoch: 3, Seq: 42}, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}
