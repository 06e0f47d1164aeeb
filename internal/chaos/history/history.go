// Package history is what a chaos run records: the transactions the writers attempted and how they
// ended, every record the consumers read, the faults the nemesis applied, and what was sampled from
// the relays and the server while it ran. It is plain data, written to history.json at the end of a
// run, so that a run can be checked (package check) and drawn (package report) again without
// running it again.
package history

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Delivery modes, as the relay's `delivery` key spells them.
const (
	AtLeastOnce = "at-least-once"
	ExactlyOnce = "exactly-once"
)

// Isolation levels of a consumer.
const (
	ReadCommitted   = "read_committed"
	ReadUncommitted = "read_uncommitted"
)

// History is one chaos run of one mode.
type History struct {
	Seed     uint64    `json:"seed"`
	Mode     string    `json:"mode"` // e.g. "eo-table"; see the chaos package's mode list
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Settings Settings  `json:"settings"`

	// Consumers names every consumer the run started, whether or not it read anything: one that
	// read nothing still owes every committed event (reads alone would not show it exists).
	Consumers []Consumer    `json:"consumers,omitempty"`
	Txns      []Txn         `json:"txns"`
	Reads     []Read        `json:"reads"`
	Faults    []Fault       `json:"faults"`
	Relays    []RelaySample `json:"relay_samples"`
	Slots     []SlotSample  `json:"slot_samples"`
	Stops     []Stop        `json:"stops"`
	Notes     []Note        `json:"notes,omitempty"` // what the harness itself observed (a relay's refusal, a restart)

	// Exits lists every end of a relay process, whatever ended it (a SIGTERM, a SIGKILL, or the
	// relay itself), with what its log said.
	Exits []Exit `json:"exits,omitempty"`
	// EndOffsets is every partition's last stable offset and high watermark, read after the final
	// stops and the relays' Kafka transaction timeout (the positions topic included).
	EndOffsets []EndOffset `json:"end_offsets,omitempty"`
}

// Settings are the bounds the checker holds the run to.
type Settings struct {
	Delivery        string        `json:"delivery"`         // AtLeastOnce or ExactlyOnce
	ShutdownTimeout time.Duration `json:"shutdown_timeout"` // the relays' shutdown_timeout
	// StopSlack is how much longer than ShutdownTimeout a SIGTERM may take (process exit, the
	// sampler's own resolution).
	StopSlack time.Duration `json:"stop_slack"`
	RSSBound  int64         `json:"rss_bound"` // bytes; 0: not checked
	// ReplayWindow is how long after a fault ends an at-least-once duplicate may still be appended
	// (a takeover replays from the last confirmed position).
	ReplayWindow time.Duration `json:"replay_window"`
	// Lease is the leader lease: a relay resumed after a pause longer than this may report
	// leadership until its next check fences it (the documented zombie), for ZombieGrace.
	Lease       time.Duration `json:"lease"`
	ZombieGrace time.Duration `json:"zombie_grace"`
}

// Outcome is how a transaction ended, as far as the writer knows.
type Outcome string

const (
	Committed  Outcome = "committed"
	RolledBack Outcome = "rolled_back" // rolled back on purpose, or failed before COMMIT was sent
	// InDoubt: the connection died during COMMIT and the marker row could not be looked up yet.
	// Resolved from the marker row at the end of the run; one that stays in doubt may or may not be
	// delivered.
	InDoubt Outcome = "in_doubt"
	// Vanished: the writer saw the COMMIT succeed, but the timeline that survived a failover does
	// not have the transaction (the standby had not received it). Settled at the end of a run. Its
	// events may have been delivered only if the failover that lost it was not protected by
	// synchronized_standby_slots.
	Vanished Outcome = "vanished"
)

// Txn is one transaction a writer attempted.
type Txn struct {
	ID      string    `json:"id"` // the marker row's id, unique in the run
	Writer  string    `json:"writer"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	Outcome Outcome   `json:"outcome"`
	// Resolved: the outcome was settled after the fact from the marker row (was in doubt).
	Resolved bool    `json:"resolved,omitempty"`
	Events   []Event `json:"events,omitempty"` // none for load on other tables
}

// Event is one outbox event a transaction wrote.
type Event struct {
	ID    string `json:"id"`    // the event id (outbox row id / message id), unique in the run
	Topic string `json:"topic"` // where the relay must publish it
	Key   string `json:"key"`   // the aggregate id: the Kafka key, the unit of order
	// Seq increases with every event a writer attempts for Key (holes where transactions rolled
	// back); the order the consumers must see is the order of Seq among committed events.
	Seq int `json:"seq"`
	// Hash is the content the writer committed: workload.ContentHash of the payload and the
	// headers the relay must carry ("" in histories recorded before it).
	Hash string `json:"hash,omitempty"`
}

// Read is one record a consumer read.
type Read struct {
	Consumer  string    `json:"consumer"`
	Isolation string    `json:"isolation"` // ReadCommitted or ReadUncommitted
	Topic     string    `json:"topic"`
	Partition int       `json:"partition"`
	Offset    int64     `json:"offset"`
	Key       string    `json:"key"`
	EventID   string    `json:"event_id"`
	Seq       int       `json:"seq"`
	Appended  time.Time `json:"appended"` // the broker's LogAppendTime
	// Hash is workload.ContentHash of the record's value and headers, as read.
	Hash string `json:"hash,omitempty"`
}

// Consumer is one consumer the run started.
type Consumer struct {
	Name      string `json:"name"`
	Isolation string `json:"isolation"` // ReadCommitted or ReadUncommitted
}

// Fault is one fault the nemesis applied, from its start until it was healed.
type Fault struct {
	Kind   string    `json:"kind"`   // e.g. "kill9", "pause", "broker-stop", "cut-pg", "failover"
	Target string    `json:"target"` // a relay's name, "broker", "postgres", ...
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"` // equal to Start for instantaneous faults (kill -9)
	Detail string    `json:"detail,omitempty"`
	// Lost is when a slot-lost fault dropped the slot (after Start when the first attempts lost
	// the race with the relay's reconnection): transactions committed after it are not its gap's.
	Lost time.Time `json:"lost,omitempty"`
}

// RelaySample is what one scrape of a relay's metrics said.
type RelaySample struct {
	At     time.Time `json:"at"`
	Relay  string    `json:"relay"`
	Up     bool      `json:"up"` // the scrape answered
	Leader bool      `json:"leader"`
	RSS    int64     `json:"rss"` // bytes, from /proc; 0 when not read
}

// SlotSample is one read of the slot on the primary: its confirmed LSN and the server's WAL end,
// read in one statement.
type SlotSample struct {
	At           time.Time `json:"at"`
	Slot         string    `json:"slot"`
	ConfirmedLSN uint64    `json:"confirmed_lsn"`
	WALEnd       uint64    `json:"wal_end"`
	LagBytes     int64     `json:"lag_bytes"`
}

// Stop is one SIGTERM sent to a relay and when the process exited.
type Stop struct {
	Relay  string    `json:"relay"`
	Signal time.Time `json:"signal"`
	Exited time.Time `json:"exited"` // zero: it had not exited when the harness gave up waiting
	Code   int       `json:"code"`
}

// Causes of an Exit.
const (
	ExitOwn     = "own"     // nothing the harness sent: the relay ended of its own accord
	ExitSigterm = "sigterm" // the harness sent SIGTERM
	ExitSigkill = "sigkill" // the harness sent SIGKILL (a kill -9 fault, or a SIGTERM not obeyed in time)
)

// Exit is one end of a relay process.
type Exit struct {
	Relay string    `json:"relay"`
	At    time.Time `json:"at"`
	Cause string    `json:"cause"` // ExitOwn, ExitSigterm or ExitSigkill
	Code  int       `json:"code"`  // the exit status; -N when signal N ended it
	// LastError is the last error-level line this process logged ("" if none).
	LastError string `json:"last_error,omitempty"`
	// Crash is the first line of a Go panic, a fatal runtime error or a race detector report in
	// this process's output ("" if none).
	Crash string `json:"crash,omitempty"`
}

// EndOffset is one partition's offsets at the end of a run.
type EndOffset struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	// LastStable is the last stable offset (what a read_committed consumer may read up to); below
	// HighWatermark while a Kafka transaction is open on the partition.
	LastStable    int64 `json:"last_stable"`
	HighWatermark int64 `json:"high_watermark"`
}

// Note is something the harness saw that the checker or a reader should know.
type Note struct {
	At   time.Time `json:"at"`
	Text string    `json:"text"`
}

// Save writes h to path as JSON.
func (h *History) Save(path string) error {
	b, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("history: encode: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("history: write %s: %w", path, err)
	}
	return nil
}

// Load reads a history Save wrote.
func Load(path string) (*History, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("history: read %s: %w", path, err)
	}
	var h History
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("history: decode %s: %w", path, err)
	}
	return &h, nil
}
