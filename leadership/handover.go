package leadership

import (
	"context"
	"errors"
	"time"

	"github.com/outbox-relay/outbox-relay/sink"
)

// A leader cut off from Kafka alone (a broken route, a firewall, its own broker connections
// stuck) would otherwise keep its lock for ever: its term ends only when the process exits or the
// lock is lost, and a stalled sink only turns /readyz red. With leader_kafka_timeout set, a leader
// that has had no answer from Kafka for that long while events wait for one hands the lock over:
// while a standby whose Kafka answers waits (it says so with a shared advisory lock, see
// leader.Term.Standbys), it fences its relay (nothing unacknowledged is confirmed; the next leader
// streams it again) and releases the lock, so that the standby takes over. Against churn when Kafka is
// down for everyone, a standby that has seen another instance lead tries the lock only while its
// own Kafka answers a metadata request, and a leader that handed over competes again only after a
// pause that doubles while handovers follow each other, and then only once its Kafka answers.

// errKafkaSilent ends a term whose leader had no answer from Kafka for leader_kafka_timeout while
// events waited.
var errKafkaSilent = errors.New("no answer from Kafka while events waited")

// kafkaProbeTimeout bounds a standby's metadata request before it tries the lock: a broker that
// answers at all answers within it.
const kafkaProbeTimeout = 5 * time.Second

// maxHandoverPause caps the pause of a leader that keeps handing over (its Kafka, or every
// instance's, is cut off for long).
const maxHandoverPause = 10 * time.Minute

// handoverPause is how long a leader that handed over for the n-th time in a row (n >= 1) waits
// before it competes for the lock again: base, doubling per handover, up to maxHandoverPause. The
// base (handoverBase) gives a standby time for two attempts; a longer first pause would only delay
// a lone instance whose Kafka came back, and the Kafka check keeps one that is still cut off out.
func handoverPause(base time.Duration, n int) time.Duration {
	return min(base<<min(n-1, 10), maxHandoverPause)
}

// handoverBase is the first pause after a handover: two standby attempts (leader_retry_interval)
// and their Kafka check.
func handoverBase(retry time.Duration) time.Duration { return 2*retry + kafkaProbeTimeout }

// kafkaProgress is what the watch needs of the sink.
type kafkaProgress interface {
	InFlight() (events, bytes int64)
	LastAnswer() time.Time
	Starting() bool
	Halted() (eventID, reason string, err error, halted bool)
}

// watchKafka reports on the returned channel, once, how long s has waited for Kafka without an
// answer when that reaches limit while standby says that an instance ready to take over waits
// (alone, or with every standby cut off too, handing over would only pause the relay). Waiting
// means events handed to Kafka and not settled, or the start waiting for the brokers; a halted
// sink waits for nobody (another leader would halt on the same event), and an idle one for
// nothing. It checks every limit/10 (at most every second), so it reports at most that much late;
// it stops when ctx ends.
func watchKafka(ctx context.Context, s kafkaProgress, limit time.Duration, standby func() bool) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	tick := min(limit/10, time.Second)
	go func() {
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		since := time.Now() // the start of the current wait
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			now := time.Now()
			events, _ := s.InFlight()
			_, _, _, halted := s.Halted()
			if halted || events == 0 && !s.Starting() {
				since = now
				continue
			}
			if a := s.LastAnswer(); a.After(since) {
				since = a
			}
			if silent := now.Sub(since); silent >= limit && standby() {
				out <- silent
				return
			}
		}
	}()
	return out
}

// kafkaAnswers is the election's BeforeLock: nil (always try) with leader_kafka_timeout (timeout) 0,
// else a metadata request to the relay's own brokers (sk), asked only where another instance could
// lead instead: when this standby has seen another instance hold the lock, or after this instance
// handed over (handedOver). Alone, an instance takes the lock as before and waits for Kafka as
// leader (creating a missing slot first, so that what is committed meanwhile is kept).
func kafkaAnswers(timeout time.Duration, sk sink.Config, handedOver func() bool) func(context.Context, bool) error {
	if timeout <= 0 {
		return nil
	}
	return func(ctx context.Context, contended bool) error {
		if !contended && !handedOver() {
			return nil
		}
		return sink.Reachable(ctx, sk, min(timeout, kafkaProbeTimeout))
	}
}
