package sink

// Refuser is an Acker that takes a permanent refusal back instead of letting the sink apply the
// failure policy: the polling mode counts refusals against poll_max_attempts on the row and
// publishes it again after a backoff, and only a row refused that often goes to the policy (then
// through Reject, whose Refuser declines).
//
// Refuse is called at most once per event, instead of Ack, from any goroutine. It returns false
// to decline: the sink then applies the failure policy as usual and acknowledges the event once
// the policy has settled it. Only permanent errors (errors.go) reach it; transient ones are
// retried in place, so a broker outage never counts as an attempt.
type Refuser interface {
	Acker
	Refuse(reason string, err error) bool
}

// takeBack hands rec to its Refuser, if it has one that takes it, and returns the record's
// in-flight capacity. It reports whether the record is settled that way.
func (s *Sink) takeBack(rec *delivery, reason string, err error) bool {
	r, ok := rec.ack.(Refuser)
	if !ok || !r.Refuse(reason, err) {
		return false
	}
	s.limit.release(1, rec.Size)
	s.m.InFlightEvents.Dec()
	s.m.InFlightBytes.Sub(float64(rec.Size))
	return true
}
