package producer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/sink/readcommitted"
)

// A Kafka transaction is committed once the coordinator has written its commit marker into every
// partition it wrote, after EndTxn has answered. A KRaft coordinator skips the marker of a
// partition that has no leader at that moment (Kafka 4.4, TransactionMarkerChannelManager takes
// an unknown leader for a deleted topic and drops the partition from the transaction): the
// partition's records then stay in an open transaction that the producer's next transaction on it
// decides, its commit taking them in, its abort (a restart, a fence) throwing them away. A broker
// stopped or fenced while it leads the only replica (a single broker, replication factor 1, a
// whole-cluster outage) is enough. So the committer does not take EndTxn's answer as the commit:
//
//   - after each commit it waits until the transaction is decided in every partition it wrote (the
//     partition's last stable offset past its first record there: landed), and only then hands
//     the records back: the relay confirms its slot only past events a read_committed consumer
//     can read;
//   - a partition whose last stable offset stays at the transaction's first record there for
//     markerWait has lost its marker: an empty transaction of the same producer holding just those
//     partitions is committed (repair), and its marker commits the records left open;
//   - the relay's position records where its transaction's records lie, and a start checks them
//     (Settle): records left open by a relay that died before its repair are committed,
//     and a position whose records were thrown away meanwhile is not trusted (everything from the
//     slot is published again: duplicates, never a loss).
//
// Every partition of every transaction is checked, none skipped as safe: the coordinator decides
// to skip a marker when it sends the markers, after it has answered EndTxn (and again at each
// resend), from its own view of the partition's leader. A leader the producer saw unchanged from
// the transaction's first record to its commit may still go away before that moment (the
// markers test stops it between the last record and EndTxn), and learning the leader's state
// after that moment costs a request per broker, as much as the check, which is the proof itself.
// The check is one ListOffsets per broker (stableOffsetsRequest), after the markers' usual latency
// (markerDelay).

// markerWait is how long a partition that answers may keep its last stable offset at a committed
// transaction's first record before its marker is taken for lost. Markers land within
// milliseconds of EndTxn's answer; a needless repair only costs an empty transaction.
const markerWait = time.Second

// The first check comes after the markers' usual latency (markerDelay), not at once: a check that
// finds a marker still on its way costs a request per broker and finds out nothing. After a miss
// the checks come at 1 ms, then twice as far apart each time, up to a quarter of a second for a
// partition that is away (markerPoll).
const (
	firstCheckMin     = 500 * time.Microsecond
	firstCheckInitial = 2 * time.Millisecond
	// firstCheckMax bounds the wait before the first check: a broker whose markers take longer
	// than this is slow or away, and checking sooner costs a few requests, not latency.
	firstCheckMax = 10 * time.Millisecond
)

// markerPoll is how long landed waits before check attempt+1 (attempt 0 was the first check).
func markerPoll(attempt int) time.Duration {
	return min(time.Millisecond<<min(attempt, 8), 250*time.Millisecond)
}

// markerDelay learns how long after EndTxn's answer the markers usually have landed: a first check
// that finds every partition decided shortens the wait before the next transaction's by 1/64, one
// that does not lengthens it by a quarter. The wait settles where about 16 first checks in 17 find
// the markers landed (about the 94th percentile of their latency), so a transaction costs about
// one check per broker, and a commit waits at most about the markers' own latency spread longer
// than it must. Growing by a quarter, not doubling, keeps a single slow marker from holding up the
// commits after it.
type markerDelay struct{ ns atomic.Int64 }

func (d *markerDelay) get() time.Duration {
	if v := time.Duration(d.ns.Load()); v > 0 {
		return v
	}
	return firstCheckInitial
}

func (d *markerDelay) learn(landed bool) {
	v := d.get()
	if landed {
		v -= v / 64
	} else {
		v += v / 4
	}
	d.ns.Store(int64(min(max(v, firstCheckMin), firstCheckMax)))
}

// missingWait is how long a partition may answer that it does not exist (a deleted topic; or
// metadata not yet caught up after a broker's return) before its marker is no longer waited for.
const missingWait = 30 * time.Second

// errRecordsDiscarded says records of a committed Kafka transaction are not readable: their
// marker was lost and a later abort discarded them.
var errRecordsDiscarded = errors.New("records of a committed Kafka transaction were discarded after its commit marker was lost")

// Span is where a Kafka transaction's records lie in one partition: the offsets of its first and
// last record there, -1 when the broker did not say (it answered a retry as a duplicate).
type Span struct{ First, Last int64 }

// Known reports whether the broker said where the records lie.
func (sp Span) Known() bool { return sp.First >= 0 && sp.Last >= sp.First }

// landed waits until the transaction is decided in every partition of spans, repairing lost
// markers, and reports whether it repaired any. A partition's last stable offset (LSO) is the first
// offset of its oldest open transaction: past the transaction's first record there, the
// transaction is not open there any more; at that record, it is this producer's transaction that
// is open (its marker is late or lost); below it, another producer's older transaction holds the
// partition, and this one's state shows once that one ends. Decided is not committed: after a
// repair (which another producer may have aborted) readable tells.
//
// commit says how the transaction ended: a repair ends the same way (an abort whose marker was lost
// leaves records open that this producer's next transaction there would commit: duplicates).
// unwaited is a partition where another producer's older open transaction does not hold this up:
// the positions partition, which every relay shares and a paused one would hold for its whole
// transaction timeout. What a lost marker leaves open there is taken in by the next commit, or
// committed at the next start (CommitOpen); the events' records are what must not be lost.
func (tm *Committer) landed(ctx context.Context, spans map[TopicPartition]Span, commit bool, unwaited TopicPartition) (repaired bool, err error) {
	if len(spans) == 0 {
		return false, nil
	}
	pending := maps.Clone(spans)
	approx := make(map[TopicPartition]bool)
	missing := make(map[TopicPartition]time.Time) // since when each answers that it does not exist
	since, told := time.Now(), time.Now()
	if err := sleep(ctx, tm.firstCheck.get()); err != nil {
		return false, err
	}
	for attempt := 0; len(pending) > 0; attempt++ {
		if err := tm.resolveUnknown(ctx, pending, approx); err != nil {
			return repaired, err
		}
		stable, errs := tm.stableOffsets(ctx, slices.Collect(maps.Keys(pending)))
		var stuck, behind []TopicPartition
		for tp, sp := range pending {
			lso, ok := stable[tp]
			if gone := errors.Is(errs[tp], kafka.UnknownTopicOrPartition); !gone {
				delete(missing, tp)
			} else if _, seen := missing[tp]; !seen {
				missing[tp] = time.Now()
			}
			switch {
			case !ok && time.Since(missing[tp]) >= missingWait && errors.Is(errs[tp], kafka.UnknownTopicOrPartition):
				// Deleted with its records: there is nothing left to decide.
				tm.log.Warn("a partition of a Kafka transaction no longer exists; not waiting for its marker",
					zap.String("transactional_id", tm.id), zap.Stringer("partition", tp))
				delete(pending, tp)
			case !ok || !sp.Known():
				// No leader, or where it wrote is still unknown: ask again.
			case lso > sp.Last || (lso > sp.First && !approx[tp]):
				delete(pending, tp)
			case tp == unwaited && (approx[tp] || lso < sp.First):
				delete(pending, tp)
			case lso == sp.First || approx[tp]:
				stuck = append(stuck, tp)
			default:
				behind = append(behind, tp)
			}
		}
		if attempt == 0 {
			tm.firstCheck.learn(len(pending) == 0)
		}
		if len(pending) == 0 {
			break
		}
		if len(stuck) > 0 && time.Since(since) >= markerWait {
			tm.log.Warn("the marker of a Kafka transaction did not reach these partitions (their leader was away when the coordinator wrote it); ending an empty transaction on them the same way, so that the records left open are decided",
				zap.String("transactional_id", tm.id), zap.Bool("commit", commit), zap.Stringers("partitions", stuck))
			if err := tm.repair(ctx, stuck, commit); err != nil {
				return repaired, fmt.Errorf("repair the markers of %v: %w", stuck, err)
			}
			tm.owner.Count("repaired")
			repaired, since = true, time.Now()
			continue
		}
		if time.Since(told) >= 10*time.Second {
			told = time.Now()
			tm.log.Warn("waiting for the marker of a Kafka transaction to reach its partitions before going on (a partition without a leader answers nothing; another producer's older open transaction hides this one's state)",
				zap.String("transactional_id", tm.id), zap.Stringers("partitions", slices.Collect(maps.Keys(pending))),
				zap.Stringers("behind_another_transaction", behind))
		}
		if err := sleep(ctx, markerPoll(attempt)); err != nil {
			return repaired, err
		}
	}
	return repaired, nil
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the marker of a Kafka transaction: %w", ctx.Err())
	}
}

// resolveUnknown gives the spans the broker did not tell (a retry answered as a duplicate) the
// partition's high watermark less one, which is at or above the records, and marks them approx:
// only a last stable offset at the high watermark then says they are decided.
func (tm *Committer) resolveUnknown(ctx context.Context, spans map[TopicPartition]Span, approx map[TopicPartition]bool) error {
	for tp, sp := range spans {
		if sp.Known() {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, tm.timeout)
		hw, err := HighWatermark(rctx, tm.client, tp.Topic, tp.Partition)
		cancel()
		switch {
		case err == nil && hw > 0:
			spans[tp], approx[tp] = Span{hw - 1, hw - 1}, true
		case err == nil:
			delete(spans, tp) // an empty partition holds nothing of it
		case ctx.Err() != nil:
			return ctx.Err()
		}
	}
	return nil
}

// stableOffsets returns the last stable offset of each of tps that answers, and the error of each
// that answers with one; a partition without a leader, or whose leader did not answer, is in
// neither. It sends one ListOffsets per broker (stableOffsetsRequest).
func (tm *Committer) stableOffsets(ctx context.Context, tps []TopicPartition) (map[TopicPartition]int64, map[TopicPartition]error) {
	out := make(map[TopicPartition]int64, len(tps))
	errs := make(map[TopicPartition]error)
	rctx, cancel := context.WithTimeout(ctx, tm.timeout)
	defer cancel()
	m, err := tm.client.Transport.RoundTrip(rctx, tm.client.Addr, newStableOffsetsRequest(tps))
	if err != nil {
		return out, errs
	}
	for _, t := range m.(*listoffsets.Response).Topics {
		for _, p := range t.Partitions {
			tp := TopicPartition{Topic: t.Topic, Partition: int(p.Partition)}
			if p.ErrorCode == 0 {
				out[tp] = p.Offset
			} else {
				errs[tp] = kafka.Error(p.ErrorCode)
			}
		}
	}
	return out, errs
}

// repair ends an empty transaction holding tps (commit or abort): its marker ends the transaction
// this producer left open in each of them the same way. The EndTxn is sent even when ctx ends
// between the two requests (within one request's time): an open repair would otherwise be aborted
// by the next producer, and its abort would discard the records a commit is there to commit.
func (tm *Committer) repair(ctx context.Context, tps []TopicPartition, commit bool) error {
	ps, err := tm.ident.Get(ctx)
	if err != nil {
		return err
	}
	set := make(map[TopicPartition]bool, len(tps))
	for _, tp := range tps {
		set[tp] = true
	}
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, tm.timeout)
		err := tm.coord.AddPartitions(rctx, ps, set)
		cancel()
		if err == nil {
			break
		}
		if !RetriableCoordinatorError(err) {
			return fmt.Errorf("add partitions to the repair transaction: %w", err)
		}
		if err := Wait(ctx, attempt, tm.log, "retrying adding partitions to the repair transaction", err); err != nil {
			return err
		}
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*tm.timeout)
	defer cancel()
	return tm.endTxn(ectx, commit)
}

// readable checks that the last record of each partition of spans is readable by a read_committed
// consumer (committed, not discarded). Reading needs the Read permission on the topic, which a
// relay's principal may lack: then it says so and takes the records for committed.
func (tm *Committer) readable(ctx context.Context, spans map[TopicPartition]Span) error {
	for tp, sp := range spans {
		if !sp.Known() {
			continue
		}
		end := sp.Last
		ok, err := committedAt(ctx, tm.client, tp, end)
		if errors.Is(err, kafka.OffsetOutOfRange) || errors.Is(err, kafka.UnknownTopicOrPartition) {
			tm.log.Warn("cannot check that the records of a Kafka transaction are committed: they are gone (retention, or the topic was deleted)",
				zap.Stringer("partition", tp), zap.Int64("offset", end), zap.Error(err))
			continue
		}
		if errors.Is(err, kafka.TopicAuthorizationFailed) {
			tm.log.Warn("cannot check that the records of a Kafka transaction whose commit marker was lost are committed: the relay may not read the topic (grant it Read to have this checked)",
				zap.Stringer("partition", tp), zap.Int64("offset", end))
			continue
		}
		if err != nil {
			return fmt.Errorf("check that the records of a repaired Kafka transaction are readable in %v: %w", tp, err)
		}
		if !ok {
			return fmt.Errorf("%w: %v, offset %d", errRecordsDiscarded, tp, end)
		}
	}
	return nil
}

// committedAt reports whether the record at offset of tp is committed (a read_committed read
// from it returns it).
func committedAt(ctx context.Context, client *kafka.Client, tp TopicPartition, offset int64) (bool, error) {
	res, err := readcommitted.Fetch(ctx, client, tp.Topic, tp.Partition, offset, 64<<10, 100*time.Millisecond)
	if err != nil {
		return false, err
	}
	for _, r := range res.Records {
		if r.Offset == offset {
			return true, nil
		}
	}
	return false, nil
}

// Settle checks, at a start, the Kafka transaction of a committed position: written is where its
// records lie. Records left open by a lost marker are committed (repair); it reports false when
// some were discarded meanwhile (a repair aborted by a producer's death), so the position covers
// records that are not in Kafka and must not be trusted.
func (tm *Committer) Settle(ctx context.Context, written map[TopicPartition]Span) (bool, error) {
	if _, err := tm.landed(ctx, written, true, TopicPartition{}); err != nil {
		return false, err
	}
	err := tm.readable(ctx, written)
	if errors.Is(err, errRecordsDiscarded) {
		tm.log.Warn("the committed position covers events whose records were discarded after their Kafka transaction's commit marker was lost; not trusting it: everything from the slot's position is published again (duplicates, no loss)",
			zap.String("transactional_id", tm.id), zap.Error(err))
		return false, nil
	}
	return err == nil, err
}

// CommitOpen commits what this producer may have left open in tp (the relay's positions
// partition): a record whose commit marker was lost holds the partition's last stable offset down
// until this producer's next transaction there. The empty transaction changes nothing when
// nothing of this producer's is open. Call it after fencing (Identity.Get).
func (tm *Committer) CommitOpen(ctx context.Context, tp TopicPartition) error {
	_, stable, err := Offsets(ctx, tm.client, tp.Topic, tp.Partition)
	if err != nil {
		return fmt.Errorf("%s: %w", tp.Topic, err)
	}
	hw, err := HighWatermark(ctx, tm.client, tp.Topic, tp.Partition)
	if err != nil {
		return fmt.Errorf("%s: %w", tp.Topic, err)
	}
	if stable >= hw {
		return nil
	}
	return tm.repair(ctx, []TopicPartition{tp}, true)
}

// HighWatermark returns the partition's end offset (read_uncommitted): records of open
// transactions included.
func HighWatermark(ctx context.Context, client *kafka.Client, topic string, partition int) (int64, error) {
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics:         map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(partition)}},
		IsolationLevel: kafka.ReadUncommitted,
	})
	if err != nil {
		return 0, err
	}
	for _, p := range res.Topics[topic] {
		if p.Partition != partition {
			continue
		}
		if p.Error != nil {
			return 0, p.Error
		}
		return p.LastOffset, nil
	}
	return 0, errors.New("list offsets: the response does not hold the partition")
}

// Offsets returns the partition's first offset and its last stable offset (read_committed end).
func Offsets(ctx context.Context, client *kafka.Client, topic string, partition int) (first, stable int64, err error) {
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{topic: {
			kafka.FirstOffsetOf(partition), kafka.LastOffsetOf(partition),
		}},
		IsolationLevel: kafka.ReadCommitted,
	})
	if err != nil {
		return 0, 0, err
	}
	for _, p := range res.Topics[topic] {
		if p.Partition != partition {
			continue
		}
		if p.Error != nil {
			return 0, 0, p.Error
		}
		return p.FirstOffset, p.LastOffset, nil
	}
	return 0, 0, errors.New("list offsets: the response does not hold the partition")
}
