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
	"strings"
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
	// Plan is the schedule the run drew up front from its seed, with every option that drew it:
	// enough to run the same schedule again (internal/cmd/chaos --replay).
	Plan *Plan `json:"plan,omitempty"`
	// Required names what the schedule must have carried out in this mode for the run to count
	// (check.Unmet): RequireLeaderKill, RequireLeaderZombie, RequireLeaderChange, RequireFailover.
	Required []string `json:"required,omitempty"`

	// FaultsFrom and FaultsTo are the fault period: from when every mode had a leader and the
	// nemesis began to when it stopped drawing (its last faults healed). The liveness rule's
	// windows tile it; zero in histories recorded before it was kept.
	FaultsFrom time.Time `json:"faults_from,omitempty"`
	FaultsTo   time.Time `json:"faults_to,omitempty"`
	// Unsettled says why the in-doubt transactions could not be settled at the end (the marker
	// rows could not be read on the final primary): the outcomes are then unknown and the run was
	// not carried out. Empty when the settlement succeeded.
	Unsettled string `json:"unsettled,omitempty"`

	// Exits lists every end of a relay process, whatever ended it (a SIGTERM, a SIGKILL, or the
	// relay itself), with what its log said.
	Exits []Exit `json:"exits,omitempty"`
	// EndOffsets is every partition's last stable offset and high watermark, read after the final
	// stops and the relays' Kafka transaction timeout (the positions topic included).
	EndOffsets []EndOffset `json:"end_offsets,omitempty"`
}

// What a run may be required to have carried out in a mode (History.Required).
const (
	RequireLeaderKill   = "leader-kill"   // a kill9 whose target led at that moment
	RequireLeaderZombie = "leader-zombie" // a pause longer than the lease whose target led at that moment
	RequireRelayKill    = "relay-kill"    // a kill9 of any relay (modes without a leader)
	RequireRelayZombie  = "relay-zombie"  // a pause longer than the lease of any relay (modes without a leader)
	RequireLeaderChange = "leader-change" // leadership passed from one relay to another
	RequireFailover     = "failover"      // a failover that took effect (cluster-wide)
)

// Plan is a schedule drawn up front: the options of the run and every fault, in order.
type Plan struct {
	Options PlanOptions    `json:"options"`
	Faults  []PlannedFault `json:"faults"`
}

// PlanOptions are the options of a run that shape its schedule and its load.
type PlanOptions struct {
	Seed      uint64        `json:"seed"`
	Duration  time.Duration `json:"duration"`
	Modes     []string      `json:"modes"`
	Kinds     []string      `json:"kinds"`
	PGVersion string        `json:"pg_version"`
	Relays    int           `json:"relays"`
	Writers   int           `json:"writers"`
	Rate      float64       `json:"rate"`
	Mean      time.Duration `json:"mean"`
	Short     bool          `json:"short,omitempty"`
	Brokers   int           `json:"brokers,omitempty"` // 0: 1
}

// Command returns the make chaos command line that draws and runs the same schedule again: the
// seed and every option that shapes the schedule or the load.
func (o PlanOptions) Command() string {
	short := ""
	if o.Short {
		short = " SHORT=1"
	}
	if o.Brokers > 1 {
		short += fmt.Sprintf(" BROKERS=%d", o.Brokers)
	}
	return fmt.Sprintf("make chaos SEED=%d DURATION=%s MODE=%s KINDS=%s RELAYS=%d WRITERS=%d RATE=%g MEAN=%s PG_VERSION=%s%s",
		o.Seed, o.Duration, strings.Join(o.Modes, ","), strings.Join(o.Kinds, ","), o.Relays, o.Writers, o.Rate, o.Mean, o.PGVersion, short)
}

// Roles a relay fault's target is drawn by: resolved to a relay at the moment the fault applies.
const (
	RoleLeader   = "leader"
	RoleFollower = "follower"
	RoleAny      = "any" // modes without a leader (poll)
)

// PlannedFault is one fault of a plan, before it is applied.
type PlannedFault struct {
	Seq  int           `json:"seq"`
	At   time.Duration `json:"at"` // from the start of the fault period
	Kind string        `json:"kind"`
	Mode string        `json:"mode,omitempty"` // relay and mode faults
	Role string        `json:"role,omitempty"` // relay faults
	// Pick chooses among the relays that fit the role at the moment (the index modulo their count);
	// for broker-stop, broker-pause and broker-kill it is the broker's node.
	Pick     int           `json:"pick,omitempty"`
	Duration time.Duration `json:"duration,omitempty"`
	Detail   string        `json:"detail,omitempty"`
	Events   int           `json:"events,omitempty"` // of a big transaction
	// Required: dealt for what every run must carry out (History.Required). A required leader's
	// fault waits for a leader instead of going to a follower when the mode has none for a while.
	Required bool `json:"required,omitempty"`
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

	// The parts of the liveness bound and of the duplicate bound (docs/guarantees.md, "Bounded
	// duplicates" and "What happens on each fault"); zero in histories recorded before they were
	// kept, and then the rules that need them are not applied.
	//
	// LeaderRetry is leader_retry_interval: how often a standby tries the lock.
	LeaderRetry time.Duration `json:"leader_retry,omitempty"`
	// LeaderKafkaTimeout is leader_kafka_timeout: how long a leader cut off from Kafka alone
	// keeps the lock before it hands over.
	LeaderKafkaTimeout time.Duration `json:"leader_kafka_timeout,omitempty"`
	// KafkaWriteTimeout is kafka.write_timeout: how long one produce request may wait before it
	// is retried.
	KafkaWriteTimeout time.Duration `json:"kafka_write_timeout,omitempty"`
	// LiveSlack is how much longer than the documented bound (lease or leader_kafka_timeout,
	// leader_retry_interval, kafka.write_timeout) an event may wait: make test's short run shares
	// the machine with other test packages, and a takeover there takes what the machine gives it.
	// make chaos holds the documented bound (0).
	LiveSlack time.Duration `json:"live_slack,omitempty"`
	// StatusInterval is status_interval: how often the confirmed position reaches PostgreSQL.
	StatusInterval time.Duration `json:"status_interval,omitempty"`
	// MaxInFlightEvents is max_in_flight_events as the relays resolve it: events handed to Kafka
	// and not yet acknowledged, at most.
	MaxInFlightEvents int `json:"max_in_flight_events,omitempty"`
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
	// CommitLSN is at or after the end of the transaction's commit record: the server's WAL
	// insert position read on the same connection right after COMMIT returned (the commit record
	// was inserted before the COMMIT was answered). 0: not known (the COMMIT's answer or the read
	// was lost).
	CommitLSN uint64 `json:"commit_lsn,omitempty"`
	// Slot is the slot that streams the transaction's database: the slot-ahead rule compares a
	// slot's samples only with its own database's transactions.
	Slot string `json:"slot,omitempty"`
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
	// Seq is the fault's place in History.Plan.
	Seq int `json:"seq,omitempty"`
	// Role is what the target was drawn as (a relay fault: leader, follower, any); Leader says
	// whether the target reported leadership when the fault applied (read from the relays then).
	Role   string `json:"role,omitempty"`
	Leader bool   `json:"leader,omitempty"`
	// Failed is the error of an action that failed; Skipped why the fault never applied (its
	// target or its server busy until the fault period ended, a standby not ready). A failed or
	// skipped fault is kept for the reader but counts for nothing: not in summaries, not as an
	// excuse for a duplicate or a stall, not towards History.Required.
	Failed  string `json:"failed,omitempty"`
	Skipped string `json:"skipped,omitempty"`
}

// TookEffect reports whether f was applied: neither skipped nor failed.
func (f Fault) TookEffect() bool { return f.Failed == "" && f.Skipped == "" }

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
