package main

// The secure paths against real servers: a Kafka broker with TLS listeners (server authentication,
// mutual TLS, SASL_SSL with SCRAM) and SASL_PLAINTEXT, and a PostgreSQL that accepts TLS only
// (hostnossl ... reject), both with certificates this test makes, both started once and shared by
// the subtests, which run in parallel on databases, slots, topics and users of their own.

import (
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/netproxy"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testpki"
)

// Secrets of the secure tests; none may appear in any output.
const (
	scramUser          = "relay"
	scramPassword      = "scram-relay-secret-4f2a"
	scramWrongPassword = "scram-wrong-secret-9d3b"
	rotorUser          = "rotor"
	rotorPassword      = "scram-before-rotation-51c0"
	rotorNewPassword   = "scram-after-rotation-83ad"
	pgPassword         = "pg-before-rotation-2b77"
	pgNewPassword      = "pg-after-rotation-e4d1"
	// certRole logs in to PostgreSQL with a client certificate (its CN) and no password.
	certRole = "cert_relay"
	// fatalBound is how long a relay may take to give up on a certificate it does not trust: it
	// must end the start, not wait as if the server were down.
	fatalBound = 60 * time.Second
)

// secureEnv is the servers and certificates the subtests share.
type secureEnv struct {
	dir         string
	caFile      string // signed every server and client certificate
	otherCAFile string // signed nothing the servers use
	kafkaClient testpki.Files
	pgClient    testpki.Files
	k           *devenv.Kafka
	pg          *devenv.Postgres
	scramProxy  *netproxy.Proxy // in front of the SASL_SSL listener, which the broker advertises at it
	secrets     []string
}

func newSecureEnv(t *testing.T) *secureEnv {
	t.Helper()
	dir := t.TempDir()
	ca, other := testpki.NewCA(t, "outbox-relay test CA"), testpki.NewCA(t, "someone else's CA")
	e := &secureEnv{dir: dir, caFile: ca.WriteCA(t, dir, "ca"), otherCAFile: other.WriteCA(t, dir, "other-ca"),
		secrets: []string{scramPassword, scramWrongPassword, rotorPassword, rotorNewPassword, pgPassword, pgNewPassword}}
	server := ca.Localhost(t).Write(t, dir, "server")
	expired := ca.Issue(t, testpki.Leaf{CommonName: "127.0.0.1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}).Write(t, dir, "expired")
	e.kafkaClient = ca.Issue(t, testpki.Leaf{CommonName: "relay", Client: true}).Write(t, dir, "kafka-client")
	e.pgClient = ca.Issue(t, testpki.Leaf{CommonName: certRole, Client: true}).Write(t, dir, "pg-client")

	// The SASL_SSL listener sits behind a proxy the broker advertises, so the rotation test can cut
	// the relay's connections and count the new ones.
	scramPort := freePort(t)
	e.scramProxy = netproxy.New(t, "127.0.0.1:"+strconv.Itoa(scramPort))
	start := time.Now()
	e.k = testenv.Kafka(t, devenv.KafkaOptions{
		SCRAMUsers: map[string]string{scramUser: scramPassword, rotorUser: rotorPassword},
		TLSListeners: []devenv.KafkaTLSListener{
			{Name: "TLS", CertFile: server.Cert, KeyFile: server.Key},
			{Name: "MTLS", CertFile: server.Cert, KeyFile: server.Key, ClientCAFile: e.caFile},
			{Name: "SCRAM_TLS", CertFile: server.Cert, KeyFile: server.Key, SASL: true, Port: scramPort, Advertised: e.scramProxy.Addr},
			{Name: "EXPIRED", CertFile: expired.Cert, KeyFile: expired.Key},
		},
	})
	t.Logf("broker with TLS listeners started in %s", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	e.pg = testenv.Postgres(t, devenv.PostgresOptions{
		TLS: &devenv.PostgresTLS{CertFile: server.Cert, KeyFile: server.Key, CAFile: e.caFile},
		HBA: []string{
			"hostssl all " + certRole + " 127.0.0.1/32 cert",
			"hostssl all all 127.0.0.1/32 scram-sha-256",
			"hostnossl all all 0.0.0.0/0 reject",
		},
	})
	t.Logf("PostgreSQL with TLS only started in %s", time.Since(start).Round(time.Millisecond))
	return e
}

func freePort(t *testing.T) int {
	t.Helper()
	ports, err := devenv.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

// pgDSN is a verify-full URL to database as user, without a password, with extra parameters.
func (e *secureEnv) pgDSN(database, user, host, app string, extra ...string) string {
	q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {e.caFile}, "application_name": {app}}
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	u := url.URL{Scheme: "postgres", User: url.User(user), Host: host + ":" + strconv.Itoa(e.pg.Port()), Path: "/" + database, RawQuery: q.Encode()}
	return u.String()
}

// writeSecret replaces a secret file the way a Kubernetes Secret volume does: a new file renamed
// over the old, so a reader never sees half of it.
func writeSecret(t *testing.T, path, secret string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// writeEvents commits n single-event transactions over the fixture's aggregate types.
func writeEvents(t *testing.T, f *haFixture, n int, tag string) {
	t.Helper()
	for i := range n {
		spec := harness.Spec{AggregateType: f.types[i%len(f.types)], AggregateID: fmt.Sprintf("agg-%d", i%3),
			Headers: map[string]string{"tag": tag}}
		if err := f.outbox.WriteTx(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
	}
}

// logOnFailure shows, when t fails, r's output, what its metrics say it received and published,
// and where its walsender is: enough to tell a relay that never got the events from one that did
// not publish them, or a consumer that did not read them.
func logOnFailure(t *testing.T, f *haFixture, r *instance) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("%s output:\n%s", r.name, r.Output())
		if l := r.findLog("info", "serving metrics"); l != nil && !r.Exited() {
			addr, _ := l["addr"].(string)
			var lines []string
			for name, v := range scrape(t, addr) {
				for _, m := range []string{"received_lsn", "confirmed_lsn", "transactions_total", "events_published_total",
					"in_flight_events", "kafka_retries_total", "reconnects_total"} {
					if strings.HasPrefix(name, "outbox_relay_"+m) {
						lines = append(lines, fmt.Sprintf("%s %v", name, v))
					}
				}
			}
			t.Logf("%s metrics: %v", r.name, lines)
		}
		var state string
		err := f.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s sent %s write %s flush %s', state, sent_lsn, write_lsn, flush_lsn), '; '), 'no walsender')
			|| ', current ' || pg_current_wal_lsn()::text FROM pg_stat_replication WHERE application_name LIKE $1 || '%'`, r.name).Scan(&state)
		t.Logf("%s walsender: %s (%v)", r.name, state, err)
	})
}

// noSecrets fails when out shows any of the secure tests' secrets.
func (e *secureEnv) noSecrets(t *testing.T, what, out string) {
	t.Helper()
	for _, s := range append(e.secrets, devenvPGPassword) {
		if strings.Contains(out, s) {
			t.Errorf("%s reveals a secret:\n%s", what, out)
		}
	}
}

// encryptedBackends returns, for the relay's sessions (those whose application_name starts with
// app), how many there are, how many of them are walsenders, and which are not encrypted.
func encryptedBackends(t *testing.T, f *haFixture, app string) (total, walsenders int, plain []string) {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT a.backend_type, a.application_name, s.ssl, coalesce(s.client_dn, '')
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name LIKE $1 || '%'`, app)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var typ, name, dn string
		var ssl bool
		if err := rows.Scan(&typ, &name, &ssl, &dn); err != nil {
			t.Fatal(err)
		}
		total++
		if typ == "walsender" {
			walsenders++
		}
		if !ssl {
			plain = append(plain, typ+" "+name)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return total, walsenders, plain
}

// waitEncrypted waits until the relay named app has a walsender and another session, and
// requires every session of it to be encrypted.
func waitEncrypted(t *testing.T, f *haFixture, app string) {
	t.Helper()
	await.True(t, haStartTimeout, app+" has a walsender and an ordinary session", func() bool {
		total, walsenders, plain := encryptedBackends(t, f, app)
		if len(plain) > 0 {
			t.Fatalf("sessions without TLS: %v", plain)
		}
		return walsenders >= 1 && total > walsenders
	})
}

// rotateSCRAM sets user's SCRAM-SHA-512 password on the broker (through its PLAINTEXT listener),
// like kafka-configs.sh --alter --add-config 'SCRAM-SHA-512=[password=...]'.
func rotateSCRAM(t *testing.T, k *devenv.Kafka, user, password string) {
	t.Helper()
	salt := make([]byte, 32)
	_, _ = rand.Read(salt)
	const iterations = 4096
	salted, err := pbkdf2.Key(sha512.New, password, salt, iterations, sha512.Size)
	if err != nil {
		t.Fatal(err)
	}
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 30 * time.Second}
	res, err := client.AlterUserScramCredentials(context.Background(), &kafka.AlterUserScramCredentialsRequest{
		Upsertions: []kafka.UserScramCredentialsUpsertion{{Name: user, Mechanism: kafka.ScramMechanismSha512,
			Iterations: iterations, Salt: salt, SaltedPassword: salted}},
	})
	if err == nil {
		for _, r := range res.Results {
			if r.Error != nil {
				err = r.Error
			}
		}
	}
	if err != nil {
		t.Fatalf("rotate the SCRAM password of %s: %v", user, err)
	}
}

func TestTLSMutualTLSSASLSSLAndSecretFilesAgainstRealServers(t *testing.T) {
	e := newSecureEnv(t)

	t.Run("PostgreSQL verify-full and Kafka TLS verified against ca_file stream end to end, and a rotated PostgreSQL password file is read at the reconnect", func(t *testing.T) {
		t.Parallel()
		f := newHAFixture(t, e.pg, e.k.Brokers(), 2)
		ctx := context.Background()
		role := testenv.UniqueName(t, "relay")
		if _, err := f.pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN SUPERUSER PASSWORD '"+pgPassword+"'"); err != nil {
			t.Fatal(err)
		}
		pwFile := filepath.Join(t.TempDir(), "pg-password")
		writeSecret(t, pwFile, pgPassword)
		app := "relay-pg-tls"
		env := map[string]string{
			"OUTBOX_PG_DSN":            e.pgDSN(f.dbName, role, "127.0.0.1", app),
			"OUTBOX_PG_PASSWORD_FILE":  pwFile,
			"OUTBOX_KAFKA_BROKERS":     e.k.ListenerAddr("TLS"),
			"OUTBOX_KAFKA_TLS_ENABLED": "true",
			"OUTBOX_KAFKA_TLS_CA_FILE": e.caFile,
		}
		r := f.start(app, env)
		logOnFailure(t, f, r)
		f.waitStreamer(t, r, haStartTimeout)
		writeEvents(t, f, 20, "before")
		t.Logf("over TLS both ways: %s", f.verify(t, e.k.Brokers()))
		// Every session of the relay is encrypted: the replication connection and the ordinary
		// ones (leader lock, checks, slot monitor). pg_hba rejects plain text anyway, so a relay
		// that fell back to it would not be streaming at all.
		waitEncrypted(t, f, app)

		// `status` with the same settings: the password comes from the file and is shown nowhere.
		code, out := relayproc.Run(t, relayproc.Options{Subcommand: "status", Env: map[string]string{
			"OUTBOX_PG_DSN": env["OUTBOX_PG_DSN"], "OUTBOX_PG_PASSWORD_FILE": pwFile, "OUTBOX_SLOT": f.slot,
			"GORACE": "atexit_sleep_ms=0"}}, 30*time.Second)
		if code != 0 {
			t.Fatalf("status exit %d:\n%s", code, out)
		}
		e.noSecrets(t, "status", out)

		// Rotate: the role's password, then the file, then end every session of the relay. Each
		// connection it opens again must read the new password from the file; one that used the
		// password read at start would be refused, and the relay would exit. (Ending the lock
		// session fences the relay: what it had not confirmed yet is published again, as after a
		// crash.)
		if _, err := f.pool.Exec(ctx, "ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" PASSWORD '"+pgNewPassword+"'"); err != nil {
			t.Fatal(err)
		}
		writeSecret(t, pwFile, pgNewPassword)
		var ended int
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name LIKE $1 || '%' AND pg_terminate_backend(pid)`, app).Scan(&ended); err != nil {
			t.Fatal(err)
		}
		if ended < 2 {
			t.Fatalf("ended %d sessions of the relay, want its walsender and at least one more", ended)
		}
		writeEvents(t, f, 20, "after")
		f.waitStreamer(t, r, haStartTimeout)
		t.Logf("after the password rotation and %d ended sessions: %s", ended, f.verify(t, e.k.Brokers()))
		waitEncrypted(t, f, app)
		r.stop(t)
		e.noSecrets(t, "relay output", r.Output())
	})

	t.Run("mutual TLS to Kafka and a client certificate to PostgreSQL stream end to end", func(t *testing.T) {
		t.Parallel()
		f := newHAFixture(t, e.pg, e.k.Brokers(), 2)
		if _, err := f.pool.Exec(context.Background(), "CREATE ROLE "+certRole+" LOGIN SUPERUSER"); err != nil &&
			!strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
		app := "relay-mtls"
		r := f.start(app, map[string]string{
			"OUTBOX_PG_DSN":              e.pgDSN(f.dbName, certRole, "127.0.0.1", app, "sslcert", e.pgClient.Cert, "sslkey", e.pgClient.Key),
			"OUTBOX_KAFKA_BROKERS":       e.k.ListenerAddr("MTLS"),
			"OUTBOX_KAFKA_TLS_ENABLED":   "true",
			"OUTBOX_KAFKA_TLS_CA_FILE":   e.caFile,
			"OUTBOX_KAFKA_TLS_CERT_FILE": e.kafkaClient.Cert,
			"OUTBOX_KAFKA_TLS_KEY_FILE":  e.kafkaClient.Key,
		})
		logOnFailure(t, f, r)
		f.waitStreamer(t, r, haStartTimeout)
		writeEvents(t, f, 20, "mtls")
		t.Logf("with client certificates both ways: %s", f.verify(t, e.k.Brokers()))
		waitEncrypted(t, f, app)
		var dn string
		if err := f.pool.QueryRow(context.Background(), `SELECT s.client_dn FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
			WHERE a.backend_type = 'walsender' AND a.application_name LIKE $1 || '%'`, app).Scan(&dn); err != nil {
			t.Fatal(err)
		}
		if dn != "/CN="+certRole {
			t.Errorf("the walsender's client certificate is %q, want /CN=%s", dn, certRole)
		}
		r.stop(t)
	})

	t.Run("SASL_SSL with SCRAM from a password file goes on publishing after the password is rotated on the broker and in the file", func(t *testing.T) {
		t.Parallel()
		f := newHAFixture(t, e.pg, e.k.Brokers(), 2)
		pwFile := filepath.Join(t.TempDir(), "kafka-password")
		writeSecret(t, pwFile, rotorPassword)
		r := f.start("relay-scram-tls", map[string]string{
			"OUTBOX_KAFKA_BROKERS":            e.scramProxy.Addr,
			"OUTBOX_KAFKA_TLS_ENABLED":        "true",
			"OUTBOX_KAFKA_TLS_CA_FILE":        e.caFile,
			"OUTBOX_KAFKA_SASL_MECHANISM":     "SCRAM-SHA-512",
			"OUTBOX_KAFKA_SASL_USERNAME":      rotorUser,
			"OUTBOX_KAFKA_SASL_PASSWORD_FILE": pwFile,
		})
		logOnFailure(t, f, r)
		f.waitStreamer(t, r, haStartTimeout)
		writeEvents(t, f, 20, "before")
		t.Logf("through SASL_SSL: %s", f.verify(t, e.k.Brokers()))

		// Rotate the password on the broker and in the file. Open connections stay authenticated;
		// cutting them makes the relay connect, and so authenticate, again.
		rotateSCRAM(t, e.k, rotorUser, rotorNewPassword)
		writeSecret(t, pwFile, rotorNewPassword)
		before := e.scramProxy.Accepted()
		e.scramProxy.Cut()
		writeEvents(t, f, 20, "after")
		t.Logf("after the rotation: %s", f.verify(t, e.k.Brokers()))
		if reconnects := e.scramProxy.Accepted() - before; reconnects == 0 {
			t.Fatal("the relay published after the cut without a new connection: the test proved nothing")
		} else {
			t.Logf("%d new connections after the cut", reconnects)
		}
		r.stop(t)
		e.noSecrets(t, "relay output", r.Output())
	})

	sasl := func(password string) map[string]string {
		return map[string]string{
			"OUTBOX_KAFKA_BROKERS":        e.k.SASLBrokers(),
			"OUTBOX_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
			"OUTBOX_KAFKA_SASL_USERNAME":  scramUser,
			"OUTBOX_KAFKA_SASL_PASSWORD":  password,
		}
	}

	t.Run("SCRAM-SHA-512 over SASL_PLAINTEXT with the password in the environment streams end to end", func(t *testing.T) {
		t.Parallel()
		f := newHAFixture(t, e.pg, e.k.Brokers(), 2)
		r := f.start("relay-scram", sasl(scramPassword))
		logOnFailure(t, f, r)
		f.waitStreamer(t, r, haStartTimeout)
		writeEvents(t, f, 20, "scram")
		t.Logf("through SCRAM-SHA-512: %s", f.verify(t, e.k.Brokers()))
		r.stop(t)
		e.noSecrets(t, "relay output", r.Output())

		// redrive reaches Kafka as the relay does (sink.NewClient, sink.NewDialer): a dry run reads,
		// over SCRAM, a topic of ordinary records given as the dead-letter topic, and finds that
		// none names an original topic.
		topic := harness.TopicFor(f.outbox.Written()[0].AggregateType)
		want := 0
		for _, w := range f.outbox.Written() {
			if harness.TopicFor(w.AggregateType) == topic {
				want++
			}
		}
		env := sasl(scramPassword)
		env["OUTBOX_DEAD_LETTER_TOPIC"], env["GORACE"] = topic, "atexit_sleep_ms=0"
		started := time.Now()
		code, out := relayproc.Run(t, relayproc.Options{Subcommand: "redrive", Args: []string{"--dry-run"}, Env: env}, 30*time.Second)
		t.Logf("redrive --dry-run over SCRAM in %s: %s", time.Since(started).Round(time.Millisecond), strings.TrimSpace(out))
		m := regexp.MustCompile(`dry run: (\d+) dead letters read from ` + regexp.QuoteMeta(topic) + `: 0 would go back, 0 were redriven by an earlier run, (\d+) would fail`).FindStringSubmatch(out)
		if code != 3 || m == nil || m[1] != m[2] {
			t.Fatalf("redrive --dry-run over SCRAM: exit status %d, want 3 (every record fails), and the count of records read and failing:\n%s", code, out)
		}
		if n, _ := strconv.Atoi(m[1]); n < want {
			t.Errorf("redrive read %d records of %s over SCRAM, want at least the %d written to it", n, topic, want)
		}
		e.noSecrets(t, "redrive output", out)
	})

	t.Run("a wrong SCRAM password ends the start with one line naming kafka.sasl", func(t *testing.T) {
		t.Parallel()
		f := newHAFixture(t, e.pg, e.k.Brokers(), 1)
		code, out := relayproc.Run(t, relayproc.Options{Env: f.env("relay-wrong", sasl(scramWrongPassword))}, fatalBound)
		if code != 1 {
			t.Fatalf("exit status %d, want 1:\n%s", code, out)
		}
		last := out[strings.LastIndex(strings.TrimRight(out, "\n"), "\n")+1:]
		for _, want := range []string{"refused the relay's credentials", "kafka.sasl"} {
			if !strings.Contains(last, want) {
				t.Errorf("last line lacks %q: %s", want, last)
			}
		}
		e.noSecrets(t, "relay output", out)
		t.Logf("fatal line: %s", strings.TrimSpace(last))
	})

	// Each bad certificate ends the start with one line naming the problem and the key to fix,
	// rather than being retried for ever as if the server were down.
	fatal := []struct {
		name string
		env  func(f *haFixture) map[string]string
		want []string
	}{
		{"a broker certificate from another CA names kafka.tls.ca_file", func(f *haFixture) map[string]string {
			return map[string]string{"OUTBOX_KAFKA_BROKERS": e.k.ListenerAddr("TLS"), "OUTBOX_KAFKA_TLS_ENABLED": "true",
				"OUTBOX_KAFKA_TLS_CA_FILE": e.otherCAFile}
		}, []string{"the broker's certificate is signed by an authority the relay does not trust", "kafka.tls.ca_file"}},
		{"an expired broker certificate says it expired", func(f *haFixture) map[string]string {
			return map[string]string{"OUTBOX_KAFKA_BROKERS": e.k.ListenerAddr("EXPIRED"), "OUTBOX_KAFKA_TLS_ENABLED": "true",
				"OUTBOX_KAFKA_TLS_CA_FILE": e.caFile}
		}, []string{"the broker's certificate has expired", "renew it", "kafka.tls.ca_file"}},
		{"a broker reached by a name its certificate lacks names kafka_brokers", func(f *haFixture) map[string]string {
			_, port, _ := net.SplitHostPort(e.k.ListenerAddr("TLS"))
			return map[string]string{"OUTBOX_KAFKA_BROKERS": "localhost:" + port, "OUTBOX_KAFKA_TLS_ENABLED": "true",
				"OUTBOX_KAFKA_TLS_CA_FILE": e.caFile}
		}, []string{"not for the name the relay connected to", "localhost", "kafka_brokers"}},
		{"a broker that requires a client certificate names kafka.tls.cert_file", func(f *haFixture) map[string]string {
			return map[string]string{"OUTBOX_KAFKA_BROKERS": e.k.ListenerAddr("MTLS"), "OUTBOX_KAFKA_TLS_ENABLED": "true",
				"OUTBOX_KAFKA_TLS_CA_FILE": e.caFile}
		}, []string{"client certificate", "kafka.tls.cert_file"}},
		{"a PostgreSQL certificate from another CA names sslrootcert", func(f *haFixture) map[string]string {
			return map[string]string{"OUTBOX_PG_DSN": e.pgDSN(f.dbName, "postgres", "127.0.0.1", "relay-bad", "password", devenvPGPassword,
				"sslrootcert", e.otherCAFile)}
		}, []string{"PostgreSQL server's certificate is signed by an authority the relay does not trust", "sslrootcert in pg_dsn"}},
		{"a PostgreSQL certificate from another CA names sslrootcert without leader election too", func(f *haFixture) map[string]string {
			return map[string]string{"OUTBOX_PG_DSN": e.pgDSN(f.dbName, "postgres", "127.0.0.1", "relay-bad", "password", devenvPGPassword,
				"sslrootcert", e.otherCAFile), "OUTBOX_LEADER_ELECTION": "false"}
		}, []string{"PostgreSQL server's certificate is signed by an authority the relay does not trust", "sslrootcert in pg_dsn"}},
		{"a PostgreSQL server reached by a name its certificate lacks names the host", func(f *haFixture) map[string]string {
			return map[string]string{"OUTBOX_PG_DSN": e.pgDSN(f.dbName, "postgres", "localhost", "relay-bad", "password", devenvPGPassword)}
		}, []string{"not for the name the relay connected to", "the host in pg_dsn"}},
		{"PostgreSQL without TLS is refused and names sslmode", func(f *haFixture) map[string]string {
			return map[string]string{"OUTBOX_PG_DSN": e.pgDSN(f.dbName, "postgres", "127.0.0.1", "relay-bad", "password", devenvPGPassword,
				"sslmode", "disable")}
		}, []string{"no encryption", "sslmode=verify-full"}},
	}
	for _, tc := range fatal {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newHAFixture(t, e.pg, e.k.Brokers(), 1)
			start := time.Now()
			code, out := relayproc.Run(t, relayproc.Options{Env: f.env("relay-bad", tc.env(f))}, fatalBound)
			took := time.Since(start)
			if code != 1 {
				t.Fatalf("exit status %d after %s, want 1 (a certificate problem ends the start):\n%s", code, took, out)
			}
			last := out[strings.LastIndex(strings.TrimRight(out, "\n"), "\n")+1:]
			for _, w := range tc.want {
				if !strings.Contains(last, w) {
					t.Errorf("last line lacks %q: %s", w, last)
				}
			}
			for _, retry := range []string{"kafka unreachable", "standby cannot reach PostgreSQL", "replication interrupted"} {
				if strings.Contains(out, retry) {
					t.Errorf("the relay retried (%q) as if the server were down:\n%s", retry, out)
				}
			}
			e.noSecrets(t, "relay output", out)
			t.Logf("after %s: %s", took.Round(time.Millisecond), strings.TrimSpace(last))
		})
	}
}
