package producer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
)

// The v2 record batch is encoded here rather than by kafka-go, whose encoder writes producer id,
// epoch and base sequence as -1 and has no transactional bit: the idempotent and transactional
// producer needs all four. The format is Kafka's "Record Batch" (KIP-98):
//
//	baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (2) |
//	crc uint32 (CRC-32C of everything after it) | attributes int16 | lastOffsetDelta int32 |
//	baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16 |
//	baseSequence int32 | recordCount int32 | records (compressed as a whole when a codec is set)
const (
	batchHeaderSize   = 61
	batchCRCOffset    = 17 // where the crc sits; it covers the bytes from batchCRCOffset+4 on
	attrTransactional = 0x10
	NoProducerID      = -1 // producer id, epoch and sequence of a batch sent without idempotence
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// State is what a batch carries in its header for idempotence.
type State struct {
	ID            int64 // NoProducerID without idempotence
	Epoch         int16
	Seq           int32 // base sequence
	Transactional bool
}

// encodeRecordSet appends to dst the record set of a produce request for kafka-go's
// RawRecordSet: the batch's size as an int32, then the batch.
func encodeRecordSet(dst []byte, batch []*Record, ps State, compression kafka.Compression) ([]byte, error) {
	size := 4 + batchHeaderSize
	for _, rec := range batch {
		size += RecordSize(&rec.Msg) // an upper bound of the encoded record, so one allocation suffices
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = slices.Grow(dst, size)
	buf, err := encodeBatch(dst, batch, ps, compression)
	if err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(len(buf)-start-4))
	return buf, nil
}

// encodeBatch appends the v2 record batch holding batch's records to dst.
func encodeBatch(dst []byte, batch []*Record, ps State, compression kafka.Compression) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, batchHeaderSize)...)
	base := batch[0].Msg.Time
	maxTime := base
	for _, rec := range batch {
		if rec.Msg.Time.After(maxTime) {
			maxTime = rec.Msg.Time
		}
	}
	var attrs int16
	if ps.Transactional {
		attrs |= attrTransactional
	}
	if compression != 0 {
		codec := compression.Codec()
		if codec == nil {
			return nil, fmt.Errorf("unknown compression codec %d", compression)
		}
		attrs |= int16(codec.Code())
		var raw []byte
		for i, rec := range batch {
			raw = appendRecord(raw, &rec.Msg, i, base)
		}
		var buf bytes.Buffer
		w := codec.NewWriter(&buf)
		if _, err := w.Write(raw); err != nil {
			return nil, fmt.Errorf("compress: %w", err)
		}
		if err := w.Close(); err != nil {
			return nil, fmt.Errorf("compress: %w", err)
		}
		dst = append(dst, buf.Bytes()...)
	} else {
		for i, rec := range batch {
			dst = appendRecord(dst, &rec.Msg, i, base)
		}
	}
	h := dst[start : start+batchHeaderSize]
	be := binary.BigEndian
	be.PutUint64(h[0:], 0)                         // baseOffset: the broker assigns offsets
	be.PutUint32(h[8:], uint32(len(dst)-start-12)) // batchLength: after this field
	be.PutUint32(h[12:], 0xffffffff)               // partitionLeaderEpoch: -1, set by the broker
	h[16] = 2                                      // magic
	be.PutUint16(h[21:], uint16(attrs))            // attributes
	be.PutUint32(h[23:], uint32(len(batch)-1))     // lastOffsetDelta
	be.PutUint64(h[27:], uint64(millis(base)))     // baseTimestamp
	be.PutUint64(h[35:], uint64(millis(maxTime)))  // maxTimestamp
	be.PutUint64(h[43:], uint64(ps.ID))            // producerId
	be.PutUint16(h[51:], uint16(ps.Epoch))         // producerEpoch
	be.PutUint32(h[53:], uint32(ps.Seq))           // baseSequence
	be.PutUint32(h[57:], uint32(len(batch)))       // recordCount
	be.PutUint32(h[batchCRCOffset:], crc32.Checksum(dst[start+batchCRCOffset+4:], castagnoli))
	return dst, nil
}

// appendRecord appends one record of a v2 batch: its length, then attributes, timestamp and
// offset deltas, key, value and headers, lengths as zigzag varints.
func appendRecord(dst []byte, m *kafka.Message, offsetDelta int, base time.Time) []byte {
	var body [64]byte
	b := body[:0]
	b = append(b, 0) // attributes: unused
	b = binary.AppendVarint(b, millis(m.Time)-millis(base))
	b = binary.AppendVarint(b, int64(offsetDelta))
	size := len(b) + varintBytes(m.Key) + varintBytes(m.Value) + varintLen(int64(len(m.Headers)))
	for _, h := range m.Headers {
		size += varintLen(int64(len(h.Key))) + len(h.Key) + varintBytes(h.Value)
	}
	dst = binary.AppendVarint(dst, int64(size))
	dst = append(dst, b...)
	dst = appendVarBytes(dst, m.Key)
	dst = appendVarBytes(dst, m.Value)
	dst = binary.AppendVarint(dst, int64(len(m.Headers)))
	for _, h := range m.Headers {
		dst = binary.AppendVarint(dst, int64(len(h.Key)))
		dst = append(dst, h.Key...)
		dst = appendVarBytes(dst, h.Value)
	}
	return dst
}

// appendVarBytes appends a length-prefixed byte string; nil is length -1.
func appendVarBytes(dst, v []byte) []byte {
	if v == nil {
		return binary.AppendVarint(dst, -1)
	}
	dst = binary.AppendVarint(dst, int64(len(v)))
	return append(dst, v...)
}

// varintBytes is the encoded size of appendVarBytes(v).
func varintBytes(v []byte) int {
	if v == nil {
		return 1
	}
	return varintLen(int64(len(v))) + len(v)
}

func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

func millis(t time.Time) int64 {
	if t.IsZero() {
		return -1
	}
	return t.UnixMilli()
}

// NextSequence is seq advanced by n, wrapping at the largest int32 to 0 as Kafka does
// (DefaultRecordBatch.incrementSequence).
func NextSequence(seq int32, n int) int32 {
	if int64(seq)+int64(n) > 0x7fffffff {
		return int32(int64(n) - (0x7fffffff - int64(seq)) - 1)
	}
	return seq + int32(n)
}
