// Package testenv gives tests real PostgreSQL clusters, Kafka brokers and schema registries
// (internal/devenv):
// dedicated ones closed by t.Cleanup, or one shared instance of each per test binary, closed by
// Main. Instances live in $TMPDIR/outbox-testenv-<pid>-<kind>-*; their servers get a
// parent-death signal, and Main removes what dead test binaries left behind.
package testenv

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/testpki"
	"github.com/outbox-relay/outbox-relay/migrations"
)

const dirPrefix = "outbox-testenv-"

var (
	mainCalled  atomic.Bool
	sharedPG    sharedByVersion
	sharedKafka shared[*devenv.Kafka]
	sharedReg   shared[*devenv.Registry]
)

// sharedByVersion is the test binary's shared cluster of each major version asked for.
type sharedByVersion struct {
	mu       sync.Mutex
	clusters map[string]*shared[*devenv.Postgres]
}

func (s *sharedByVersion) of(version string) *shared[*devenv.Postgres] {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.clusters == nil {
		s.clusters = map[string]*shared[*devenv.Postgres]{}
	}
	if s.clusters[version] == nil {
		s.clusters[version] = &shared[*devenv.Postgres]{}
	}
	return s.clusters[version]
}

func (s *sharedByVersion) close() {
	s.mu.Lock()
	all := slices.Collect(maps.Values(s.clusters))
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range all {
		wg.Go(c.close)
	}
	wg.Wait()
}

// Main runs the tests and then stops the shared instances, also on SIGINT/SIGTERM. Use it as
// func TestMain(m *testing.M) { testenv.Main(m) }.
func Main(m *testing.M) {
	cleanupStale()
	mainCalled.Store(true)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		fmt.Fprintf(os.Stderr, "testenv: %v: stopping shared services\n", <-sig)
		closeShared()
		os.Exit(1)
	}()
	// A panicking test kills the binary without running this defer; the parent-death signal
	// and the next run's cleanupStale cover that.
	code := func() int {
		defer closeShared()
		return m.Run()
	}()
	os.Exit(code)
}

// PGVersionEnv chooses the PostgreSQL major version of the clusters tests get when they do not
// ask for one (OUTBOX_PG_VERSION=15 go test ./...); the newest supported version when unset.
const PGVersionEnv = "OUTBOX_PG_VERSION"

// PGVersion returns the major version that Postgres and SharedPostgres start unless told
// otherwise: $OUTBOX_PG_VERSION, else devenv.NewestPGVersion.
func PGVersion() (string, error) {
	v := os.Getenv(PGVersionEnv)
	if v == "" {
		return devenv.NewestPGVersion, nil
	}
	if !slices.Contains(devenv.PGVersions(), v) {
		return "", fmt.Errorf("%s=%q: want one of %s", PGVersionEnv, v, strings.Join(devenv.PGVersions(), ", "))
	}
	return v, nil
}

// MatrixVersions returns the supported major versions other than PGVersion, oldest first: the
// version matrix runs its scenarios on these, the rest of the suite covers PGVersion.
func MatrixVersions(t testing.TB) []string {
	t.Helper()
	v, err := PGVersion()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return slices.DeleteFunc(devenv.PGVersions(), func(m string) bool { return m == v })
}

// Postgres starts a dedicated cluster for t, closed at t's cleanup. opts (at most one) may set
// anything but Dir; without Version or BinDir the cluster runs PGVersion.
func Postgres(t testing.TB, opts ...devenv.PostgresOptions) *devenv.Postgres {
	t.Helper()
	return dedicated(t, "pg", func(ctx context.Context, dir string) (*devenv.Postgres, error) {
		o := first(opts)
		o.Dir = dir
		if o.Version == "" && o.BinDir == "" {
			v, err := PGVersion()
			if err != nil {
				return nil, err
			}
			o.Version = v
		}
		return devenv.StartPostgres(ctx, o)
	})
}

// Standby starts a physical standby of primary for t (devenv.StartStandby: primary restarts once
// for the copy), closed at t's cleanup. opts (at most one) may set Port and Settings.
func Standby(t testing.TB, primary *devenv.Postgres, opts ...devenv.PostgresOptions) *devenv.Postgres {
	t.Helper()
	return dedicated(t, "pg", func(ctx context.Context, dir string) (*devenv.Postgres, error) {
		o := first(opts)
		o.Dir = dir
		return devenv.StartStandby(ctx, primary, o)
	})
}

// StandbyOnline starts a physical standby of primary for t from an online base backup, as
// pg_basebackup takes one (devenv.StartStandbyOnline: primary goes on serving), closed at t's
// cleanup. opts (at most one) may set Port and Settings, which must name as primary_slot_name a
// physical slot on primary made with its WAL reserved.
func StandbyOnline(t testing.TB, primary *devenv.Postgres, opts ...devenv.PostgresOptions) *devenv.Postgres {
	t.Helper()
	return dedicated(t, "pg", func(ctx context.Context, dir string) (*devenv.Postgres, error) {
		o := first(opts)
		o.Dir = dir
		return devenv.StartStandbyOnline(ctx, primary, o)
	})
}

// Kafka starts a dedicated broker for t, closed at t's cleanup. opts (at most one) may set
// anything but Dir.
func Kafka(t testing.TB, opts ...devenv.KafkaOptions) *devenv.Kafka {
	t.Helper()
	o := first(opts)
	requireKafkaLib(t, o.Lib)
	return dedicated(t, "kafka", func(ctx context.Context, dir string) (*devenv.Kafka, error) {
		o.Dir = dir
		return devenv.StartKafka(ctx, o)
	})
}

// KafkaBroker adds a dedicated broker-only node to k's cluster (devenv.Kafka.StartBroker) for t,
// closed at t's cleanup: before k when k is t's too (cleanups run last in, first out), as a
// broker's controlled shutdown needs k's controller. opts (at most one) may set anything but Dir.
func KafkaBroker(t testing.TB, k *devenv.Kafka, opts ...devenv.KafkaOptions) *devenv.Kafka {
	t.Helper()
	o := first(opts)
	return dedicated(t, "kafka", func(ctx context.Context, dir string) (*devenv.Kafka, error) {
		o.Dir = dir
		return k.StartBroker(ctx, o)
	})
}

// PgBouncer starts a dedicated PgBouncer in front of pg for t, closed at t's cleanup. opts (at
// most one) may set anything but Dir.
func PgBouncer(t testing.TB, pg *devenv.Postgres, opts ...devenv.PgBouncerOptions) *devenv.PgBouncer {
	t.Helper()
	return dedicated(t, "pgbouncer", func(ctx context.Context, dir string) (*devenv.PgBouncer, error) {
		o := first(opts)
		o.Dir = dir
		return devenv.StartPgBouncer(ctx, pg, o)
	})
}

// SharedPostgres returns the test binary's cluster of PGVersion, started on first use. Tests
// must not stop it; UniqueName keeps their databases and slots apart.
func SharedPostgres(t testing.TB) *devenv.Postgres {
	t.Helper()
	v, err := PGVersion()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return SharedPostgresVersion(t, v)
}

// SharedPostgresVersion returns the test binary's cluster of major version version ("14"),
// started on first use; the version matrix's tests in one binary share it. Tests must not stop
// it.
func SharedPostgresVersion(t testing.TB, version string) *devenv.Postgres {
	t.Helper()
	return sharedPG.of(version).get(t, "pg", func(ctx context.Context, dir string) (*devenv.Postgres, error) {
		return devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: dir, Version: version})
	})
}

// SharedKafka returns the test binary's broker, started on first use. Tests must not stop or
// pause it; UniqueName keeps their topics and groups apart.
func SharedKafka(t testing.TB) *devenv.Kafka {
	t.Helper()
	requireKafkaLib(t, "")
	return sharedKafka.get(t, "kafka", func(ctx context.Context, dir string) (*devenv.Kafka, error) {
		return devenv.StartKafka(ctx, devenv.KafkaOptions{Dir: dir})
	})
}

// Registry starts a dedicated schema registry for t, closed at t's cleanup: for a test that stops,
// pauses or restarts it. opts (at most one) may set anything but Dir.
func Registry(t testing.TB, opts ...devenv.RegistryOptions) *devenv.Registry {
	t.Helper()
	o := first(opts)
	requireRegistryLib(t, o.Lib)
	return dedicated(t, "registry", func(ctx context.Context, dir string) (*devenv.Registry, error) {
		o.Dir = dir
		return devenv.StartRegistry(ctx, o)
	})
}

// SharedRegistry returns the test binary's schema registry, started on first use, with an HTTPS
// port (TLSURL) beside the HTTP one, its certificate signed by the CA in TLSCAFile. Tests must
// not stop or pause it; UniqueName keeps their subjects apart. Its compatibility rule is NONE
// unless a test sets one for its subject (SetCompatibility).
func SharedRegistry(t testing.TB) *devenv.Registry {
	t.Helper()
	requireRegistryLib(t, "")
	return sharedReg.get(t, "registry", func(ctx context.Context, dir string) (*devenv.Registry, error) {
		ca := testpki.NewCA(t, "outbox-relay test registry CA")
		pair := ca.Localhost(t).Write(t, dir, "registry")
		return devenv.StartRegistry(ctx, devenv.RegistryOptions{Dir: dir,
			TLSCertFile: pair.Cert, TLSKeyFile: pair.Key, TLSCAFile: ca.WriteCA(t, dir, "registry-ca")})
	})
}

var nonName = regexp.MustCompile(`[^a-z0-9]+`)

// UniqueName returns "<prefix>_<test name>_<random>" reduced to [a-z0-9_], starting with a
// letter, at most 60 characters: valid for databases, slots, publications, topics and groups.
func UniqueName(t testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.Trim(nonName.ReplaceAllString(strings.ToLower(prefix+"_"+t.Name()), "_"), "_")
	if name == "" || name[0] < 'a' || name[0] > 'z' {
		name = "t_" + name
	}
	return strings.TrimRight(name[:min(len(name), 51)], "_") + "_" + hex.EncodeToString(b[:])
}

type instance interface {
	Close(context.Context) error
	Logs() string
}

type startFunc[T instance] func(ctx context.Context, dir string) (T, error)

// startIn starts an instance in a fresh directory named for cleanupStale.
func startIn[T instance](kind string, start startFunc[T]) (T, error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-%s-", dirPrefix, os.Getpid(), kind))
	if err != nil {
		var zero T
		return zero, err
	}
	// A broker starts in ~10 s on a quiet machine; on a loaded one (go test runs packages in
	// parallel, each with its own servers) it was seen to take over 2 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	return start(ctx, dir)
}

func dedicated[T instance](t testing.TB, kind string, start startFunc[T]) T {
	t.Helper()
	v, err := startIn(kind, start)
	if err != nil {
		t.Fatalf("testenv: start %s: %v", kind, err)
	}
	closeAtCleanup(t, kind, v)
	return v
}

func closeAtCleanup[T instance](t testing.TB, kind string, v T) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testenv: tail of %s:\n%s", v.Logs(), devenv.LogTail(v.Logs(), 40))
		}
		if err := closeWithTimeout(v); err != nil {
			t.Errorf("testenv: close %s: %v", kind, err)
		}
	})
}

// shared is one lazily started instance per test binary; a failed start is remembered so every
// test that needs it fails the same way.
type shared[T instance] struct {
	mu      sync.Mutex
	started bool
	v       T
	err     error
}

func (s *shared[T]) get(t testing.TB, kind string, start startFunc[T]) T {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatalf("testenv: shared %s needs a TestMain that calls testenv.Main(m)", kind)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.v, s.err = startIn(kind, start)
		s.started = true
	}
	if s.err != nil {
		t.Fatalf("testenv: shared %s: %v", kind, s.err)
	}
	return s.v
}

func (s *shared[T]) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started && s.err == nil {
		if err := closeWithTimeout(s.v); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: close: %v\n", err)
		}
	}
	s.started, s.err = true, fmt.Errorf("already closed")
}

func closeShared() {
	var wg sync.WaitGroup
	wg.Go(sharedPG.close)
	wg.Go(sharedKafka.close)
	wg.Go(sharedReg.close)
	wg.Wait()
}

func closeWithTimeout(v instance) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return v.Close(ctx)
}

// requireKafkaLib fails, never skips: a missing broker must not turn Kafka tests green.
func requireKafkaLib(t testing.TB, lib string) {
	t.Helper()
	if err := devenv.KafkaLibReady(cmp.Or(lib, devenv.DefaultKafkaLib())); err != nil {
		t.Fatal(err)
	}
}

// requireRegistryLib fails, never skips: a missing registry must not turn registry tests green.
func requireRegistryLib(t testing.TB, lib string) {
	t.Helper()
	if err := devenv.RegistryLibReady(cmp.Or(lib, devenv.DefaultRegistryLib())); err != nil {
		t.Fatal(err)
	}
}

// cleanupStale stops the servers and removes the directories of test binaries that died
// (go test -timeout, a panic, SIGKILL).
func cleanupStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		parts := strings.SplitN(strings.TrimPrefix(filepath.Base(dir), dirPrefix), "-", 3)
		pid, err := strconv.Atoi(parts[0])
		if err != nil || len(parts) != 3 || pid == os.Getpid() || devenv.PIDAlive(pid) {
			continue
		}
		if pg, err := devenv.AttachPostgres(dir); err == nil && parts[1] == "pg" {
			_ = pg.Kill()
			_ = pg.Close(context.Background()) // also removes a socket dir outside dir
		}
		if k, err := devenv.AttachKafka(dir); err == nil && parts[1] == "kafka" {
			_ = k.Kill()
		}
		if r, err := devenv.AttachRegistry(dir); err == nil && parts[1] == "registry" {
			_ = r.Kill()
		}
		_ = os.RemoveAll(dir)
	}
}

func first[T any](opts []T) T {
	var zero T
	if len(opts) > 0 {
		return opts[0]
	}
	return zero
}

// OutboxDatabase creates a database with a unique name on pg, with the relay's migrations applied
// (the outbox table public.outbox_events and the slot ledger), and returns its DSN.
func OutboxDatabase(t testing.TB, pg *devenv.Postgres) string {
	t.Helper()
	return outboxDatabase(t, pg, false)
}

// MessagesDatabase is OutboxDatabase for an outbox of logical decoding messages only: the relay's
// slot ledger, and no outbox table.
func MessagesDatabase(t testing.TB, pg *devenv.Postgres) string {
	t.Helper()
	return outboxDatabase(t, pg, true)
}

func outboxDatabase(t testing.TB, pg *devenv.Postgres, noTable bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := UniqueName(t, "db")
	dsn, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	// The test's slots go with it (registered first, so it runs after the test's own cleanups have
	// stopped its relays): a package's shared cluster has room for a limited number.
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = pg.Exec(cctx, "postgres", fmt.Sprintf("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '%s' AND NOT active",
			strings.ReplaceAll(name, "'", "''")))
	})
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("testenv: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := migrations.Apply(ctx, conn, migrations.Target{Schema: "public", Table: "outbox_events", NoTable: noTable}); err != nil {
		t.Fatalf("testenv: migrate: %v", err)
	}
	return dsn
}

// SplitPassword returns a URL DSN without its password, and the password: a DSN given to the
// relay as a flag must hold none (the relay warns that ps shows it), so a test gives the password
// as PGPASSWORD.
func SplitPassword(t testing.TB, dsn string) (string, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		t.Fatalf("SplitPassword: %q is not a URL DSN with a user: %v", dsn, err)
	}
	password, _ := u.User.Password()
	u.User = url.User(u.User.Username())
	return u.String(), password
}
