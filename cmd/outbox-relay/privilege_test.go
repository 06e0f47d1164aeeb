package main

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// relayRolePassword is the least-privilege role's password; no output may show it.
const relayRolePassword = "least-privilege-secret-7c1e"

// roleDSN is the fixture's database as role.
func (f *haFixture) roleDSN(t *testing.T, role string) string {
	t.Helper()
	u, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, relayRolePassword)
	return u.String()
}

// TestTheRelayRunsEndToEndUnderALeastPrivilegeRole pins what PostgreSQL 15 requires of the relay's
// role: LOGIN and REPLICATION, and a publication an administrator created (CREATE PUBLICATION ...
// FOR TABLE needs ownership of the table). SELECT on the outbox table is not needed to stream
// (pgoutput does not check table privileges; only a subscription's initial copy does), so both
// roles below work; the documented role has it for backfills and for operators reading the table.
func TestTheRelayRunsEndToEndUnderALeastPrivilegeRole(t *testing.T) {
	tests := []struct {
		name   string
		grants []string
	}{
		{"a role with REPLICATION and SELECT on the outbox table streams", []string{"GRANT SELECT ON public.outbox_events TO %s"}},
		{"a role with only REPLICATION streams too", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
			ctx := context.Background()
			role := testenv.UniqueName(t, "relay")
			ident := pgx.Identifier{role}.Sanitize()
			stmts := []string{
				"CREATE ROLE " + ident + " LOGIN REPLICATION PASSWORD '" + relayRolePassword + "'",
				"CREATE PUBLICATION " + pgx.Identifier{f.slot}.Sanitize() + " FOR TABLE public.outbox_events WITH (publish = 'insert')",
			}
			for _, g := range tt.grants {
				stmts = append(stmts, strings.ReplaceAll(g, "%s", ident))
			}
			for _, s := range stmts {
				if _, err := f.pool.Exec(ctx, s); err != nil {
					t.Fatalf("%s: %v", s, err)
				}
			}
			t.Cleanup(func() {
				// Roles are cluster-wide: drop it once its slot and sessions are gone.
				f.pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", f.slot)
				f.pool.Exec(context.Background(), "DROP OWNED BY "+ident)
				f.pool.Exec(context.Background(), "DROP ROLE "+ident)
			})

			r := f.start("relay-lp", map[string]string{
				"OUTBOX_PG_DSN":             withAppName(t, f.roleDSN(t, role), "relay-lp"),
				"OUTBOX_CREATE_PUBLICATION": "false",
			})
			f.waitStreamer(t, r, haStartTimeout)
			addr := r.metricsAddr(t)
			for i := range 10 {
				if err := f.outbox.WriteTx(ctx, harness.Spec{AggregateType: f.types[0], AggregateID: "a", EventType: "E" + string(rune('0'+i))}); err != nil {
					t.Fatal(err)
				}
			}
			f.verify(t, f.brokers)
			// The slot monitor and the leader lock work under the role too.
			await.True(t, 10*time.Second, "slot metrics under the role", func() bool {
				ms := scrape(t, addr)
				return ms["outbox_relay_postgres_up"] == 1 && ms["outbox_relay_slot_exists"] == 1 && ms["outbox_relay_leader"] == 1
			})
			code, out := relayproc.Run(t, relayproc.Options{Subcommand: "status", Env: map[string]string{
				"OUTBOX_PG_DSN": f.roleDSN(t, role), "OUTBOX_SLOT": f.slot, "GORACE": "atexit_sleep_ms=0",
			}}, 30*time.Second)
			if code != 0 || !strings.Contains(out, `application_name "relay-lp"`) {
				t.Errorf("status under the role: exit %d:\n%s", code, out)
			}
			r.stop(t)
			for _, o := range []string{r.Output(), out} {
				if strings.Contains(o, relayRolePassword) {
					t.Errorf("output reveals the role's password")
				}
			}
		})
	}
}

func TestARoleThatDoesNotOwnTheTableCannotCreateThePublicationAndIsToldHowToFixIt(t *testing.T) {
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 1)
	ctx := context.Background()
	role := testenv.UniqueName(t, "relay")
	ident := pgx.Identifier{role}.Sanitize()
	if _, err := f.pool.Exec(ctx, "CREATE ROLE "+ident+" LOGIN REPLICATION PASSWORD '"+relayRolePassword+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.pool.Exec(context.Background(), "DROP ROLE "+ident) })

	// PostgreSQL 15 checks CREATE on the database first, then ownership of the table.
	for _, step := range []struct {
		grant string
		want  string
	}{
		{"", "permission denied for database"},
		{"GRANT CREATE ON DATABASE " + pgx.Identifier{f.dbName}.Sanitize() + " TO " + ident, "must be owner of table outbox_events"},
	} {
		if step.grant != "" {
			if _, err := f.pool.Exec(ctx, step.grant); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.pool.Exec(context.Background(), "DROP OWNED BY "+ident) })
		}
		code, out := relayproc.Run(t, relayproc.Options{Env: f.env("relay-np", map[string]string{
			"OUTBOX_PG_DSN": f.roleDSN(t, role),
		})}, 60*time.Second)
		if code != 1 {
			t.Fatalf("exit status %d, want 1:\n%s", code, out)
		}
		last := out[strings.LastIndex(strings.TrimRight(out, "\n"), "\n")+1:]
		for _, want := range []string{"create publication", step.want, "create it as the table owner"} {
			if !strings.Contains(last, want) {
				t.Errorf("last line lacks %q: %s", want, last)
			}
		}
		if strings.Contains(out, relayRolePassword) {
			t.Error("output reveals the role's password")
		}
	}
}
