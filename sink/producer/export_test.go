package producer

// Lingering reports whether tp's goroutine has looked at its records and waits at its broker for
// their linger (or a request to join): a record pushed now finds it asleep.
func (p *Producer) Lingering(tp TopicPartition) bool {
	p.mu.Lock()
	q := p.parts[tp]
	p.mu.Unlock()
	if q == nil {
		return false
	}
	p.requests.mu.Lock()
	defer p.requests.mu.Unlock()
	return q.at != nil && q.at.waiting[q]
}
