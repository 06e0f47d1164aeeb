package check

import (
	"fmt"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// checkContent: a record carries the payload and headers its event was committed with. Both
// sides record a hash of them (workload.ContentHash); a read or an event without one (a history
// from before the hashes) is not compared. Reported once per event, like a phantom.
func (r *run) checkContent(c *consumer, rd *history.Read, t *history.Txn, e *history.Event, reported map[string]bool) {
	if e.Hash == "" || rd.Hash == "" || rd.Hash == e.Hash || reported["content "+e.ID] {
		return
	}
	reported["content "+e.ID] = true
	r.add(Violation{Rule: RuleContent, At: rd.Appended, Events: []string{e.ID},
		Message: fmt.Sprintf("consumer %s read event %s (key %s seq %d at %s) with content hash %s; txn %s committed it with %s: its payload or headers changed on the way",
			c.name, e.ID, e.Key, e.Seq, where(rd), rd.Hash, t.ID, e.Hash)})
}
