package devenv_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

func TestPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Settings: map[string]string{"wal_sender_timeout": "5s"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("postgres started in %v on port %d", time.Since(start), pg.Port())
	defer func() {
		if err := pg.Close(context.Background()); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(pg.Dir()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("dir %s not removed: %v", pg.Dir(), err)
		}
	}()

	if got := showSetting(ctx, t, pg.DSN("outbox"), "wal_level"); got != "logical" {
		t.Errorf("wal_level = %q, want logical", got)
	}
	if got := showSetting(ctx, t, pg.DSN("outbox"), "wal_sender_timeout"); got != "5s" {
		t.Errorf("wal_sender_timeout = %q, want 5s", got)
	}
	identifySystem(ctx, t, pg.DSN("outbox"))

	start = time.Now()
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("postgres restarted in %v", time.Since(start))
	identifySystem(ctx, t, pg.DSN("outbox"))

	dsn, err := pg.CreateDatabase(ctx, "second_db")
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "second_db", "CREATE TABLE t (id int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}

	// A crash loses nothing committed (synchronous_commit stays on) and recovery works.
	if err := pg.Kill(); err != nil {
		t.Fatal(err)
	}
	if pg.Running() {
		t.Fatal("still running after Kill")
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	conn := connect(ctx, t, dsn)
	res, err := conn.Exec(ctx, "SELECT count(*) FROM t").ReadAll()
	if err != nil || string(res[0].Rows[0][0]) != "1" {
		t.Fatalf("after crash: %v %v", res, err)
	}
	conn.Close(ctx)

	// Another process (make down) finds the cluster through its directory.
	att, err := devenv.AttachPostgres(pg.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if !att.Running() || att.DSN("x") != pg.DSN("x") {
		t.Fatalf("attach: running=%v dsn=%s", att.Running(), att.DSN("x"))
	}
	if err := att.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if pg.Running() {
		t.Fatal("running after Stop through AttachPostgres")
	}
}

func connect(ctx context.Context, t *testing.T, dsn string) *pgconn.PgConn {
	t.Helper()
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func showSetting(ctx context.Context, t *testing.T, dsn, name string) string {
	t.Helper()
	conn := connect(ctx, t, dsn)
	defer conn.Close(ctx)
	res, err := conn.Exec(ctx, "SHOW "+name).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return string(res[0].Rows[0][0])
}

func identifySystem(ctx context.Context, t *testing.T, dsn string) {
	t.Helper()
	conn := connect(ctx, t, dsn+"&replication=database")
	defer conn.Close(ctx)
	res, err := conn.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if row := res[0].Rows[0]; len(row) < 4 || len(row[0]) == 0 || string(row[3]) != "outbox" {
		t.Fatalf("IDENTIFY_SYSTEM row = %q", row)
	}
}

func TestKafka(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	k, err := devenv.StartKafka(ctx, devenv.KafkaOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kafka started in %v at %s", time.Since(start), k.Brokers())
	defer func() {
		if err := k.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()

	const topic = "devenv_test"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	produce(ctx, t, k, topic, "one")
	// JoinGroupBackoff: kafka-go waits 5s by default after the first FindCoordinator fails
	// while __consumer_offsets is being created.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{k.Brokers()}, Topic: topic,
		GroupID: "devenv_test", StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond, JoinGroupBackoff: 100 * time.Millisecond})
	defer r.Close()
	expect(ctx, t, r, "one")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	if err := k.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kafka stopped in %v", time.Since(start))
	if k.Running() {
		t.Fatal("running after Stop")
	}
	start = time.Now()
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kafka restarted in %v", time.Since(start))
	produce(ctx, t, k, topic, "two")
	// The group's committed offset survived the restart: the next message is "two".
	r2 := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{k.Brokers()}, Topic: topic,
		GroupID: "devenv_test", StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond, JoinGroupBackoff: 100 * time.Millisecond})
	defer r2.Close()
	expect(ctx, t, r2, "two")

	// Paused: TCP connects, but no answer.
	if err := k.Pause(); err != nil {
		t.Fatal(err)
	}
	conn, err := kafka.DialContext(ctx, "tcp", k.Brokers())
	if err == nil {
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		_, err = conn.ReadPartitions(topic)
		conn.Close()
	}
	if err == nil {
		t.Error("paused broker answered metadata")
	}
	if err := k.Resume(); err != nil {
		t.Fatal(err)
	}
	produce(ctx, t, k, topic, "three")
	expect(ctx, t, r2, "three")
}

func produce(ctx context.Context, t *testing.T, k *devenv.Kafka, topic, value string) {
	t.Helper()
	// Right after a restart the partition may have no leader yet; kafka-go hands that back
	// without retrying, so try again for a minute.
	await.NoError(t, time.Minute, "produce "+value, func() error {
		w := &kafka.Writer{Addr: kafka.TCP(k.Brokers()), Topic: topic, RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond}
		defer w.Close()
		return w.WriteMessages(ctx, kafka.Message{Key: []byte("k"), Value: []byte(value)})
	})
}

func expect(ctx context.Context, t *testing.T, r *kafka.Reader, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// Right after a (re)start the group coordinator may still be loading __consumer_offsets:
	// kafka-go hands that retriable error (GROUP_LOAD_IN_PROGRESS) to the caller.
	var m kafka.Message
	var err error
	for {
		m, err = r.ReadMessage(ctx)
		var kerr kafka.Error
		if !errors.As(err, &kerr) || !kerr.Temporary() {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("consume %s: %v", want, err)
	}
	if string(m.Value) != want {
		t.Fatalf("consumed %q, want %q", m.Value, want)
	}
}
