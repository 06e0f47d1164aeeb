package decoder

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// The pgoutput protocol, version 1:
// https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
// The relay parses it itself rather than with pglogrepl.Parse because pglogrepl copies every column
// byte by byte into a fresh allocation; here column values stay slices of the message buffer.

var errShort = errors.New("message truncated")

// reader walks a pgoutput message. Errors are sticky: after the first one every read returns a
// zero value, and err reports what went wrong.
type reader struct {
	buf []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.buf) < n {
		r.err = errShort
		return nil
	}
	b := r.buf[:n:n]
	r.buf = r.buf[n:]
	return b
}

func (r *reader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) lsn() pglogrepl.LSN { return pglogrepl.LSN(r.u64()) }

// pgEpoch is PostgreSQL's timestamp epoch; timestamps on the wire are microseconds since it.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func (r *reader) time() time.Time {
	return pgEpoch.Add(time.Duration(int64(r.u64())) * time.Microsecond)
}

// cstring reads a NUL-terminated string.
func (r *reader) cstring() string {
	return string(r.cbytes())
}

// cbytes is cstring without the copy: the bytes alias the message, so they are for comparing
// (a message's prefix, once a message), not for keeping.
func (r *reader) cbytes() []byte {
	if r.err != nil {
		return nil
	}
	if i := bytes.IndexByte(r.buf, 0); i >= 0 {
		b := r.buf[:i:i]
		r.buf = r.buf[i+1:]
		return b
	}
	r.err = errShort
	return nil
}

// Tuple column kinds in TupleData.
const (
	colNull      = 'n'
	colUnchanged = 'u' // unchanged TOASTed value; never in an INSERT
	colText      = 't'
	colBinary    = 'b'
)

// column is one value of a TupleData. data is nil for NULL.
type column struct {
	kind byte
	data []byte
}

// tuple reads a TupleData into cols, reusing its storage.
func (r *reader) tuple(cols []column) []column {
	n := int(r.u16())
	cols = cols[:0]
	for i := 0; i < n && r.err == nil; i++ {
		c := column{kind: r.u8()}
		if r.err != nil {
			break // keep the first error: a missing kind byte is a truncated message, not kind 0
		}
		switch c.kind {
		case colText, colBinary:
			c.data = r.take(int(r.u32()))
		case colNull, colUnchanged:
		default:
			r.err = fmt.Errorf("unknown tuple column kind %q", c.kind)
		}
		cols = append(cols, c)
	}
	return cols
}
