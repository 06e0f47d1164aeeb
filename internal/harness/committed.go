package harness

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchAPI "github.com/segmentio/kafka-go/protocol/fetch"
)

// A read_committed consumer, the way the Java consumer implements isolation.level=read_committed:
// read up to each partition's last stable offset, and drop the records of aborted transactions
// (the broker returns them, with a list of the aborted transactions in the fetched range; the
// client filters) and the control records that mark transactions' ends.
//
// kafka-go's Reader with IsolationLevel ReadCommitted is not that: it stops at the last stable
// offset but returns aborted records as if they were committed. Tests of exactly-once delivery must
// not trust it, or they would count a relay's aborted transactions as duplicates (or, worse, a
// position read from an aborted transaction as committed).

// committedReader is the read_committed state of one partition.
type committedReader struct {
	next int64 // next offset to look at
	// aborted holds aborted transactions not yet reached, by first offset; abortedProducers the
	// producers whose transaction is being skipped until their abort marker.
	aborted          []fetchAPI.ResponseTransaction
	seenAborted      map[[2]int64]bool
	abortedProducers map[int64]bool
}

// drainCommitted reads topic/partition with read_committed from where it stopped up to the
// partition's last stable offset.
func (c *Consumer) drainCommitted(ctx context.Context, topic string, partition int) error {
	key := fmt.Sprintf("%s/%d", topic, partition)
	st := c.committed[key]
	if st == nil {
		first, _, err := c.offsets(ctx, topic, partition)
		if err != nil {
			return fmt.Errorf("offsets of %s/%d: %w", topic, partition, err)
		}
		st = &committedReader{next: first, seenAborted: map[[2]int64]bool{}, abortedProducers: map[int64]bool{}}
		c.committed[key] = st
	}
	for {
		recs, lso, err := c.fetchCommitted(ctx, topic, partition, st)
		if err != nil {
			return err
		}
		c.records = append(c.records, recs...)
		if st.next >= lso {
			return nil
		}
	}
}

// fetchCommitted does one read_committed fetch at st.next and returns the committed records in it
// and the partition's last stable offset; st.next moves past everything the fetch covered.
func (c *Consumer) fetchCommitted(ctx context.Context, topic string, partition int, st *committedReader) ([]Record, int64, error) {
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addr := kafka.TCP(strings.Split(c.brokers[0], ",")...)
	msg, err := c.transport.RoundTrip(fctx, addr, &fetchAPI.Request{
		ReplicaID:      -1,
		MaxWaitTime:    100,
		MinBytes:       1,
		MaxBytes:       32 << 20,
		IsolationLevel: 1, // read_committed
		SessionEpoch:   -1,
		Topics: []fetchAPI.RequestTopic{{Topic: topic, Partitions: []fetchAPI.RequestPartition{{
			Partition: int32(partition), CurrentLeaderEpoch: -1, FetchOffset: st.next, LogStartOffset: -1, PartitionMaxBytes: 16 << 20,
		}}}},
	})
	if err != nil {
		return nil, 0, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, st.next, err)
	}
	res, ok := msg.(*fetchAPI.Response)
	if !ok || len(res.Topics) != 1 || len(res.Topics[0].Partitions) != 1 {
		return nil, 0, fmt.Errorf("fetch %s/%d: unexpected response %T", topic, partition, msg)
	}
	p := res.Topics[0].Partitions[0]
	if p.ErrorCode != 0 {
		return nil, 0, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, st.next, kafka.Error(p.ErrorCode))
	}
	for _, a := range p.AbortedTransactions {
		if k := [2]int64{a.ProducerID, a.FirstOffset}; !st.seenAborted[k] {
			st.seenAborted[k] = true
			st.aborted = append(st.aborted, a)
		}
	}
	sort.Slice(st.aborted, func(i, j int) bool { return st.aborted[i].FirstOffset < st.aborted[j].FirstOffset })

	var out []Record
	if p.RecordSet.Records == nil {
		return nil, p.LastStableOffset, nil
	}
	stream, ok := p.RecordSet.Records.(*protocol.RecordStream)
	if !ok {
		stream = &protocol.RecordStream{Records: []protocol.RecordReader{p.RecordSet.Records}}
	}
	for _, batch := range stream.Records {
		switch b := batch.(type) {
		case *protocol.ControlBatch:
			cr, err := b.ReadControlRecord()
			if err == nil && cr.Type == 0 { // an abort marker ends the producer's aborted transaction
				delete(st.abortedProducers, b.ProducerID)
			}
			st.next = max(st.next, b.BaseOffset+1)
		case *protocol.RecordBatch:
			for len(st.aborted) > 0 && st.aborted[0].FirstOffset <= b.BaseOffset {
				st.abortedProducers[st.aborted[0].ProducerID] = true
				st.aborted = st.aborted[1:]
			}
			skip := b.Attributes.Transactional() && st.abortedProducers[b.ProducerID]
			for {
				r, err := b.ReadRecord()
				if err != nil {
					break
				}
				if r.Offset < st.next || r.Offset >= p.LastStableOffset {
					closeRecord(r)
					continue
				}
				st.next = r.Offset + 1
				if skip {
					closeRecord(r)
					continue
				}
				rec := Record{Topic: topic, Partition: partition, Offset: r.Offset, Time: r.Time, Headers: make(map[string]string, len(r.Headers))}
				if r.Key != nil {
					rec.Key, _ = protocol.ReadAll(r.Key)
				}
				if r.Value != nil {
					rec.Value, _ = protocol.ReadAll(r.Value)
				}
				for _, h := range r.Headers {
					rec.Headers[h.Key] = string(h.Value)
				}
				closeRecord(r)
				out = append(out, rec)
			}
		}
	}
	if len(out) == 0 && st.next < p.LastStableOffset && len(stream.Records) == 0 {
		return nil, 0, fmt.Errorf("fetch %s/%d at %d: no records below the last stable offset %d", topic, partition, st.next, p.LastStableOffset)
	}
	return out, p.LastStableOffset, nil
}

func closeRecord(r *protocol.Record) {
	if r.Key != nil {
		r.Key.Close()
	}
	if r.Value != nil {
		r.Value.Close()
	}
}
