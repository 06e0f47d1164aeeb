package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestASlotCreationHeldUpByATransactionSaysWhatItWaitsFor: CREATE_REPLICATION_SLOT waits until
// every transaction holding a transaction id when it began has ended, a forgotten prepared
// transaction included, with nothing on the replication connection to say why. The relay must
// name the transaction within seconds (a WARN line with the backend's PID or the prepared
// transaction's gid, outbox_relay_slot_creation_wait_seconds, and `outbox-relay status`), and
// create the slot and stream once it ends.
func TestASlotCreationHeldUpByATransactionSaysWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	// A cluster of its own: the blocker holds up every slot creation on its cluster, and a
	// prepared transaction needs max_prepared_transactions.
	pg := testenv.Postgres(t, devenv.PostgresOptions{Settings: map[string]string{"max_prepared_transactions": "2"}})
	brokers := testenv.SharedKafka(t).Brokers()
	for _, tc := range []struct {
		name     string
		prepared bool
	}{
		{"an open transaction is named by its backend's PID", false},
		{"a forgotten prepared transaction is named by its gid", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			d := newDB(t, pg, 1)
			conf, err := pgx.ParseConfig(d.dsn)
			if err != nil {
				t.Fatal(err)
			}
			conf.RuntimeParams["application_name"] = "forgotten-writer"
			blocker, err := pgx.ConnectConfig(ctx, conf)
			if err != nil {
				t.Fatal(err)
			}
			defer blocker.Close(ctx)
			var pid int32
			if err := blocker.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			gid := testenv.UniqueName(t, "gid")
			for _, sql := range []string{"BEGIN", "SELECT pg_current_xact_id()"} {
				if _, err := blocker.Exec(ctx, sql); err != nil {
					t.Fatal(err)
				}
			}
			want := fmt.Sprintf("backend PID %d", pid)
			if tc.prepared {
				if _, err := blocker.Exec(ctx, "PREPARE TRANSACTION '"+gid+"'"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { d.outbox.Pool().Exec(context.Background(), "ROLLBACK PREPARED '"+gid+"'") })
				want = "prepared transaction '" + gid + "'"
			}

			r := d.startRelay(brokers)
			took, ok := r.waitLog(0, want, 30*time.Second)
			if !ok {
				t.Fatalf("the relay did not say within 30 s that the slot's creation waits for the %s:\n%s", want, r.Output())
			}
			t.Logf("named the blocker %s after the start", took.Round(time.Millisecond))
			if !strings.Contains(r.Output(), "creating the replication slot waits for") {
				t.Errorf("the line naming the blocker does not say what waits:\n%s", r.Output())
			}
			await.True(t, 10*time.Second, "outbox_relay_slot_creation_wait_seconds above 0", func() bool {
				return r.mustMetric("slot_creation_wait_seconds", "") > 0
			})

			code, out := relayproc.Run(t, relayproc.Options{Subcommand: "status", Args: []string{"--slot=" + d.slot, "--json"},
				Env: map[string]string{"OUTBOX_PG_DSN": d.dsn}}, time.Minute)
			var st struct {
				Waits *struct {
					PID int32  `json:"pid"`
					GID string `json:"gid"`
				} `json:"slot_creation_waits_for"`
				Problems []string `json:"problems"`
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatalf("status --json: exit %d, not JSON (%v):\n%s", code, err, out)
			}
			switch {
			case st.Waits == nil:
				t.Errorf("status --json does not say what the slot's creation waits for (exit %d):\n%s", code, out)
			case tc.prepared && (st.Waits.GID != gid || st.Waits.PID != 0):
				t.Errorf("status --json: the creation waits for %+v, want the prepared transaction %q", *st.Waits, gid)
			case !tc.prepared && st.Waits.PID != pid:
				t.Errorf("status --json: the creation waits for %+v, want backend PID %d", *st.Waits, pid)
			}
			if code != 3 || !strings.Contains(strings.Join(st.Problems, "\n"), want) {
				t.Errorf("status --json: exit %d, problems %q; want 3, and a problem naming the %s", code, st.Problems, want)
			}

			end := "COMMIT"
			if tc.prepared {
				end = "COMMIT PREPARED '" + gid + "'"
			}
			if _, err := blocker.Exec(ctx, end); err != nil {
				t.Fatal(err)
			}
			r.waitSessions(1, time.Minute)
			await.True(t, 10*time.Second, "outbox_relay_slot_creation_wait_seconds back to 0", func() bool {
				return r.mustMetric("slot_creation_wait_seconds", "") == 0
			})
		})
	}
}
