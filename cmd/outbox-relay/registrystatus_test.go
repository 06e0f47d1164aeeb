package main_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestARegistryThatDoesNotAnswerShowsInStatusAndInTheUpGaugeFromTheStart: `outbox-relay status`
// asks the registry an encoding needs and reports it (a problem line while it does not answer),
// and a relay started while it does not answer says so in outbox_relay_schema_registry_up before
// any event has needed a schema.
func TestARegistryThatDoesNotAnswerShowsInStatusAndInTheUpGaugeFromTheStart(t *testing.T) {
	t.Parallel()
	pg, k, reg := testenv.SharedPostgres(t), testenv.SharedKafka(t), testenv.SharedRegistry(t)
	e := newE2E(t, pgPassword)
	db := newDatabase(t, pg)
	slot := testenv.UniqueName(t, "slot")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String() // nothing listens there once closed
	l.Close()
	env := func(url string, kv ...string) []string {
		return relayEnv(append([]string{"OUTBOX_PG_DSN=" + db.dsn, "OUTBOX_KAFKA_BROKERS=" + k.Brokers(), "OUTBOX_SLOT=" + slot,
			"OUTBOX_VALUE_ENCODING=avro", "OUTBOX_SCHEMA_REGISTRY_URLS=" + url}, kv...)...)
	}

	for _, tt := range []struct {
		name, url string
		up        bool
	}{
		{"a registry that answers is up, with no problem of its own", reg.ConfluentURL(), true},
		{"a registry that does not answer is down, with a problem line naming it", down, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := e.relay("status", env(tt.url), "status", "--json")
			if _, ok := p.wait(30 * time.Second); !ok {
				t.Fatal("status did not end within 30s")
			}
			var rep struct {
				SchemaRegistry *struct {
					URLs  []string `json:"urls"`
					Up    bool     `json:"up"`
					Error string   `json:"error"`
				} `json:"schema_registry"`
				Problems []string `json:"problems"`
			}
			if err := json.Unmarshal([]byte(p.stdout.String()), &rep); err != nil {
				t.Fatalf("status --json: %v:\n%s\n%s", err, p.stdout.String(), p.stderr.String())
			}
			r := rep.SchemaRegistry
			if r == nil || r.Up != tt.up || len(r.URLs) != 1 || r.URLs[0] != tt.url || (r.Error == "") != tt.up {
				t.Fatalf("schema_registry = %+v, want up %v at %s (an error when down):\n%s", r, tt.up, tt.url, p.stdout.String())
			}
			problem := false
			for _, pr := range rep.Problems {
				problem = problem || strings.Contains(pr, "schema registry "+tt.url+" does not answer")
			}
			if problem == tt.up {
				t.Errorf("problems %q: want a line for the registry only when it is down", rep.Problems)
			}
		})
	}

	// A relay started while the registry does not answer: the gauge says so at once.
	e.mustRun("migrate", env(down), "migrate", "--publication="+slot)
	relay := e.relay("relay", env(down, "OUTBOX_METRICS_ADDR=127.0.0.1:0"), "run", "--publication="+slot)
	addr, _ := relay.waitLog(t, startTimeout, "info", "serving metrics")["addr"].(string)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), "\noutbox_relay_schema_registry_up 0\n") {
		t.Errorf("outbox_relay_schema_registry_up before any event, with the registry not answering: want 0 in\n%s", grepLines(string(body), "schema_registry"))
	}
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
