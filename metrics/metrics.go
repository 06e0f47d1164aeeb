// Package metrics defines the relay's Prometheus metrics. Collectors are created per registry, never
// registered globally, so tests and several relays in one process do not collide.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "outbox_relay"

// Metrics holds every collector the relay updates.
type Metrics struct {
	EventsPublished    *prometheus.CounterVec // by topic
	EventsFailed       *prometheus.CounterVec // by reason
	EventsDeadLettered *prometheus.CounterVec // by original topic
	BytesPublished     prometheus.Counter
	PublishLatency     prometheus.Histogram
	EndToEndLatency    prometheus.Histogram
	InFlightEvents     prometheus.Gauge
	InFlightBytes      prometheus.Gauge
	LastAckTimestamp   prometheus.Gauge
	SecondsBehind      prometheus.Gauge
	Halted             prometheus.Gauge
	KafkaRetries       prometheus.Counter
	PrunedRows         prometheus.Counter
	ProduceRequests    prometheus.Counter
	RequestRecords     prometheus.Histogram
	KafkaTransactions  *prometheus.CounterVec // by outcome: committed, aborted, fenced

	ReceivedLSN       prometheus.Gauge
	ConfirmedLSN      prometheus.Gauge
	TransactionsTotal prometheus.Counter
	Reconnects        *prometheus.CounterVec // by component
	StatusUpdates     prometheus.Counter

	SlotLagBytes prometheus.Gauge
	// SlotAheadOfWALBytes is how far the slot's confirmed position lies beyond the server's end of
	// WAL: never in a sound history (a restored data directory streamed beyond it).
	SlotAheadOfWALBytes prometheus.Gauge
	SlotRetainedBytes   prometheus.Gauge
	SlotSafeWALSize     prometheus.Gauge
	SlotWALStatus       *prometheus.GaugeVec // 1 for the current wal_status
	SlotActive          prometheus.Gauge
	// Series only where the server reports the column or setting (see slotmon.Column).
	SlotInvalidated   *prometheus.GaugeVec // by reason: 1 for the slot's invalidation_reason (17+)
	SlotInactiveSince *prometheus.GaugeVec // no labels: inactive_since (17+) while nothing streams the slot
	IdleSlotTimeout   *prometheus.GaugeVec // no labels: idle_replication_slot_timeout (18+)
	Leader            prometheus.Gauge
	Ready             prometheus.Gauge

	SlotExists prometheus.Gauge
	// SlotFailover, StandbySlots and StandbySlotsActive say whether the slot survives a promotion
	// (PostgreSQL 17+ failover slots) and what protects it (synchronized_standby_slots).
	SlotFailover       prometheus.Gauge
	StandbySlots       prometheus.Gauge
	StandbySlotsActive prometheus.Gauge
	PostgresUp         prometheus.Gauge
	Fenced             prometheus.Counter
	// LeaderSlowChecks counts near misses of the leader's lock check (leader_check_timeout).
	LeaderSlowChecks prometheus.Counter

	// The standby of failover_standby_dsn and its copy of the slot; no series without one.
	StandbyUp                    *prometheus.GaugeVec
	StandbySlotReady             *prometheus.GaugeVec
	StandbySlotPersisted         *prometheus.GaugeVec
	StandbySlotTrailBytes        *prometheus.GaugeVec
	StandbySlotRestartTrailBytes *prometheus.GaugeVec

	TopicUnavailable *prometheus.GaugeVec // by topic: 1 while the relay waits for a missing or unauthorized topic

	// The schema registry of the registry-backed encodings (package schemaregistry); no series
	// without one: SchemaRegistryMetrics makes them.
	SchemaRegistryUp       *prometheus.GaugeVec
	SchemaRegistryRequests *prometheus.CounterVec // by outcome

	PublicationCheckAge prometheus.Gauge

	// The polling mode (source: poll; package poll).
	PollPendingRows      prometheus.Gauge
	PollOldestPendingAge prometheus.Gauge
	PollDeadLetters      prometheus.Gauge
	PollClaims           prometheus.Counter
	PollClaimedRows      prometheus.Counter
	PollEmpty            prometheus.Counter
	PollBatchDuration    prometheus.Histogram
	PollRefused          *prometheus.CounterVec // by reason
	PollDeadLettered     prometheus.Counter
	// Source is 1 for the source this process reads (wal or poll), so alerts about the slot or a
	// single leader can leave polling deployments out.
	Source *prometheus.GaugeVec
	// EventsSkipped counts events of a replay that were not published again (exactly-once).
	EventsSkipped prometheus.Counter
	// SlotRecoveries and SlotRecoveredEvents count lost slots recovered from the outbox table
	// (on_slot_lost: recover) and the events published from it.
	SlotRecoveries      prometheus.Counter
	SlotRecoveredEvents prometheus.Counter
	// SlotCreationWait is how long the slot's creation has waited for other transactions to end
	// while one still holds it up; 0 otherwise.
	SlotCreationWait prometheus.Gauge
}

// latencyBuckets spans 1 ms to ~1 min: commit-to-ack latency is milliseconds when healthy and
// seconds to minutes while the broker is down.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)

// New creates the collectors and registers them with reg.
func New(reg prometheus.Registerer) *Metrics {
	f := factory{reg: reg}
	m := &Metrics{}
	m.sinkCollectors(f)
	m.streamCollectors(f)
	m.slotCollectors(f)
	m.failoverCollectors(f)
	m.pollCollectors(f)
	m.registryCollectors(f)
	return m
}

// registryCollectors creates the collectors of the schema registry client.
func (m *Metrics) registryCollectors(f factory) {
	m.SchemaRegistryUp = f.gaugeVec("schema_registry_up",
		"1 while the schema registry answers, 0 from a request it could not answer (down, 5xx, 408, 429, refused credentials) until it answers again; no series without a registry.")
	m.SchemaRegistryRequests = f.counterVec("schema_registry_requests_total",
		"Requests to the schema registry (cache misses), by outcome: ok, unavailable, incompatible, not_found, rejected.", "outcome")
}

// SchemaRegistryMetrics returns the collectors of a schema registry client
// (schemaregistry.Options.Metrics wants these two), creating the series.
func (m *Metrics) SchemaRegistryMetrics() (up prometheus.Gauge, requests *prometheus.CounterVec) {
	return m.SchemaRegistryUp.WithLabelValues(), m.SchemaRegistryRequests
}

// sinkCollectors creates the collectors of the sink: what Kafka acknowledged, refused or
// dead-lettered, and what waits in flight.
func (m *Metrics) sinkCollectors(f factory) {
	m.EventsPublished = f.counterVec("events_published_total",
		"Outbox events acknowledged by Kafka, by topic.", "topic")
	m.EventsFailed = f.counterVec("events_failed_total",
		"Outbox events that could not be published to their topic, by reason; each then went to the failure policy.", "reason")
	m.EventsDeadLettered = f.counterVec("events_dead_lettered_total",
		"Outbox events published to the dead-letter topic instead of their own, by original topic.", "topic")
	m.BytesPublished = f.counter("published_bytes_total", "Bytes acknowledged by Kafka, counted like max_in_flight_bytes: the memory each event held (at least key, value and headers).")
	m.PublishLatency = f.histogram("publish_latency_seconds",
		"Time from handing an event to the Kafka producer to its acknowledgement.")
	m.EndToEndLatency = f.histogram("end_to_end_latency_seconds",
		"Time from the PostgreSQL commit of an event to its Kafka acknowledgement.")
	m.InFlightEvents = f.gauge("in_flight_events", "Events handed to Kafka and not yet acknowledged.")
	m.InFlightBytes = f.gauge("in_flight_bytes", "Bytes of events handed to Kafka and not yet acknowledged.")
	m.LastAckTimestamp = f.gauge("last_ack_timestamp_seconds",
		"Unix time of the most recent Kafka acknowledgement.")
	m.SecondsBehind = f.gauge("seconds_behind_source",
		"Age of the newest acknowledged event's commit while a backlog is in flight; 0 when caught up.")
	m.Halted = f.gauge("halted",
		"1 when the halt policy stopped publishing because an event could not be published.")
	m.KafkaRetries = f.counter("kafka_retries_total", "Kafka requests retried after a transient error.")
	m.ProduceRequests = f.counter("kafka_produce_requests_total",
		"Produce requests sent to Kafka brokers (each carries every ready partition the broker leads).")
	m.RequestRecords = f.histogramWith("kafka_request_records", "Records per produce request.",
		prometheus.ExponentialBuckets(1, 4, 8))
	m.KafkaTransactions = f.counterVec("kafka_transactions_total",
		"Kafka transactions ended (delivery exactly-once), by outcome: committed, aborted, fenced.", "outcome")
	m.TopicUnavailable = f.gaugeVec("topic_unavailable",
		"1 for a topic the relay has waited for more than 3s because it does not exist (auto-creation off) or is not authorized; every event waits behind it.", "topic")
	m.EventsSkipped = f.counter("events_replay_skipped_total",
		"Events PostgreSQL streamed again that were not published again: the position committed in Kafka covers them (delivery: exactly-once), or this process handed them over before a reconnect.")
	m.PrunedRows = f.counter("pruned_rows_total", "Outbox rows deleted by the periodic prune (prune_interval).")
}

// streamCollectors creates the collectors of the replication stream: what PostgreSQL sent and what
// the relay confirmed.
func (m *Metrics) streamCollectors(f factory) {
	m.ReceivedLSN = f.gauge("received_lsn", "Highest WAL position received from PostgreSQL.")
	m.ConfirmedLSN = f.gauge("confirmed_lsn", "WAL position last confirmed to PostgreSQL as flushed.")
	m.TransactionsTotal = f.counter("transactions_total", "Transactions decoded from the WAL, with or without outbox events (PostgreSQL 14 sends every transaction of the database).")
	m.Reconnects = f.counterVec("reconnects_total",
		"Reconnections after a lost connection, by component.", "component")
	m.StatusUpdates = f.counter("status_updates_total", "Standby status updates sent to PostgreSQL.")
	m.PublicationCheckAge = f.gauge("publication_check_age_seconds",
		"Seconds since the last successful check that the outbox table is still in the publication; the slot is not confirmed past what that check covered, and the relay stops after 5 minutes of checks PostgreSQL refuses.")
}

// slotCollectors creates the collectors of the slot as the server reports it (read by every
// instance, leader or not), and its recoveries.
func (m *Metrics) slotCollectors(f factory) {
	m.SlotLagBytes = f.gauge("slot_lag_bytes",
		"pg_current_wal_lsn() (on a hot standby, pg_last_wal_replay_lsn()) minus the slot's confirmed_flush_lsn.")
	m.SlotAheadOfWALBytes = f.gauge("slot_confirmed_ahead_of_wal_bytes",
		"The slot's confirmed_flush_lsn minus pg_current_wal_lsn() when positive: the slot was confirmed beyond the server's end of WAL (a data directory restored from an earlier copy), and transactions below it are skipped. 0 otherwise.")
	m.SlotRetainedBytes = f.gauge("slot_retained_wal_bytes",
		"pg_current_wal_lsn() minus the slot's restart_lsn: WAL kept on disk for the slot.")
	m.SlotSafeWALSize = f.gauge("slot_safe_wal_size_bytes",
		"Bytes of WAL that can still be written before the slot is in danger of being lost (safe_wal_size); -1 when unlimited.")
	m.SlotWALStatus = f.gaugeVec("slot_wal_status",
		"1 for the slot's current wal_status (reserved, extended, unreserved, lost).", "status")
	m.SlotActive = f.gauge("slot_active", "1 when the replication slot is being streamed by some process.")
	m.SlotInvalidated = f.gaugeVec("slot_invalidated",
		"1 for the reason PostgreSQL invalidated the slot (invalidation_reason: wal_removed, rows_removed, wal_level_insufficient, idle_timeout, other), 0 for the others; no series before PostgreSQL 17, which does not report it (see slot_wal_status lost).", "reason")
	m.SlotInactiveSince = f.gaugeVec("slot_inactive_since_timestamp_seconds",
		"Unix time since when nothing streams the slot (inactive_since); no series while it is streamed or before PostgreSQL 17.")
	m.IdleSlotTimeout = f.gaugeVec("idle_replication_slot_timeout_seconds",
		"The server's idle_replication_slot_timeout: a slot inactive for longer is invalidated at the next checkpoint; 0 disables it; no series before PostgreSQL 18.")
	m.SlotExists = f.gauge("slot_exists", "1 when the replication slot exists (read from pg_replication_slots).")
	m.PostgresUp = f.gauge("postgres_up",
		"1 when the last poll of pg_replication_slots (with source poll: of the outbox table's statistics) succeeded; 0 means the slot (poll_*) metrics are stale.")
	m.SlotRecoveries = f.counter("slot_recoveries_total",
		"Lost replication slots this process replaced and whose gap it published from the outbox table (on_slot_lost: recover).")
	m.SlotRecoveredEvents = f.counter("slot_recovered_events_total",
		"Events a lost slot's recovery published from the outbox table; some may be duplicates (see the recovery's log line).")
	m.SlotCreationWait = f.gauge("slot_creation_wait_seconds",
		"Seconds the replication slot's creation has waited while a transaction that began before it (one holding a transaction id, or a prepared transaction) had not ended; 0 when no creation waits. The relay's log names the transaction.")
}

// failoverCollectors creates the collectors of leadership, and whether the slot survives a
// promotion (failover slots, the standby of failover_standby_dsn).
func (m *Metrics) failoverCollectors(f factory) {
	m.Leader = f.gauge("leader", "1 when this instance holds leadership and streams the slot.")
	m.Ready = f.gauge("ready", "1 when this instance is ready (streaming, or a healthy standby).")
	m.Fenced = f.counter("fenced_total",
		"Leadership terms ended because the leader-lock connection failed; streaming stopped at once.")
	m.LeaderSlowChecks = f.counter("leader_slow_checks_total",
		"Checks of the leader-lock connection that took more than half of leader_check_timeout: near misses of a fence.")
	m.SlotFailover = f.gauge("slot_failover",
		"1 when the replication slot is a failover slot (PostgreSQL 17+), which standbys with sync_replication_slots = on keep through a promotion.")
	m.StandbySlots = f.gauge("synchronized_standby_slots",
		"Physical slots listed in the server's synchronized_standby_slots (PostgreSQL 17+): a failover slot's changes reach the relay only once their standbys have the WAL. 0: the relay may publish transactions no standby has received.")
	m.StandbySlotsActive = f.gauge("synchronized_standby_slots_active",
		"Slots of synchronized_standby_slots that exist and are streamed; below outbox_relay_synchronized_standby_slots, PostgreSQL holds the failover slot's changes back.")
	m.StandbyUp = f.gaugeVec("standby_up",
		"1 when the last poll of the standby of failover_standby_dsn succeeded; no series without failover_standby_dsn.")
	m.StandbySlotReady = f.gaugeVec("standby_slot_ready",
		"1 when a promotion of the standby of failover_standby_dsn now keeps a usable copy of the slot (in recovery, PostgreSQL 17+, slot synchronisation set up, the copy synced, persisted and valid); 0 otherwise, also while the standby cannot be asked.")
	m.StandbySlotPersisted = f.gaugeVec("standby_slot_persisted",
		"1 when the standby's copy of the slot is synced and no longer temporary (pg_replication_slots on the standby); 0 while it is missing or temporary: PostgreSQL drops a temporary copy at promotion.")
	m.StandbySlotTrailBytes = f.gaugeVec("standby_slot_trail_bytes",
		"The primary slot's confirmed_flush_lsn minus the standby copy's: what a promotion now would publish again; no series without a copy.")
	m.StandbySlotRestartTrailBytes = f.gaugeVec("standby_slot_restart_trail_bytes",
		"The primary slot's restart_lsn minus the standby copy's; no series without a copy.")
}

// pollCollectors creates the collectors of the polling mode (source: poll), and which source this
// process reads.
func (m *Metrics) pollCollectors(f factory) {
	m.PollPendingRows = f.gauge("poll_pending_rows",
		"Polling mode: outbox rows not yet processed (dead letters waiting under the halt policy included).")
	m.PollOldestPendingAge = f.gauge("poll_oldest_pending_age_seconds",
		"Polling mode: age (by created_at) of the oldest pending row that is not a dead letter; 0 when none.")
	m.PollDeadLetters = f.gauge("poll_dead_letters",
		"Polling mode: rows in the dead-letter view (refused poll_max_attempts times) still in the table.")
	m.PollClaims = f.counter("poll_claims_total", "Polling mode: batches claimed (each one short transaction).")
	m.PollClaimedRows = f.counter("poll_claimed_rows_total",
		"Polling mode: rows claimed; above events published, the difference is rows published again after a refusal or a lost transaction.")
	m.PollEmpty = f.counter("poll_empty_total",
		"Polling mode: claims that took nothing (no row due, or every due row's aggregate held by another worker).")
	m.PollBatchDuration = f.histogram("poll_batch_duration_seconds",
		"Polling mode: one batch from its claim to the commit that marks it, Kafka's acknowledgements included.")
	m.PollRefused = f.counterVec("poll_refused_total",
		"Polling mode: publish attempts Kafka refused for good, by reason; each counts against poll_max_attempts and is retried after a backoff.", "reason")
	m.PollDeadLettered = f.counter("poll_dead_lettered_total",
		"Polling mode: rows that reached poll_max_attempts and went to the failure policy.")
	m.Source = f.gaugeVec("source", "1 for where this process reads events from: wal (a replication slot) or poll (the outbox table).", "source")
}

// EndTerm clears what describes one leadership term, when it ends: a standby (or a leader between
// two terms) has received, confirmed and sent nothing, so the last term's LSNs, in-flight counts,
// backlog age, halt, waits for topics and publication check age would read as a stuck leader, or
// pass a dashboard's max() off as the real leader's progress. The slot metrics stay: they are read
// from the server by every instance.
func (m *Metrics) EndTerm() {
	m.Leader.Set(0)
	m.ReceivedLSN.Set(0)
	m.ConfirmedLSN.Set(0)
	// What the fenced relay had in flight is abandoned, not acknowledged: the next term counts afresh.
	m.InFlightEvents.Set(0)
	m.InFlightBytes.Set(0)
	m.SecondsBehind.Set(0)
	m.Halted.Set(0)
	m.TopicUnavailable.Reset()
	m.PublicationCheckAge.Set(0)
}

type factory struct{ reg prometheus.Registerer }

func (f factory) register(c prometheus.Collector) {
	if f.reg != nil {
		f.reg.MustRegister(c)
	}
}

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	f.register(c)
	return c
}

func (f factory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	f.register(c)
	return c
}

func (f factory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
	f.register(g)
	return g
}

func (f factory) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels)
	f.register(g)
	return g
}

func (f factory) histogramWith(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets})
	f.register(h)
	return h
}

func (f factory) histogram(name, help string) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Name: name, Help: help, Buckets: latencyBuckets,
	})
	f.register(h)
	return h
}
