package main_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The documentation's command blocks that a reader would type are marked in the Markdown source
// with an HTML comment on the line before the fence (invisible once rendered):
//
//	<!-- runnable -->             a ```sh block run to completion (bash -e: every line must
//	                              succeed), or a ```sql block run against the database;
//	<!-- runnable: background --> a ```sh block of one long-running command (outbox-relay run),
//	                              started and left running until the page's last block has run,
//	                              then stopped with SIGTERM, which it must survive cleanly.
const (
	runnableMarker   = "<!-- runnable -->"
	backgroundMarker = "<!-- runnable: background -->"
)

// docBlock is one marked block of a page.
type docBlock struct {
	line       int    // of the opening fence
	lang       string // sh or sql
	background bool
	body       string
}

// runnableBlocks returns the marked blocks of a Markdown file, in order, and fails on a marker
// that is not followed by a fenced sh or sql block.
func runnableBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []docBlock
	var cur *docBlock
	pending := "" // the marker seen on the line before
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur != nil && trimmed == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		case trimmed == runnableMarker || trimmed == backgroundMarker:
			pending = trimmed
		case pending != "":
			lang, ok := strings.CutPrefix(trimmed, "```")
			if !ok || (lang != "sh" && lang != "sql") || (pending == backgroundMarker && lang != "sh") {
				t.Fatalf("%s:%d: %s must be followed by a ```sh block (or, run to completion, a ```sql one), found %q", path, n, pending, line)
			}
			cur = &docBlock{line: n, lang: lang, background: pending == backgroundMarker}
			pending = ""
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil || pending != "" {
		t.Fatalf("%s: a runnable block is not closed", path)
	}
	return blocks
}

// TestTheDocumentsRunnableBlocksRun runs the blocks the README and the migration guide mark
// runnable, in order, against the package's PostgreSQL and Kafka and the built binary (as
// bin/outbox-relay and as outbox-relay on PATH), so that a renamed command, flag or key, or an
// example that no longer gives the record the page describes, fails the build rather than the
// reader. Each page gets a database of its own, in the state the page assumes, and its own slot
// and topics (environment variables the pages' commands do not override).
func TestTheDocumentsRunnableBlocksRun(t *testing.T) {
	t.Parallel()
	pages := []struct {
		file string
		// setup puts the database in the state the page assumes.
		setup string
		// slot is the slot the page's relay streams: "" for the test's own (OUTBOX_SLOT).
		slot string
		// canary, if set, is written by the test once the relay streams, for a page whose own
		// blocks write no event.
		canary string
		// key is the record key the page's event (or the canary) has on topic <prefix>.order.
		key string
	}{
		{
			file:  "README.md",
			setup: "CREATE TABLE orders (id text PRIMARY KEY, customer text, total numeric)",
			key:   "o-1001",
		},
		{
			file: "docs/migrating-from-debezium.md",
			// A database as Debezium's defaults leave it: its outbox table and a publication of
			// all tables (publication.autocreate.mode=all_tables).
			setup: `CREATE TABLE public.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype varchar(255) NOT NULL,
				aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb);
				CREATE PUBLICATION dbz_publication FOR ALL TABLES`,
			slot:   "debezium",
			canary: `INSERT INTO public.outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'o-2001', 'OrderCreated', '{"id": "o-2001"}')`,
			key:    "o-2001",
		},
	}
	pg, k := testenv.SharedPostgres(t), testenv.SharedKafka(t)
	bin := relayproc.Binary(t)
	for _, page := range pages {
		t.Run(page.file, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			blocks := runnableBlocks(t, filepath.Join("..", "..", page.file))
			if len(blocks) < 2 {
				t.Fatalf("%s marks %d blocks runnable; the test expects its start and its status at least", page.file, len(blocks))
			}
			e := newE2E(t, pgPassword)
			db := newDatabase(t, pg)
			db.exec(t, page.setup)
			slot := testenv.UniqueName(t, "slot")
			if page.slot != "" {
				// Slot names are the cluster's: the page's fixed one is dropped after the test
				// so that the next run (-count) starts the same way.
				slot = page.slot
				t.Cleanup(func() {
					_, _ = db.pool.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", slot)
				})
			}
			prefix := testenv.UniqueName(t, "docs")
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(bin, filepath.Join(dir, "bin", "outbox-relay")); err != nil {
				t.Fatal(err)
			}
			env := relayEnv("OUTBOX_PG_DSN="+db.dsn, "OUTBOX_KAFKA_BROKERS="+k.Brokers(),
				"OUTBOX_SLOT="+slot, "OUTBOX_PUBLICATION="+slot, "OUTBOX_TOPIC_TEMPLATE="+prefix+".{aggregate_type}",
				"OUTBOX_SHUTDOWN_TIMEOUT="+shutdownTimeout.String(),
				"PATH="+filepath.Join(dir, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))

			var relay *child
			for _, b := range blocks {
				name := fmt.Sprintf("%s:%d", page.file, b.line)
				switch {
				case b.lang == "sql":
					if _, err := db.pool.Exec(ctx, b.body); err != nil {
						t.Fatalf("%s: the SQL block fails: %v\n%s", name, err, b.body)
					}
				case b.background:
					if relay != nil {
						t.Fatalf("%s: a second background block while %s runs", name, relay.name)
					}
					relay = e.startCmd(name, env, "/bin/bash", "-c", "cd "+dir+" && exec "+b.body)
					waitSlotActive(t, db.pool, slot, relay)
					if page.canary != "" {
						db.exec(t, page.canary)
					}
				default:
					p := e.startCmd(name, env, "/bin/bash", "-e", "-c", "cd "+dir+"\n"+b.body)
					if code, ok := p.wait(time.Minute); !ok || code != 0 {
						t.Fatalf("%s: the block exits with status %d (exited: %v):\n%s\nstdout:\n%s\nstderr:\n%s", name, code, ok,
							b.body, lastLines(p.stdout.String(), 20), lastLines(p.stderr.String(), 20))
					}
				}
			}
			if relay == nil {
				t.Fatalf("%s marks no block runnable: background (the relay's start)", page.file)
			}
			recs := topicRecords(t, k.Brokers(), prefix+".order")
			if len(recs) != 1 || string(recs[0].Key) != page.key {
				t.Fatalf("%s: topic %s.order holds %d records (first key %q), want the page's event with key %q", page.file, prefix, len(recs), firstKey(recs), page.key)
			}
			stopRelay(t, relay)
		})
	}
}

// topicRecords waits until topic holds a record and returns what it holds.
func topicRecords(t *testing.T, brokers, topic string) []harness.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deliverTimeout)
	defer cancel()
	for {
		recs, err := harness.Reread(ctx, brokers, topic)
		if err == nil && len(recs) > 0 {
			return recs
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s holds no record after %s (last error: %v)", topic, deliverTimeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func firstKey(recs []harness.Record) string {
	if len(recs) == 0 {
		return ""
	}
	return string(recs[0].Key)
}
