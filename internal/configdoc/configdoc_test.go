package configdoc

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/config"
)

// TestTheConfigurationPageIsTheOneTheKeysGive: docs/configuration.md is what the generator writes
// from config.Keys(), so a key added, renamed or changed in the code without regenerating the page
// fails here, with the command that regenerates it.
func TestTheConfigurationPageIsTheOneTheKeysGive(t *testing.T) {
	page, err := os.ReadFile("../../" + Path)
	if err != nil {
		t.Fatalf("%v: run %s", err, Regenerate)
	}
	want := Render(config.Keys())
	if bytes.Equal(page, want) {
		return
	}
	got, wantLines := strings.Split(string(page), "\n"), strings.Split(string(want), "\n")
	line := 0
	for line < len(got) && line < len(wantLines) && got[line] == wantLines[line] {
		line++
	}
	// A table row of keys is long: show it from a little before the first difference.
	from := 0
	if line < len(got) && line < len(wantLines) {
		for from < len(got[line]) && from < len(wantLines[line]) && got[line][from] == wantLines[line][from] {
			from++
		}
		from = max(0, from-40)
	}
	at := func(lines []string) string {
		if line >= len(lines) {
			return "(end of page)"
		}
		l := lines[line][min(from, len(lines[line])):]
		if from > 0 {
			l = "..." + l
		}
		if len(l) > 160 {
			l = l[:160] + "..."
		}
		return l
	}
	t.Errorf("%s disagrees with config/keys.go from line %d:\n  page: %s\n  code: %s\nRegenerate it: %s",
		Path, line+1, at(got), at(wantLines), Regenerate)
}

// TestThePageListsEveryKeyWithItsFacts: each key's section gives its type, default, environment
// variable, flag, the commands that use it and its help.
func TestThePageListsEveryKeyWithItsFacts(t *testing.T) {
	keys := []config.Key{
		{Name: "kafka.linger", Group: config.GroupKafka, Type: "duration", Default: "15ms", Help: "how long a record waits", Commands: []string{"run", "replay"}},
		{Name: "pg_dsn", Group: config.GroupPostgres, Type: "string", Help: "connection string", Secret: true, Commands: []string{"run"}},
		{Name: "topic_regex", Group: config.GroupRouting, Type: "a|b", Help: "route", Commands: []string{"run"}},
		{Name: "delivery", Group: config.GroupDelivery, Type: "string", Help: "mode", Commands: []string{"run"}},
	}
	page := string(Render(keys))
	for _, want := range []string{
		"## PostgreSQL\n\n### pg_dsn\n",
		"| `duration` | `15ms` | `OUTBOX_KAFKA_LINGER` | `--kafka.linger` | `run`, `replay` |\n\nHow long a record waits.\n",
		"| `string` | (none) | `OUTBOX_PG_DSN` | `--pg-dsn` | `run` |\n\nConnection string (secret: never logged).\n",
		"| `a\\|b` |",
		"[`kafka.linger`](#kafkalinger)",
		"[Routing (event to record)](#routing-event-to-record)",
		"[Delivery](#delivery) | [`delivery`](#delivery-1)",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
	if strings.Index(page, "## PostgreSQL") > strings.Index(page, "## Kafka") {
		t.Errorf("groups are not in help's order (PostgreSQL before Kafka):\n%s", page)
	}
}

// TestAKeysFurtherReadingIsLinkedFromItsSection: a key whose help names the pages that explain it
// further (long operator guidance kept out of --help) links them after its help, a section by
// the anchor GitHub gives its heading, a page alone by its name.
func TestAKeysFurtherReadingIsLinkedFromItsSection(t *testing.T) {
	keys := []config.Key{
		{Name: "kafka.linger", Group: config.GroupKafka, Type: "duration", Default: "15ms", Help: "how long a record waits", Commands: []string{"run"},
			See: []string{"operations.md#Broker cost and latency: `kafka.linger`", "benchmarks.md"}},
		{Name: "kafka.batch_size", Group: config.GroupKafka, Type: "int", Help: "records per request", Commands: []string{"run"}},
	}
	page := string(Render(keys))
	for _, want := range []string{
		"How long a record waits. See [operations.md, \"Broker cost and latency: `kafka.linger`\"](operations.md#broker-cost-and-latency-kafkalinger), [benchmarks.md](benchmarks.md).\n",
		"Records per request.\n",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
}
