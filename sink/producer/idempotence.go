package producer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

// The idempotent producer (KIP-98), as the Java producer runs it:
//   - InitProducerID gives a producer id and epoch; every batch carries them and a base sequence
//     that counts the partition's records from 0 per epoch. A retried batch keeps all three, so a
//     request that timed out after the broker wrote it is acknowledged again, not written twice
//     (the broker remembers the last five batches per producer and partition and answers a repeat
//     with success, or with DUPLICATE_SEQUENCE_NUMBER, which is success too).
//   - A batch the broker refuses for good (record too large, invalid) was not written: the
//     partition's next sequence goes back to the batch's, so what is sent next (the split records,
//     or the next batch) fills the gap (Java's adjustSequencesDueToFailedBatch).
//   - OUT_OF_ORDER_SEQUENCE_NUMBER on the batch at the head of the partition, or
//     UNKNOWN_PRODUCER_ID, say the broker lost the producer's state for the partition (records
//     removed by retention, an unclean leader election): the partition bumps its epoch locally and
//     starts again at sequence 0, as Java's idempotent producer does; the broker takes a higher
//     epoch at sequence 0. With one request in flight per partition nothing else of the partition
//     can be pending, so nothing is sent twice. The transactional producer cannot bump on its own:
//     there the transaction is aborted (commit.go).
//   - INVALID_PRODUCER_EPOCH / PRODUCER_FENCED: for a transactional producer, another producer
//     with the same transactional id took over (or the coordinator timed the transaction out);
//     for the plain idempotent producer, which nobody else can fence, the partition takes a new
//     producer id.
// The partitions of one sink share the producer id but keep their own epoch after a local bump:
// the broker tracks producer state per partition, so that is all it checks.

// Idempotence says whether the producer asks Kafka for a producer id and numbers its batches, so
// the broker drops a batch it already wrote when a retry brings it again.
type Idempotence string

const (
	// IdempotenceAuto is on where the broker allows it: a broker that denies IDEMPOTENT_WRITE
	// gets the plain producer, with a warning.
	IdempotenceAuto Idempotence = "auto"
	// IdempotenceOn refuses to start when the broker denies it.
	IdempotenceOn Idempotence = "on"
	// IdempotenceOff never asks: every retry of a request the broker already wrote is a duplicate.
	IdempotenceOff Idempotence = "off"
)

// Error codes kafka-go does not name (or names after what they meant before Kafka 1.0).
const (
	ErrOperationNotAttempted kafka.Error = 55  // OPERATION_NOT_ATTEMPTED; kafka-go: BrokerAuthorizationFailed
	ErrTransactionAbortable  kafka.Error = 120 // TRANSACTION_ABORTABLE (KIP-890)
)

// Identity is the producer id and epoch of the batches of one or more producers, asked for once,
// lazily or by an early Get.
type Identity struct {
	client     *kafka.Client
	log        *zap.Logger
	mode       Idempotence
	txnID      string // transactional.id; "" for the plain idempotent producer
	txnTimeout time.Duration

	mu       sync.Mutex
	resolved bool
	enabled  bool
	id       int64
	epoch    int16
	err      error // a start error: asking again would not help
}

// NewIdentity returns the identity of producers with idempotence mode and, for a transactional
// producer, transactional id txnID (empty otherwise) and its transaction timeout.
func NewIdentity(client *kafka.Client, log *zap.Logger, mode Idempotence, txnID string, txnTimeout time.Duration) *Identity {
	return &Identity{client: client, log: log, mode: mode, txnID: txnID, txnTimeout: txnTimeout}
}

// Get returns the producer state a partition starts from: the id and epoch, sequence 0; id
// NoProducerID when idempotence is off. It asks Kafka the first time, retrying what can heal,
// and returns an error that retrying cannot fix (a denied IDEMPOTENT_WRITE with idempotence on, an
// unauthorized transactional id) or ctx's error.
func (i *Identity) Get(ctx context.Context) (State, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if !i.resolved && i.err == nil {
		i.err = i.resolve(ctx)
		if i.err != nil && ctx.Err() != nil {
			err := i.err
			i.err = nil // ended by the caller, not by Kafka: ask again next time
			return State{}, err
		}
		i.resolved = i.err == nil
	}
	if i.err != nil {
		return State{}, i.err
	}
	if !i.enabled {
		return State{ID: NoProducerID, Epoch: -1, Seq: -1}, nil
	}
	return State{ID: i.id, Epoch: i.epoch, Transactional: i.txnID != ""}, nil
}

// resolve runs InitProducerID; i.mu is held.
func (i *Identity) resolve(ctx context.Context) error {
	if i.mode == IdempotenceOff {
		return nil
	}
	supported, err := i.supported(ctx)
	if err != nil {
		return err
	}
	if !supported {
		return i.denied(errors.New("the brokers do not offer InitProducerId"))
	}
	id, epoch, err := i.InitProducerID(ctx, -1, -1)
	if err != nil {
		var kerr kafka.Error
		if errors.As(err, &kerr) && (kerr == kafka.ClusterAuthorizationFailed || kerr == kafka.TransactionalIDAuthorizationFailed) {
			return i.denied(err)
		}
		if errors.As(err, &kerr) && kerr == kafka.InvalidTransactionTimeout {
			return fmt.Errorf("sink: the brokers refuse the transaction timeout of %s (above their transaction.max.timeout.ms): %w", i.txnTimeout, err)
		}
		return err
	}
	i.enabled, i.id, i.epoch = true, id, epoch
	if i.txnID != "" {
		i.log.Info("transactional producer ready; earlier producers with this transactional id are fenced",
			zap.String("transactional_id", i.txnID), zap.Int64("producer_id", id), zap.Int16("epoch", epoch))
	} else {
		i.log.Debug("idempotent producer ready", zap.Int64("producer_id", id), zap.Int16("epoch", epoch))
	}
	return nil
}

// denied handles a broker that will not give the relay a producer id.
func (i *Identity) denied(err error) error {
	switch {
	case i.txnID != "":
		var kerr kafka.Error
		if errors.As(err, &kerr) && kerr == kafka.TransactionalIDAuthorizationFailed {
			return fmt.Errorf("sink: the relay may not use transactional id %q: %w (grant its principal WRITE and DESCRIBE on the TransactionalId resource)", i.txnID, err)
		}
		return fmt.Errorf("sink: exactly-once delivery needs transactions, and the brokers refused them: %w "+
			"(grant WRITE and DESCRIBE on TransactionalId %q, or use a broker with transactions)", err, i.txnID)
	case i.mode == IdempotenceOn:
		return fmt.Errorf("sink: the brokers refuse the idempotent producer: %w (grant the relay's principal IDEMPOTENT_WRITE on the cluster, or set kafka.idempotence to auto or off)", err)
	}
	i.log.Warn("the brokers refuse the idempotent producer; publishing without it, so a retried request the broker already wrote is a duplicate "+
		"(grant IDEMPOTENT_WRITE on the cluster, or set kafka.idempotence: off to silence this)", zap.Error(err))
	return nil
}

// supported reports whether the brokers offer what the mode needs.
func (i *Identity) supported(ctx context.Context) (bool, error) {
	for attempt := 0; ; attempt++ {
		res, err := i.client.ApiVersions(ctx, &kafka.ApiVersionsRequest{})
		if err == nil {
			offered := map[string]int{}
			for _, k := range res.ApiKeys {
				offered[k.ApiName] = k.MaxVersion
			}
			_, init := offered["InitProducerId"]
			if i.txnID == "" {
				return init, nil
			}
			_, add := offered["AddPartitionsToTxn"]
			_, end := offered["EndTxn"]
			return init && offered["InitProducerId"] >= 3 && add && end, nil
		}
		if err := Wait(ctx, attempt, i.log, "kafka unreachable; retrying the producer id request", err); err != nil {
			return false, err
		}
	}
}

// InitProducerID asks for a producer id: a new one with id -1 and epoch -1, else the next epoch of
// the given one (KIP-360: the coordinator answers PRODUCER_FENCED or INVALID_PRODUCER_EPOCH when
// another producer took the transactional id since). It retries what heals: coordinator moves and
// loads, a transaction of an earlier producer still being aborted, the network.
func (i *Identity) InitProducerID(ctx context.Context, id int64, epoch int16) (int64, int16, error) {
	for attempt := 0; ; attempt++ {
		res, err := i.client.InitProducerID(ctx, &kafka.InitProducerIDRequest{
			TransactionalID:      i.txnID,
			TransactionTimeoutMs: int(i.txnTimeout.Milliseconds()),
			ProducerID:           int(id),
			ProducerEpoch:        int(epoch),
		})
		if err == nil {
			err = res.Error
		}
		if err == nil {
			return int64(res.Producer.ProducerID), int16(res.Producer.ProducerEpoch), nil
		}
		if !RetriableCoordinatorError(err) {
			return 0, 0, err
		}
		msg := "retrying the producer id request"
		if attempt >= 15 && errors.Is(err, kafka.GroupCoordinatorNotAvailable) {
			// Half a minute of it is not a coordinator moving: the transaction state topic cannot
			// be created or has no leader.
			msg = "the transaction coordinator stays unavailable; retrying. If the cluster has fewer brokers than " +
				"transaction.state.log.replication.factor (default 3), lower it and transaction.state.log.min.isr in the brokers' settings"
		}
		if err := Wait(ctx, attempt, i.log, msg, err); err != nil {
			return 0, 0, err
		}
	}
}

// RetriableCoordinatorError reports whether a request to the transaction coordinator may simply be
// sent again: the coordinator is moving or loading, an earlier transaction is still completing,
// or the network failed (anything that is not a Kafka error code).
func RetriableCoordinatorError(err error) bool {
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return true
	}
	switch kerr {
	case kafka.GroupCoordinatorNotAvailable, kafka.NotCoordinatorForGroup, kafka.GroupLoadInProgress,
		kafka.ConcurrentTransactions, kafka.RequestTimedOut, kafka.NetworkException, kafka.NotEnoughReplicas,
		kafka.NotEnoughReplicasAfterAppend, kafka.UnknownTopicOrPartition, kafka.LeaderNotAvailable,
		kafka.NotLeaderForPartition, ErrOperationNotAttempted, kafka.KafkaStorageError, kafka.BrokerNotAvailable:
		return true
	}
	return false
}

// Fresh returns a new producer id for a partition of the plain idempotent producer whose epoch
// cannot go on (the broker refused it, or it reached the largest epoch).
func (i *Identity) Fresh(ctx context.Context) (State, error) {
	id, epoch, err := i.InitProducerID(ctx, -1, -1)
	if err != nil {
		return State{}, err
	}
	return State{ID: id, Epoch: epoch}, nil
}

// concurrentTransactionsBackoff is how long a request answered CONCURRENT_TRANSACTIONS waits:
// the previous transaction's markers are being written, which takes milliseconds, and the next
// transaction's first AddPartitionsToTxn meets it after nearly every commit.
const concurrentTransactionsBackoff = 5 * time.Millisecond

// loadingBackoff is the first wait after COORDINATOR_LOAD_IN_PROGRESS; it doubles up to Backoff's.
// A broker answers it to the first InitProducerId after it started, while it fetches a block of
// producer ids from the controller (milliseconds), and while it loads a transaction state partition
// it has just come to lead (longer: hence the doubling). Backoff's 200ms here was most of a
// start's time to its first record.
const loadingBackoff = 10 * time.Millisecond

// loadingQuietAttempts is how many COORDINATOR_LOAD_IN_PROGRESS answers in a row are retried
// without a warning: together about Backoff(0), a load that ends as expected says nothing.
const loadingQuietAttempts = 4

// retryDelay is how long Wait sleeps after attempt failed with err, and whether to say so.
func retryDelay(attempt int, err error) (delay time.Duration, warn bool) {
	switch {
	case errors.Is(err, kafka.ConcurrentTransactions):
		return concurrentTransactionsBackoff, attempt >= 100
	case errors.Is(err, kafka.GroupLoadInProgress):
		return min(loadingBackoff<<min(attempt, 8), Backoff(attempt)), attempt >= loadingQuietAttempts
	}
	return Backoff(attempt), attempt > 0
}

// Wait logs a failed attempt and sleeps the backoff; it returns ctx's error when ctx ends first.
func Wait(ctx context.Context, attempt int, log *zap.Logger, msg string, err error) error {
	delay, warn := retryDelay(attempt, err)
	if warn {
		log.Warn(msg, zap.Int("attempt", attempt+1), zap.Duration("retry_in", delay), zap.Error(err))
	}
	select {
	case <-time.After(delay):
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
	}
}
