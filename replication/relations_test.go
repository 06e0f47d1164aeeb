package replication

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/metrics"
)

// BelongsToOutbox: the outbox's own OID is the outbox under any name (WAL written while it was
// renamed), even when the publication is FOR ALL TABLES; a table whose schema is published is
// published in its own right, not mistaken for a detached partition of the outbox.
func TestBelongsToOutbox(t *testing.T) {
	columns := []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload"}
	tests := []struct {
		name  string
		setup string
		rel   string // the relation in the stream, by name; "" for the outbox's OID
		want  bool
	}{
		{"the outbox under another name, FOR ALL TABLES", `CREATE PUBLICATION rel_pub FOR ALL TABLES WITH (publish = 'insert')`, "", true},
		{"the outbox under another name", `CREATE PUBLICATION rel_pub FOR TABLE rel.outbox WITH (publish = 'insert')`, "", true},
		{"a table of a published schema", `CREATE SCHEMA other; CREATE TABLE other.lookalike ` + outboxColumns + `;
			CREATE PUBLICATION rel_pub FOR TABLE rel.outbox, TABLES IN SCHEMA other WITH (publish = 'insert')`, "other.lookalike", false},
		{"a detached partition", `DROP TABLE rel.outbox; CREATE TABLE rel.outbox ` + outboxColumns + ` PARTITION BY HASH (id);
			CREATE TABLE rel.outbox_0 PARTITION OF rel.outbox FOR VALUES WITH (MODULUS 1, REMAINDER 0);
			CREATE PUBLICATION rel_pub FOR TABLE rel.outbox WITH (publish = 'insert', publish_via_partition_root = true);
			ALTER TABLE rel.outbox DETACH PARTITION rel.outbox_0`, "rel.outbox_0", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dsn, admin := horizonDB(t)
			mustExec(t, admin, `CREATE SCHEMA rel; CREATE TABLE rel.outbox `+outboxColumns)
			mustExec(t, admin, tt.setup)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s := New(Config{DSN: dsn, Schema: "rel", Table: "outbox", Publication: "rel_pub"}, checkpoint.New(0), zaptest.NewLogger(t), metrics.New(nil))
			var oid uint32
			if err := admin.QueryRow(ctx, "SELECT 'rel.outbox'::regclass::oid").Scan(&oid); err != nil {
				t.Fatal(err)
			}
			if err := s.guard.start(oid); err != nil {
				t.Fatal(err)
			}
			ref := RelationRef{OID: oid, Schema: "rel", Table: "outbox_renamed", Columns: columns}
			if tt.rel != "" {
				if err := admin.QueryRow(ctx, "SELECT $1::regclass::oid", tt.rel).Scan(&ref.OID); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.BelongsToOutbox(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("BelongsToOutbox = %v, want %v", got, tt.want)
			}
		})
	}
}
