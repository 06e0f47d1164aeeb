// Package positions keeps, in a compacted Kafka topic, how far the events an exactly-once relay
// committed to Kafka reach: the value's encoding (value.go), the topic's partition, creation and
// check (topic.go), the read_committed read of the latest position (read.go) after waiting for the
// partition's last stable offset (stable.go), and the writer that puts a position into each Kafka
// transaction (write.go). It works on the producer's client and committer; the sink decides when.
//
// The positions topic holds, per transactional id (the record key), the Position each committed
// Kafka transaction reached, written inside that transaction: a read_committed reader of the
// latest record of the key learns exactly how far the committed events go. The value is JSON with
// a version, so it can grow:
//
//	{"v":2,"system_identifier":"7714668250760685997","timeline":2,"commit_lsn":"0/1A2B3C8","events":12}
//
// commit_lsn is the commit LSN of the PostgreSQL transaction of the last committed event, events
// how many events of that transaction (by decoder.Event.Index) are committed; system_identifier
// and timeline are the server that transaction was streamed from, since an LSN names another
// transaction on another timeline (a promoted standby that was behind reuses LSNs the old primary
// had passed) or another database cluster. Version 1 had no origin: it is still read, with an
// unknown origin (SystemID "" and Timeline 0), and the relay decides what such a position may
// skip (relay/origin.go). Version 2 is written only with the origin known; a position whose events
// carry none (not from a replication session) is written as version 1. The topic is compacted:
// only the latest record per key matters.
package positions

import "github.com/jackc/pglogrepl"

// Position is how far the events committed in Kafka reach, in WAL stream order.
type Position struct {
	// CommitLSN is the commit LSN (decoder.TxInfo.CommitLSN) of the PostgreSQL transaction of the
	// last committed event.
	CommitLSN pglogrepl.LSN
	// Events is how many events of that transaction (by decoder.Event.Index) are committed.
	Events int
	// SystemID and Timeline are the server the transaction at CommitLSN was streamed from (its
	// database cluster and WAL history): CommitLSN means something only there and on timelines
	// that descend from that one below the point where they forked. "" and 0 when unknown: a
	// position of version 1, written before positions carried their origin.
	SystemID string
	Timeline uint32
}

// Covers reports whether the event with index of the transaction committed at commitLSN is
// already committed in Kafka at p: a replay skips it.
func (p Position) Covers(commitLSN pglogrepl.LSN, index int) bool {
	return commitLSN < p.CommitLSN || (commitLSN == p.CommitLSN && index < p.Events)
}
