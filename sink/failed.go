package sink

import "errors"

// ErrFenced says another producer with the same transactional id (a newer epoch) took over: this
// sink stops for good and writes nothing more that a read_committed consumer could see.
var ErrFenced = errors.New("fenced: another producer with the same transactional id took over")

// ErrAborted says a Kafka transaction was aborted (the broker timed it out, or it could not
// commit): the sink stops for good without acknowledging anything of it, and the relay replays
// from the last committed position.
var ErrAborted = errors.New("kafka transaction aborted")

// Failed is closed once the sink has stopped for good: fenced (Err wraps ErrFenced), a Kafka
// transaction aborted (Err wraps ErrAborted), or the producer could not start (kafka.idempotence
// on and the broker denies it, the transactional id is not authorized, ...). Publish then returns
// Err. It closes on its own, whether Publish is being called or not.
func (s *Sink) Failed() <-chan struct{} { return s.failed }

// Err says why Failed closed; nil before.
func (s *Sink) Err() error {
	select {
	case <-s.failed:
		return s.failErr
	default:
		return nil
	}
}

// fatal stops the sink for good with err; the first call wins. Nothing more is sent: what was
// not acknowledged stays so, and is replayed after a restart.
func (s *Sink) fatal(err error) {
	s.failOnce.Do(func() {
		s.failErr = err
		close(s.failed)
		s.stop()
	})
}
