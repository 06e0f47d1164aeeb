package check

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/history"
)

// AllowedExit is an exit of a relay's own accord that is its documented answer to something the
// nemesis does: the run does not fail for it.
type AllowedExit struct {
	Name  string // what it is, for the report
	Match string // a substring of the exit's last error line
	Why   string // the documentation that makes it the right answer
	// After are the fault kinds that can bring it about: one of them must have begun before the
	// exit, else the exit is unexplained and fails the run like any other.
	After []string
}

// AllowedExits is the whole allowlist (docs/guarantees.md, "The nemesis", rule exit). Anything
// else that ends a relay on its own is a failure of the run: a relay should only end when told.
var AllowedExits = []AllowedExit{
	{
		Name:  "slot lost",
		Match: "replication slot lost: ",
		Why: "a slot invalidated or its WAL removed, with on_slot_lost: stop, or in a messages outbox (whose gap " +
			"is stored nowhere but the WAL): the relay exits non-zero naming the slot (docs/guarantees.md, failure table); " +
			"only after a fault that can lose a slot (the nemesis never loses one otherwise)",
		After: []string{faultSlotLost, faultSlotInvalidated, faultFailoverSynced, faultFailoverUnsynced},
	},
}

// allowed returns the allowlist entry that excuses an exit whose last error line is line.
func allowed(line string) (AllowedExit, bool) {
	for _, a := range AllowedExits {
		if line != "" && strings.Contains(line, a.Match) {
			return a, true
		}
	}
	return AllowedExit{}, false
}

// checkExits: a relay ends only when told to (or with an allowed error); every SIGTERM that ended
// the process ended it with status 0; no process of any exit panicked, died of a fatal runtime
// error or reported a data race.
func (r *run) checkExits() {
	for _, e := range r.h.Exits {
		if e.Crash != "" {
			r.add(Violation{Rule: RuleCrash, At: e.At,
				Message: fmt.Sprintf("relay %s (%s, exit %d): %s", e.Relay, exitCause(e.Cause), e.Code, e.Crash)})
		}
		if e.Cause != history.ExitOwn {
			continue
		}
		if a, ok := allowed(e.LastError); ok && r.faultBefore(a.After, e.At) {
			continue
		}
		last := e.LastError
		if last == "" {
			last = "no error line in its output"
		}
		r.add(Violation{Rule: RuleExit, At: e.At,
			Message: fmt.Sprintf("relay %s ended of its own accord (exit %d), not on the allowlist: %s", e.Relay, e.Code, last)})
	}
	for _, s := range r.h.Stops {
		if !s.Exited.IsZero() && s.Code != 0 {
			r.add(Violation{Rule: RuleExit, At: s.Signal,
				Message: fmt.Sprintf("relay %s exited with %s after SIGTERM; a SIGTERM must end the relay with status 0", s.Relay, codeText(s.Code))})
		}
	}
}

func exitCause(c string) string {
	switch c {
	case history.ExitOwn:
		return "ended of its own accord"
	case history.ExitSigterm:
		return "after SIGTERM"
	case history.ExitSigkill:
		return "after SIGKILL"
	}
	return c
}

func codeText(code int) string {
	if code < 0 {
		return fmt.Sprintf("signal %d", -code)
	}
	return fmt.Sprintf("status %d", code)
}

// checkEndOffsets: once every relay has stopped and the relays' Kafka transaction timeout has
// passed, no partition holds an open (hanging) transaction: its last stable offset equals its
// high watermark.
func (r *run) checkEndOffsets() {
	for _, o := range r.h.EndOffsets {
		if o.LastStable < o.HighWatermark {
			r.add(Violation{Rule: RuleHangingTxn, At: r.h.End,
				Message: fmt.Sprintf("%s/%d: last stable offset %d below the high watermark %d after every relay stopped and the transaction timeout passed: a hanging Kafka transaction holds %d offsets back from read_committed consumers (kafka-transactions.sh find-hanging)",
					o.Topic, o.Partition, o.LastStable, o.HighWatermark, o.HighWatermark-o.LastStable)})
		}
	}
}

// faultBefore reports whether a fault of one of kinds began before at.
func (r *run) faultBefore(kinds []string, at time.Time) bool {
	for _, f := range r.h.Faults {
		if slices.Contains(kinds, f.Kind) && f.Start.Before(at) {
			return true
		}
	}
	return false
}
