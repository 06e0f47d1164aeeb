package relay

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// pgoutput builds pgoutput (protocol 1) messages for feeding the pipeline directly.
type pgoutput struct{ b []byte }

func (w *pgoutput) u8(v byte) *pgoutput    { w.b = append(w.b, v); return w }
func (w *pgoutput) u16(v uint16) *pgoutput { w.b = binary.BigEndian.AppendUint16(w.b, v); return w }
func (w *pgoutput) u32(v uint32) *pgoutput { w.b = binary.BigEndian.AppendUint32(w.b, v); return w }
func (w *pgoutput) u64(v uint64) *pgoutput { w.b = binary.BigEndian.AppendUint64(w.b, v); return w }
func (w *pgoutput) str(s string) *pgoutput { w.b = append(append(w.b, s...), 0); return w }

type column struct {
	name string
	typ  uint32 // 25 text, 17 bytea
}

var outboxColumns = []column{{"id", 25}, {"aggregate_type", 25}, {"aggregate_id", 25}, {"event_type", 25}, {"payload", 25}, {"headers", 25}}

func relationMessage(cols []column) []byte {
	w := (&pgoutput{}).u8('R').u32(1).str("public").str("outbox_events").u8('d').u16(uint16(len(cols)))
	for _, c := range cols {
		w.u8(0).str(c.name).u32(c.typ).u32(0xFFFFFFFF)
	}
	return w.b
}

func beginMessage(commit uint64) []byte { return (&pgoutput{}).u8('B').u64(commit).u64(0).u32(7).b }

func commitMessage(commit, end uint64) []byte {
	return (&pgoutput{}).u8('C').u8(0).u64(commit).u64(end).u64(0).b
}

func insertMessage(values ...string) []byte {
	w := (&pgoutput{}).u8('I').u32(1).u8('N').u16(uint16(len(values)))
	for _, v := range values {
		w.u8('t').u32(uint32(len(v)))
		w.b = append(w.b, v...)
	}
	return w.b
}

func event(aggType string, i int, payload string, more ...string) []byte {
	return insertMessage(append([]string{fmt.Sprintf("00000000-0000-0000-0000-%012d", i), aggType, "agg", "T", payload, `{}`}, more...)...)
}

func dataMessage(b []byte) replication.Message {
	return replication.Message{Kind: replication.Data, WALStart: pglogrepl.LSN(1), Data: b}
}

func feed(msgs ...[]byte) <-chan replication.Message {
	ch := make(chan replication.Message, len(msgs))
	for _, m := range msgs {
		ch <- dataMessage(m)
	}
	close(ch)
	return ch
}

// newTestWAL builds a WAL source with a test logger and metrics on a registry of its own.
func newTestWAL(t *testing.T, cfg Config) (*walSource, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	return newWAL(t, cfg, zaptest.NewLogger(t), metrics.New(reg)), reg
}

// newWAL builds a WAL source over a sink of its own, with no relay around it: the test closes the
// sink. An empty decoder configuration is the default outbox table.
func newWAL(t *testing.T, cfg Config, log *zap.Logger, m *metrics.Metrics) *walSource {
	t.Helper()
	if cfg.Decoder.Table == "" {
		cfg.Decoder = decoder.Config{Table: "outbox_events", Columns: decoder.DefaultColumns()}
	}
	sk, err := sink.New(cfg.Sink, log.Named("sink"), m)
	if err != nil {
		t.Fatal(err)
	}
	return newWALSource(cfg, sk, log, m)
}

// publishedTotal sums outbox_relay_events_published_total.
func publishedTotal(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	return metricSum(t, reg, "outbox_relay_events_published_total")
}

// metricSum sums a counter over its labels.
func metricSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range families {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

type countAcks struct{ n int }

func (c *countAcks) Ack(n int) { c.n += n }
