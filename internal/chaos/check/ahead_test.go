package check

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// ahead is a run of three transactions with commit LSNs 100, 200 and 300, published at 2, 4 and
// 6 s, and the given slot samples (seconds, confirmed LSN).
func ahead(delivery string, samples ...[2]float64) *builder {
	b := newBuilder(delivery)
	for i, id := range []string{"e1", "e2", "e3"} {
		b.txn("t"+id, history.Committed, float64(i), ev(id, "k1", i+1))
		b.h.Txns[i].CommitLSN = uint64(100 * (i + 1))
		b.h.Txns[i].Slot = "s"
	}
	b.publish(2, "e1")
	b.publish(4, "e2")
	b.publish(6, "e3")
	for _, s := range samples {
		b.h.Slots = append(b.h.Slots, history.SlotSample{At: at(s[0]), Slot: "s", ConfirmedLSN: uint64(s[1]), WALEnd: 1000})
	}
	return b
}

func TestSlotAheadOfKafka(t *testing.T) {
	tests := []struct {
		name  string
		build func() *history.History
		want  int
	}{
		{"a slot that confirms each transaction once it is readable breaks nothing", func() *history.History {
			return ahead(history.AtLeastOnce, [2]float64{1, 50}, [2]float64{2.5, 100}, [2]float64{4.5, 200}, [2]float64{7, 300}).done(bothConsumers)
		}, 0},
		{"a slot past a transaction not yet readable is ahead of Kafka", func() *history.History {
			return ahead(history.AtLeastOnce, [2]float64{3, 250}).done(bothConsumers)
		}, 1},
		{"a slot past a transaction never read is ahead of Kafka", func() *history.History {
			b := ahead(history.AtLeastOnce, [2]float64{8, 350})
			b.log = b.log[:2]
			return b.done(bothConsumers)
		}, 1},
		{"under exactly-once only a read_committed read makes it readable", func() *history.History {
			b := ahead(history.ExactlyOnce, [2]float64{3, 250})
			b.log[1].Consumer = aborted // e2's copy at 4 s aborted: read_uncommitted only
			b.log[1].Appended = at(2.5)
			b.publish(5, "e2")
			return b.done(bothConsumers)
		}, 1},
		{"a lost slot's replacement past its gap is not ahead", func() *history.History {
			b := ahead(history.AtLeastOnce, [2]float64{3, 350})
			b.h.Faults = append(b.h.Faults, history.Fault{Kind: faultSlotLost, Target: "eo-table", Start: at(2.5), End: at(10), Lost: at(2.8)})
			return b.done(bothConsumers)
		}, 0},
		{"a transaction committed between the drop and the replacement's creation is the gap's", func() *history.History {
			b := ahead(history.AtLeastOnce, [2]float64{4, 350})
			b.h.Faults = append(b.h.Faults, history.Fault{Kind: faultSlotLost, Target: "eo-table", Start: at(0), End: at(10), Lost: at(0.05)})
			return b.done(bothConsumers)
		}, 0}, // t3 committed at 2.1 s, more than 2 s after the drop, before the replacement showed at 4 s
		{"a transaction committed after the replacement slot existed is not the gap's", func() *history.History {
			b := ahead(history.AtLeastOnce, [2]float64{0.5, 50}, [2]float64{0.9, 60}, [2]float64{6, 450})
			b.h.Faults = append(b.h.Faults, history.Fault{Kind: faultSlotLost, Target: "eo-table", Start: at(0.6), End: at(10), Lost: at(0.7)})
			b.txn("t4", history.Committed, 5, ev("e4", "k1", 4))
			b.h.Txns[3].CommitLSN, b.h.Txns[3].Slot = 400, "s"
			b.publish(9, "e4")
			return b.done(bothConsumers)
		}, 1}, // the sample at 0.9 s shows the replacement: t4, committed at 5.1 s, is not the gap's
		{"a failover during the recovery makes a transaction committed before it the next gap's", func() *history.History {
			b := ahead(history.AtLeastOnce, [2]float64{0.5, 50}, [2]float64{0.9, 60}, [2]float64{6, 450})
			b.h.Faults = append(b.h.Faults, history.Fault{Kind: faultSlotLost, Target: "eo-table", Start: at(0.6), End: at(10), Lost: at(0.7)},
				history.Fault{Kind: faultFailoverSynced, Target: "postgres", Start: at(4), End: at(5)})
			b.txn("t4", history.Committed, 3.5, ev("e4", "k1", 4))
			b.h.Txns[3].CommitLSN, b.h.Txns[3].Slot = 400, "s"
			b.publish(9, "e4")
			return b.done(bothConsumers)
		}, 0}, // the failover at 4 s lost the replacement of 0.9 s: the sample at 6 s shows the next one
		{"another database's transactions are not the slot's", func() *history.History {
			b := ahead(history.AtLeastOnce, [2]float64{3, 250})
			b.h.Txns[1].Slot = "neighbour"
			return b.done(bothConsumers)
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs := Check(tt.build())
			if got := rulesOf(vs, RuleSlotAheadOfKafka); len(got) != tt.want {
				t.Fatalf("got %v, want %d %s violations", vs, tt.want, RuleSlotAheadOfKafka)
			}
		})
	}
}

func TestAFailedSettlementIsARunNotCarriedOut(t *testing.T) {
	b := clean(history.AtLeastOnce)
	h := b.done(bothConsumers)
	h.Txns = nil // what a failed Resolve used to leave: every read a phantom
	h.Unsettled = "settling the transactions failed: connection refused"
	vs := Check(h)
	if len(vs) != 1 || vs[0].Rule != RuleNotCarriedOut {
		t.Fatalf("got %d violations %v, want one %s", len(vs), vs, RuleNotCarriedOut)
	}
	h.Unsettled = ""
	if vs := rulesOf(Check(h), RulePhantom); len(vs) == 0 {
		t.Fatalf("without the mark the history is a flood of phantoms; got none: the test proves nothing")
	}
}
