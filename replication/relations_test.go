package replication

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
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

// A lookup that fails for a reason retrying can fix (here: the role may not connect for a moment)
// is retried while the stream waits, not returned as an error that would end the relay.
func TestBelongsToOutboxRetriesATransientFailure(t *testing.T) {
	dsn, admin := horizonDB(t)
	role := "classifier_" + strings.TrimPrefix(testenv.UniqueName(t, "r"), "r_")[:8]
	mustExec(t, admin, `CREATE SCHEMA rel; CREATE TABLE rel.outbox `+outboxColumns+`;
		CREATE TABLE rel.other `+outboxColumns+`;
		CREATE PUBLICATION rel_pub FOR TABLE rel.outbox, rel.other WITH (publish = 'insert');
		CREATE ROLE `+role+` LOGIN PASSWORD 'classifier' CONNECTION LIMIT 0;
		GRANT USAGE ON SCHEMA rel TO `+role)
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role) })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "classifier")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	core, logs := observer.New(zap.WarnLevel)
	logger := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	s := New(Config{DSN: u.String(), Schema: "rel", Table: "outbox", Publication: "rel_pub"}, checkpoint.New(0), logger, metrics.New(nil))
	var oid, other uint32
	if err := admin.QueryRow(ctx, "SELECT 'rel.outbox'::regclass::oid, 'rel.other'::regclass::oid").Scan(&oid, &other); err != nil {
		t.Fatal(err)
	}
	if err := s.guard.start(oid); err != nil {
		t.Fatal(err)
	}
	allowed := make(chan struct{})
	go func() {
		defer close(allowed)
		// The role may connect again once the lookup has failed and said it retries.
		for logs.FilterMessageSnippet("cannot classify a relation").Len() == 0 && ctx.Err() == nil {
			time.Sleep(await.Poll)
		}
		admin.Exec(context.Background(), "ALTER ROLE "+role+" CONNECTION LIMIT -1")
	}()
	// admin is not safe for concurrent use: the cleanups use it only after the goroutine is done.
	defer func() { <-allowed }()
	got, err := s.BelongsToOutbox(ctx, RelationRef{OID: other, Schema: "rel", Table: "other",
		Columns: []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload"}})
	if err != nil {
		t.Fatalf("a connection refused for a moment ended the classification: %v", err)
	}
	if got {
		t.Fatal("another table of the publication classified as the outbox")
	}
}

// The classifier's connection follows the stream's server: one that reaches another database
// cluster than the stream's is refused as such, and after a timeline change (a reset) the next
// classification opens a new connection rather than asking the server the old one reached.
func TestClassifierFollowsTheStreamsServer(t *testing.T) {
	dsn, admin := horizonDB(t)
	mustExec(t, admin, `CREATE SCHEMA rel; CREATE TABLE rel.outbox `+outboxColumns+`; CREATE TABLE rel.other `+outboxColumns+`;
		CREATE PUBLICATION rel_pub FOR TABLE rel.outbox, rel.other WITH (publish = 'insert')`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var oid, other uint32
	var systemID string
	if err := admin.QueryRow(ctx, "SELECT 'rel.outbox'::regclass::oid, 'rel.other'::regclass::oid, (SELECT system_identifier::text FROM pg_control_system())").
		Scan(&oid, &other, &systemID); err != nil {
		t.Fatal(err)
	}
	ref := RelationRef{OID: other, Schema: "rel", Table: "other", Columns: []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload"}}
	newStream := func(cluster string) *Stream {
		s := New(Config{DSN: dsn, Schema: "rel", Table: "outbox", Publication: "rel_pub"}, checkpoint.New(0), zaptest.NewLogger(t), metrics.New(nil))
		if err := s.guard.start(oid); err != nil {
			t.Fatal(err)
		}
		s.guard.expectCluster(cluster)
		return s // the classifier closes its connection when ctx ends
	}

	s := newStream("7000000000000000001")
	if _, err := s.BelongsToOutbox(ctx, ref); err == nil || !IsFatal(err) || !strings.Contains(err.Error(), "different database clusters") {
		t.Fatalf("classifying on another cluster than the stream's: %v, want a fatal error naming it", err)
	}

	s = newStream(systemID)
	if ours, err := s.BelongsToOutbox(ctx, ref); err != nil || ours {
		t.Fatalf("BelongsToOutbox = %v, %v; want another table of the publication", ours, err)
	}
	before := s.classifier.conn
	s.guard.reset()
	if ours, err := s.BelongsToOutbox(ctx, ref); err != nil || ours {
		t.Fatalf("after a reset: BelongsToOutbox = %v, %v", ours, err)
	}
	if s.classifier.conn == before {
		t.Fatal("after a timeline change the classifier reused the connection opened before it")
	}
}
