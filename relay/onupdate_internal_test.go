package relay

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// The on_update check connects like every other connection of the relay: with pg_password_file,
// the DSN holds no password, and a check that used the DSN alone could not log in and so never
// said that on_update does nothing.
func TestTheOnUpdateCheckLogsInWithThePasswordFile(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	pub := testenv.UniqueName(t, "pub")
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE outbox_events WITH (publish = 'insert')"); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	u.User = url.User(u.User.Username())
	file := filepath.Join(t.TempDir(), "pg-password")
	if err := os.WriteFile(file, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	r := newWAL(t, Config{
		Replication: replication.Config{DSN: u.String(), PasswordFile: file, Publication: pub},
		Sink:        sink.Config{Brokers: []string{"127.0.0.1:1"}},
		OnUpdate:    "error",
	}, zap.New(core), metrics.New(nil))
	defer r.sink.Close(ctx)
	r.checkUpdatesPublished(ctx)
	if logs.FilterMessageSnippet("on_update has no effect").Len() != 1 {
		t.Fatalf("no warning that on_update has no effect with a publication of inserts only; logs: %v", logs.All())
	}
}
