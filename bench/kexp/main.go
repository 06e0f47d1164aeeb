// Temporary experiment (not committed): kafka-go Writer throughput as the sink configures it.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

func main() {
	n := flag.Int("n", 200000, "")
	batch := flag.Int("batch", 500, "")
	linger := flag.Duration("linger", 5*time.Millisecond, "")
	inflight := flag.Int64("inflight", 10000, "")
	parts := flag.Int("parts", 3, "")
	adaptive := flag.Bool("adaptive", false, "per-partition goroutine: produce everything queued while the previous request was in flight")
	flag.Parse()
	ctx := context.Background()
	k, err := devenv.StartKafka(ctx, devenv.KafkaOptions{HeapMB: 1024, Settings: map[string]string{"auto.create.topics.enable": "false"}})
	if err != nil {
		panic(err)
	}
	defer k.Close(ctx)
	topics := []string{"t.order", "t.customer", "t.shipment"}
	for _, t := range topics {
		if err := k.CreateTopic(ctx, t, *parts); err != nil {
			panic(err)
		}
	}
	var acked, inFlight atomic.Int64
	wake := make(chan struct{}, 1)
	w := &kafka.Writer{Addr: kafka.TCP(k.Brokers()), Balancer: kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll,
		Async: true, MaxAttempts: math.MaxInt32, BatchSize: *batch, BatchBytes: 1 << 20, BatchTimeout: *linger,
		WriteTimeout: 10 * time.Second, Transport: &kafka.Transport{},
		Completion: func(msgs []kafka.Message, err error) {
			if err != nil {
				panic(err)
			}
			acked.Add(int64(len(msgs)))
			inFlight.Add(-int64(len(msgs)))
			select {
			case wake <- struct{}{}:
			default:
			}
		}}
	if *adaptive {
		runAdaptive(ctx, k.Brokers(), topics, *parts, *n, *inflight)
		return
	}
	payload := make([]byte, 310)
	for i := range payload {
		payload[i] = 'x'
	}
	// warm up metadata
	w.WriteMessages(ctx, kafka.Message{Topic: topics[0], Key: []byte("w"), Value: payload})
	time.Sleep(time.Second)
	acked.Store(0)
	inFlight.Store(0)
	start := time.Now()
	buf := make([]kafka.Message, 0, 256)
	for i := 0; i < *n; {
		for inFlight.Load() >= *inflight {
			<-wake
		}
		buf = buf[:0]
		for j := 0; j < 256 && i < *n && inFlight.Load()+int64(len(buf)) < *inflight; j++ {
			a := i % 1000
			buf = append(buf, kafka.Message{Topic: topics[a%3], Key: []byte("agg-" + strconv.Itoa(a)), Value: payload,
				Headers: []kafka.Header{{Key: "id", Value: []byte("0123456789abcdef0123456789abcdef0123")}}})
			i++
		}
		inFlight.Add(int64(len(buf)))
		w.WriteMessages(ctx, buf...)
	}
	for acked.Load() < int64(*n) {
		time.Sleep(time.Millisecond)
	}
	el := time.Since(start)
	st := w.Stats()
	fmt.Printf("n=%d batch=%d linger=%s inflight=%d parts=%d: %.0f msgs/s; writes=%d avg batch=%d msgs, write time avg=%s max=%s, batch time avg=%s\n",
		*n, *batch, *linger, *inflight, *parts, float64(*n)/el.Seconds(), st.Writes, st.BatchSize.Avg, st.WriteTime.Avg, st.WriteTime.Max, st.BatchTime.Avg)
	w.Close()
}

type pmsg struct {
	key, value []byte
	hdr        []kafka.Header
}

// runAdaptive: one goroutine per partition; each request carries everything that queued up while
// the previous one was in flight (no linger), at most 1 MiB.
func runAdaptive(ctx context.Context, brokers string, topics []string, parts, n int, inflight int64) {
	client := &kafka.Client{Addr: kafka.TCP(brokers), Transport: &kafka.Transport{}}
	type tp struct {
		topic string
		part  int
	}
	queues := map[tp]chan pmsg{}
	var acked, inFlight, writes atomic.Int64
	wake := make(chan struct{}, 1)
	bal := kafka.Murmur2Balancer{}
	allParts := make([]int, parts)
	for i := range allParts {
		allParts[i] = i
	}
	for _, t := range topics {
		for p := 0; p < parts; p++ {
			q := make(chan pmsg, inflight)
			queues[tp{t, p}] = q
			go func(topic string, part int) {
				recs := make([]kafka.Record, 0, 4096)
				for m := range q {
					recs = append(recs[:0], kafka.Record{Key: kafka.NewBytes(m.key), Value: kafka.NewBytes(m.value), Headers: m.hdr})
					size := len(m.value) + 100
				more:
					for size < 1<<20 {
						select {
						case m := <-q:
							recs = append(recs, kafka.Record{Key: kafka.NewBytes(m.key), Value: kafka.NewBytes(m.value), Headers: m.hdr})
							size += len(m.value) + 100
						default:
							break more
						}
					}
					res, err := client.Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: part, RequiredAcks: kafka.RequireAll,
						Records: kafka.NewRecordReader(recs...)})
					if err == nil && res.Error != nil {
						err = res.Error
					}
					if err != nil {
						panic(err)
					}
					writes.Add(1)
					acked.Add(int64(len(recs)))
					inFlight.Add(-int64(len(recs)))
					select {
					case wake <- struct{}{}:
					default:
					}
				}
			}(t, p)
		}
	}
	payload := make([]byte, 310)
	for i := range payload {
		payload[i] = 'x'
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		for inFlight.Load() >= inflight {
			<-wake
		}
		a := i % 1000
		key := []byte("agg-" + strconv.Itoa(a))
		topic := topics[a%3]
		p := bal.Balance(kafka.Message{Key: key}, allParts...)
		inFlight.Add(1)
		queues[tp{topic, p}] <- pmsg{key: key, value: payload, hdr: []kafka.Header{{Key: "id", Value: []byte("0123456789abcdef0123456789abcdef0123")}}}
	}
	for acked.Load() < int64(n) {
		time.Sleep(time.Millisecond)
	}
	el := time.Since(start)
	fmt.Printf("adaptive n=%d inflight=%d parts=%d: %.0f msgs/s, %d requests (%.0f msgs per request)\n", n, inflight, parts, float64(n)/el.Seconds(), writes.Load(), float64(n)/float64(writes.Load()))
}
