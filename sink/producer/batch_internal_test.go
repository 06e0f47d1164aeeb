package producer

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// TestEncodedBatchesDecodeWithKafkaGosReader: the hand-written v2 encoder must produce batches a
// client decodes (CRC-32C included) with the producer id, epoch, sequence and transactional bit
// set, for every codec.
func TestEncodedBatchesDecodeWithKafkaGosReader(t *testing.T) {
	t0 := time.UnixMilli(1_700_000_000_123)
	var batch []*Record
	for i := range 3 {
		m := kafka.Message{Key: []byte(fmt.Sprintf("key-%d", i)), Value: bytes.Repeat([]byte("v"), 200*i),
			Time: t0.Add(time.Duration(i) * time.Millisecond), Headers: []kafka.Header{{Key: "id", Value: []byte(fmt.Sprint(i))}, {Key: "empty", Value: nil}}}
		if i == 1 {
			m.Key = nil
		}
		batch = append(batch, &Record{Msg: m})
	}
	for _, c := range []kafka.Compression{0, kafka.Gzip, kafka.Snappy, kafka.Lz4, kafka.Zstd} {
		t.Run(fmt.Sprintf("codec %d", c), func(t *testing.T) {
			buf, err := encodeRecordSet(nil, batch, State{ID: 4711, Epoch: 3, Seq: 42, Transactional: true}, c)
			if err != nil {
				t.Fatal(err)
			}
			var rs protocol.RecordSet
			if _, err := rs.ReadFrom(bytes.NewReader(buf)); err != nil {
				t.Fatalf("decode: %v", err)
			}
			stream := rs.Records.(*protocol.RecordStream)
			rb, ok := stream.Records[0].(*protocol.RecordBatch)
			if !ok {
				t.Fatalf("got %T, want a record batch", stream.Records[0])
			}
			if rb.ProducerID != 4711 || rb.ProducerEpoch != 3 || rb.BaseSequence != 42 || !rb.Attributes.Transactional() {
				t.Errorf("header: producer %d epoch %d seq %d transactional %v", rb.ProducerID, rb.ProducerEpoch, rb.BaseSequence, rb.Attributes.Transactional())
			}
			for i := 0; ; i++ {
				r, err := rb.ReadRecord()
				if err == io.EOF {
					if i != 3 {
						t.Errorf("%d records, want 3", i)
					}
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				want := batch[i].Msg
				key, _ := readAll(r.Key)
				value, _ := readAll(r.Value)
				if r.Offset != int64(i) || !r.Time.Equal(want.Time) || !bytes.Equal(key, want.Key) || (want.Key == nil) != (r.Key == nil) ||
					!bytes.Equal(value, want.Value) || len(r.Headers) != 2 || string(r.Headers[0].Value) != fmt.Sprint(i) {
					t.Errorf("record %d: offset %d time %v key %q value %d bytes headers %v", i, r.Offset, r.Time, key, len(value), r.Headers)
				}
			}
		})
	}
}

func readAll(b protocol.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	return io.ReadAll(b)
}

func TestSequencesWrapAtTheLargestInt32ToZero(t *testing.T) {
	for _, tt := range []struct {
		seq  int32
		n    int
		want int32
	}{{0, 5, 5}, {0x7fffffff - 5, 5, 0x7fffffff}, {0x7fffffff - 5, 6, 0}, {0x7fffffff, 1, 0}, {0x7fffffff - 1, 10, 8}} {
		if got := NextSequence(tt.seq, tt.n); got != tt.want {
			t.Errorf("NextSequence(%d, %d) = %d, want %d", tt.seq, tt.n, got, tt.want)
		}
	}
}
