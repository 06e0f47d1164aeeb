package workload

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// The consumer speaks Fetch itself, on a plain connection, because kafka-go throws away what it
// needs: a record batch's max timestamp and timestamp type. With message.timestamp.type=
// LogAppendTime the broker stamps only the batch header (maxTimestamp, and the type bit in the
// attributes) and leaves the records' own timestamps as the producer wrote them, so the append
// time is in the header alone (the Java consumer reads it from there too). kafka-go still decodes
// the records (varints, compression); readcommitted's rules drop what aborted transactions wrote.

const (
	fetchVersion    = 5 // isolation level, last stable offset, aborted transactions, log start offset; not flexible
	fetchMaxWait    = 250 * time.Millisecond
	partitionBytes  = 1 << 20 // a larger first batch still comes whole (KIP-74)
	fetchBytes      = 8 << 20
	fetchIOSlack    = 5 * time.Second // beyond maxWait before a silent (frozen) broker counts as dead
	batchHeaderSize = 61              // record batch v2 header up to the record count
	logAppendTime   = 1 << 3          // timestamp type bit of a batch's attributes
	controlBit      = 1 << 5
)

type partitionFetch struct {
	topic     string
	partition int
	offset    int64
}

type partitionResult struct {
	topic          string
	partition      int
	err            kafka.Error // 0 for none
	logStartOffset int64
	lso            int64
	records        []fetched
	next           int64 // the offset to fetch from next
}

type fetched struct {
	offset  int64
	time    time.Time // the append time when the topic stamps LogAppendTime
	key     []byte
	value   []byte
	headers []kafka.Header
}

// brokerConn is one plain connection to a broker, used by one goroutine.
type brokerConn struct {
	addr string
	conn net.Conn
	r    *bufio.Reader
	corr int32
}

func dialBroker(ctx context.Context, addr string) (*brokerConn, error) {
	dctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &brokerConn{addr: addr, conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}, nil
}

func (b *brokerConn) close() { b.conn.Close() }

// fetch asks for parts (in that order: the first non-empty one is sure to return a whole batch)
// with isolation (1: read_committed, 0: read_uncommitted).
func (b *brokerConn) fetch(ctx context.Context, isolation int8, parts []partitionFetch) ([]partitionResult, error) {
	stop := context.AfterFunc(ctx, func() { b.conn.SetDeadline(time.Now()) })
	defer stop()
	b.conn.SetDeadline(time.Now().Add(fetchMaxWait + fetchIOSlack))
	b.corr++
	var req enc
	req.i16(1) // Fetch
	req.i16(fetchVersion)
	req.i32(b.corr)
	req.str("outbox-chaos")
	req.i32(-1) // replica id: a consumer
	req.i32(int32(fetchMaxWait / time.Millisecond))
	req.i32(1) // min bytes
	req.i32(fetchBytes)
	req.i8(isolation)
	topics := groupByTopic(parts)
	req.i32(int32(len(topics)))
	for _, t := range topics {
		req.str(t[0].topic)
		req.i32(int32(len(t)))
		for _, p := range t {
			req.i32(int32(p.partition))
			req.i64(p.offset)
			req.i64(-1) // log start offset: consumers send -1
			req.i32(partitionBytes)
		}
	}
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(req.b)))
	if _, err := b.conn.Write(append(frame, req.b...)); err != nil {
		return nil, fmt.Errorf("fetch from %s: %w", b.addr, err)
	}
	var size [4]byte
	if _, err := io.ReadFull(b.r, size[:]); err != nil {
		return nil, fmt.Errorf("fetch from %s: %w", b.addr, err)
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(b.r, body); err != nil {
		return nil, fmt.Errorf("fetch from %s: %w", b.addr, err)
	}
	res, err := parseFetch(body, b.corr, isolation == 1, parts)
	if err != nil {
		return nil, fmt.Errorf("fetch from %s: %w", b.addr, err)
	}
	return res, nil
}

func groupByTopic(parts []partitionFetch) [][]partitionFetch {
	var out [][]partitionFetch
	for _, p := range parts {
		i := slices.IndexFunc(out, func(g []partitionFetch) bool { return g[0].topic == p.topic })
		if i < 0 {
			out = append(out, nil)
			i = len(out) - 1
		}
		out[i] = append(out[i], p)
	}
	return out
}

func parseFetch(body []byte, corr int32, committed bool, asked []partitionFetch) ([]partitionResult, error) {
	d := dec{b: body}
	if c := d.i32(); c != corr && d.err == nil {
		return nil, fmt.Errorf("response to request %d, want %d", c, corr)
	}
	d.i32() // throttle time
	var out []partitionResult
	for range d.count() {
		topic := d.str()
		for range d.count() {
			r := partitionResult{topic: topic, partition: int(d.i32()), err: kafka.Error(d.i16())}
			d.i64() // high watermark
			r.lso = d.i64()
			r.logStartOffset = d.i64()
			var aborted []abortedTxn
			for range d.count() {
				aborted = append(aborted, abortedTxn{producer: d.i64(), first: d.i64()})
			}
			records := d.bytes()
			if d.err != nil {
				break
			}
			i := slices.IndexFunc(asked, func(p partitionFetch) bool { return p.topic == topic && p.partition == r.partition })
			if i < 0 {
				return nil, fmt.Errorf("response holds %s/%d, which was not asked for", topic, r.partition)
			}
			r.next = asked[i].offset
			if r.err == 0 {
				if err := r.decode(records, aborted, committed); err != nil {
					return nil, fmt.Errorf("%s/%d at %d: %w", topic, r.partition, r.next, err)
				}
			}
			out = append(out, r)
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("decode response: %w", d.err)
	}
	return out, nil
}

type abortedTxn struct{ producer, first int64 }

// batchHeader is what decode needs of a record batch's header, which kafka-go does not expose.
type batchHeader struct {
	base, last   int64
	attributes   int16
	maxTimestamp int64
}

// decode keeps the records of the whole batches in records from r.next on; under read_committed
// it drops the batches of aborted transactions the way readcommitted does (a transactional batch
// is skipped while its producer has an aborted transaction open at it, from the transaction's
// first offset up to that producer's abort marker). Control batches are never returned.
func (r *partitionResult) decode(records []byte, aborted []abortedTxn, committed bool) error {
	var headers []batchHeader
	end := 0
	for pos := 0; len(records)-pos >= batchHeaderSize; {
		n := int(int32(binary.BigEndian.Uint32(records[pos+8:])))
		if n <= 0 || pos+12+n > len(records) {
			break // a partial batch at the end: fetched again next time
		}
		if magic := records[pos+16]; magic != 2 {
			return fmt.Errorf("record batch of magic %d: only v2 is read", magic)
		}
		base := int64(binary.BigEndian.Uint64(records[pos:]))
		headers = append(headers, batchHeader{
			base:         base,
			last:         base + int64(int32(binary.BigEndian.Uint32(records[pos+23:]))),
			attributes:   int16(binary.BigEndian.Uint16(records[pos+21:])),
			maxTimestamp: int64(binary.BigEndian.Uint64(records[pos+35:])),
		})
		pos += 12 + n
		end = pos
	}
	if end == 0 {
		return nil
	}
	var rs protocol.RecordSet
	framed := binary.BigEndian.AppendUint32(make([]byte, 0, 4+end), uint32(end))
	if _, err := rs.ReadFrom(bytes.NewBuffer(append(framed, records[:end]...))); err != nil {
		return fmt.Errorf("decode records: %w", err)
	}
	var batches []protocol.RecordReader
	switch s := rs.Records.(type) {
	case *protocol.RecordStream:
		batches = s.Records
	case nil:
	default:
		batches = []protocol.RecordReader{s}
	}
	if len(batches) != len(headers) {
		return fmt.Errorf("decoded %d batches, the headers say %d", len(batches), len(headers))
	}
	slices.SortFunc(aborted, func(a, b abortedTxn) int { return cmp.Compare(a.first, b.first) })
	open := make(map[int64]bool) // producers inside an aborted transaction
	from := r.next
	for i, batch := range batches {
		h := headers[i]
		r.next = max(r.next, h.last+1)
		if committed {
			for len(aborted) > 0 && aborted[0].first <= h.base {
				open[aborted[0].producer] = true
				aborted = aborted[1:]
			}
		}
		switch b := batch.(type) {
		case *protocol.ControlBatch:
			for {
				cr, err := b.ReadControlRecord()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				if cr.Type == 0 { // abort marker: the producer's aborted transaction ends here
					delete(open, b.ProducerID)
				}
			}
		case *protocol.RecordBatch:
			skip := committed && b.Attributes.Transactional() && open[b.ProducerID]
			if err := r.add(b, h, skip, from); err != nil {
				return err
			}
		default:
			return fmt.Errorf("batch at %d of type %T", h.base, batch)
		}
	}
	return nil
}

func (r *partitionResult) add(batch protocol.RecordReader, h batchHeader, skip bool, from int64) error {
	for {
		rec, err := batch.ReadRecord()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if skip || rec.Offset < from {
			closeBytes(rec.Key)
			closeBytes(rec.Value)
			continue
		}
		f := fetched{offset: rec.Offset, time: rec.Time}
		if h.attributes&logAppendTime != 0 {
			f.time = time.UnixMilli(h.maxTimestamp)
		}
		if f.key, err = readBytes(rec.Key); err == nil {
			f.value, err = readBytes(rec.Value)
		}
		if err != nil {
			return err
		}
		for _, hd := range rec.Headers {
			f.headers = append(f.headers, kafka.Header{Key: hd.Key, Value: hd.Value})
		}
		r.records = append(r.records, f)
	}
}

func readBytes(b protocol.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	defer b.Close()
	v, err := io.ReadAll(b)
	if v == nil {
		v = []byte{}
	}
	return v, err
}

func closeBytes(b protocol.Bytes) {
	if b != nil {
		b.Close()
	}
}

// enc and dec are the few Kafka primitive types a v5 Fetch needs.
type enc struct{ b []byte }

func (e *enc) i8(v int8)   { e.b = append(e.b, byte(v)) }
func (e *enc) i16(v int16) { e.b = binary.BigEndian.AppendUint16(e.b, uint16(v)) }
func (e *enc) i32(v int32) { e.b = binary.BigEndian.AppendUint32(e.b, uint32(v)) }
func (e *enc) i64(v int64) { e.b = binary.BigEndian.AppendUint64(e.b, uint64(v)) }
func (e *enc) str(s string) {
	e.i16(int16(len(s)))
	e.b = append(e.b, s...)
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil || n < 0 || len(d.b) < n {
		if d.err == nil {
			d.err = io.ErrUnexpectedEOF
		}
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) i16() int16 {
	if v := d.take(2); v != nil {
		return int16(binary.BigEndian.Uint16(v))
	}
	return 0
}

func (d *dec) i32() int32 {
	if v := d.take(4); v != nil {
		return int32(binary.BigEndian.Uint32(v))
	}
	return 0
}

func (d *dec) i64() int64 {
	if v := d.take(8); v != nil {
		return int64(binary.BigEndian.Uint64(v))
	}
	return 0
}

func (d *dec) str() string { return string(d.take(int(d.i16()))) }

// count reads an array length; a null array (-1) is empty.
func (d *dec) count() int {
	n := int(d.i32())
	if d.err != nil || n < 0 {
		return 0
	}
	return n
}

// bytes reads nullable bytes; null is nil.
func (d *dec) bytes() []byte {
	n := int(d.i32())
	if n < 0 {
		return nil
	}
	return d.take(n)
}
