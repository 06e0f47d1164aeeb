// Package readcommitted reads a Kafka partition the way a read_committed consumer does: only up to
// the last stable offset, without the records of aborted transactions and without control
// records. kafka-go's Reader asks the broker for read_committed but keeps the records of aborted
// transactions (it drops the fetch response's list of them), so what it returns is not what a
// read_committed Java consumer sees.
package readcommitted

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/fetch"
)

// Record is one committed record.
type Record struct {
	Offset  int64
	Time    time.Time
	Key     []byte // nil for a null key
	Value   []byte // nil for a null value
	Headers []kafka.Header
	// ProducerID is the producer id of the record's batch (-1: none), and Transactional says
	// whether the batch was written inside a Kafka transaction (a committed one: aborted records
	// are not returned).
	ProducerID    int64
	Transactional bool
}

// Result is what one fetch returned.
type Result struct {
	Records []Record
	// Next is the offset to fetch from next: after the last batch the response held (committed,
	// aborted or control), or the offset asked for when it held none.
	Next             int64
	LastStableOffset int64
	HighWatermark    int64
	LogStartOffset   int64
}

// Fetch reads topic/partition from offset with isolation level read_committed, at most about
// maxBytes, waiting up to maxWait for data.
func Fetch(ctx context.Context, client *kafka.Client, topic string, partition int, offset int64, maxBytes int, maxWait time.Duration) (Result, error) {
	res, err := client.Transport.RoundTrip(ctx, client.Addr, &fetch.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(maxWait.Milliseconds()),
		MinBytes:       1,
		MaxBytes:       int32(maxBytes),
		IsolationLevel: 1, // read_committed
		SessionID:      0,
		SessionEpoch:   -1, // no fetch session
		Topics: []fetch.RequestTopic{{
			Topic: topic,
			Partitions: []fetch.RequestPartition{{
				Partition:          int32(partition),
				CurrentLeaderEpoch: -1,
				FetchOffset:        offset,
				LogStartOffset:     -1,
				PartitionMaxBytes:  int32(maxBytes),
			}},
		}},
	})
	if err != nil {
		return Result{}, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, offset, err)
	}
	r := res.(*fetch.Response)
	if r.ErrorCode != 0 {
		return Result{}, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, offset, kafka.Error(r.ErrorCode))
	}
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			if t.Topic != topic || int(p.Partition) != partition {
				continue
			}
			if p.ErrorCode != 0 {
				return Result{}, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, offset, kafka.Error(p.ErrorCode))
			}
			out := Result{Next: offset, LastStableOffset: p.LastStableOffset, HighWatermark: p.HighWatermark, LogStartOffset: p.LogStartOffset}
			if err := out.committed(p, offset); err != nil {
				return Result{}, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, offset, err)
			}
			return out, nil
		}
	}
	return Result{}, fmt.Errorf("fetch %s/%d at %d: the response does not hold the partition", topic, partition, offset)
}

// committed keeps the records of p's batches that a read_committed consumer returns, as the Java
// consumer decides it: a transactional batch is dropped while its producer has an aborted
// transaction open at it (from the transaction's first offset, listed in the response, up to
// that producer's abort marker); control batches are dropped.
func (out *Result) committed(p fetch.ResponsePartition, from int64) error {
	aborted := slices.Clone(p.AbortedTransactions)
	slices.SortFunc(aborted, func(a, b fetch.ResponseTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	open := make(map[int64]bool) // producers inside an aborted transaction
	stream, ok := p.RecordSet.Records.(*protocol.RecordStream)
	if !ok || stream == nil {
		return nil // no records
	}
	for _, batch := range stream.Records {
		switch b := batch.(type) {
		case *protocol.ControlBatch:
			for len(aborted) > 0 && aborted[0].FirstOffset <= b.BaseOffset {
				open[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			last := b.BaseOffset
			for {
				cr, err := b.ReadControlRecord()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				last = cr.Offset
				if cr.Type == 0 { // abort marker: the producer's aborted transaction ends here
					delete(open, b.ProducerID)
				}
			}
			out.Next = max(out.Next, last+1)
		case *protocol.RecordBatch:
			for len(aborted) > 0 && aborted[0].FirstOffset <= b.BaseOffset {
				open[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			if err := out.add(b, b.Attributes.Transactional() && open[b.ProducerID], from, b.ProducerID, b.Attributes.Transactional()); err != nil {
				return err
			}
		default: // a v0/v1 message set: no transactions there, but nothing this project writes
			if err := out.add(batch, false, from, -1, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// add appends the records of batch (written by producerID, in a transaction or not) from offset
// from on, unless skip (it only advances Next).
func (out *Result) add(batch protocol.RecordReader, skip bool, from, producerID int64, transactional bool) error {
	for {
		r, err := batch.ReadRecord()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		out.Next = max(out.Next, r.Offset+1)
		if skip || r.Offset < from {
			closeBytes(r)
			continue
		}
		rec := Record{Offset: r.Offset, Time: r.Time, ProducerID: producerID, Transactional: transactional}
		if rec.Key, err = readBytes(r.Key); err == nil {
			rec.Value, err = readBytes(r.Value)
		}
		if err != nil {
			return err
		}
		for _, h := range r.Headers {
			rec.Headers = append(rec.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		out.Records = append(out.Records, rec)
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

func closeBytes(r *protocol.Record) {
	if r.Key != nil {
		r.Key.Close()
	}
	if r.Value != nil {
		r.Value.Close()
	}
}
