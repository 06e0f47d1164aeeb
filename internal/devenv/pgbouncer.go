package devenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrPgBouncerMissing means the pgbouncer binary is not installed.
var ErrPgBouncerMissing = errors.New("pgbouncer not installed: run scripts/ensure-tools.sh test (Debian: apt-get install pgbouncer)")

// PgBouncerOptions configures StartPgBouncer; zero values mean the defaults in the comments.
type PgBouncerOptions struct {
	Dir  string // instance directory; a fresh temp dir
	Port int    // listen port on 127.0.0.1; a free one
	// PoolMode is "session" (a client keeps one server connection until it disconnects) or
	// "transaction" (a client has a server connection only for one transaction); "session".
	PoolMode string
	Settings map[string]string // extra [pgbouncer] settings, override the defaults
}

// PgBouncer is a PgBouncer in front of one Postgres: pgbouncer.ini, the auth file and
// pgbouncer.log in its directory. It serves every database of that cluster for the superuser
// postgres, with the cluster's password (SCRAM both ways).
type PgBouncer struct {
	service
	port     int
	password string
	cred     *syscall.Credential
	ini      string
}

// pgbouncerBin finds the binary: on PATH, else where Debian installs it (/usr/sbin is not on a
// non-root user's PATH).
func pgbouncerBin() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrPgBouncerMissing
}

// StartPgBouncer writes a configuration pointing at target and starts PgBouncer, as the OS user
// postgres when we are root (PgBouncer refuses to run as root, like PostgreSQL).
func StartPgBouncer(ctx context.Context, target *Postgres, opts PgBouncerOptions) (*PgBouncer, error) {
	bin, err := pgbouncerBin()
	if err != nil {
		return nil, err
	}
	mode := cmp.Or(opts.PoolMode, "session")
	if mode != "session" && mode != "transaction" {
		return nil, fmt.Errorf("pgbouncer: pool mode %q: want session or transaction", mode)
	}
	cred, err := serviceUser()
	if err != nil {
		return nil, err
	}
	dir, err := newDir(opts.Dir, "outbox-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	port := opts.Port
	if port == 0 {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		port = ports[0]
	}
	b := &PgBouncer{port: port, password: target.st.Password, cred: cred, ini: filepath.Join(dir, "pgbouncer.ini"),
		service: service{name: "pgbouncer", dir: dir, pidFile: filepath.Join(dir, "pgbouncer.pid"), writePid: true}}
	b.needle = b.ini
	settings := map[string]string{
		"listen_addr":     "127.0.0.1",
		"listen_port":     strconv.Itoa(port),
		"unix_socket_dir": "",
		"auth_type":       "scram-sha-256",
		"auth_file":       filepath.Join(dir, "users.txt"),
		"pool_mode":       mode,
		"max_client_conn": "100",
		// Room for every client of a test at once: a client waiting for a server connection
		// would look like a slow server.
		"default_pool_size": "20",
		"admin_users":       "postgres",
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	var ini strings.Builder
	fmt.Fprintf(&ini, "[databases]\n* = host=127.0.0.1 port=%d\n\n[pgbouncer]\n", target.Port())
	for k, v := range settings {
		fmt.Fprintf(&ini, "%s = %s\n", k, v)
	}
	users := fmt.Sprintf("%q %q\n", "postgres", target.st.Password)
	if err := os.WriteFile(b.ini, []byte(ini.String()), 0o644); err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	if err := os.WriteFile(settings["auth_file"], []byte(users), 0o600); err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	if err := handOver(dir, cred); err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	err = b.start(ctx, spawnSpec{path: bin, args: []string{b.ini}, dir: dir, cred: cred, deathSig: syscall.SIGTERM},
		time.Minute, func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			conn, err := pgconn.Connect(ctx, b.DSN("postgres"))
			if err == nil {
				err = conn.Close(ctx)
			}
			return err
		})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

// Port returns the port PgBouncer listens on, on 127.0.0.1.
func (b *PgBouncer) Port() int { return b.port }

// DSN returns a URL for superuser postgres on database through PgBouncer.
func (b *PgBouncer) DSN(database string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", b.password),
		Host: "127.0.0.1:" + strconv.Itoa(b.port), Path: "/" + database, RawQuery: "sslmode=disable"}
	return u.String()
}

// Close stops PgBouncer (SIGTERM: at once, closing every connection) and removes its directory.
func (b *PgBouncer) Close(ctx context.Context) error {
	return b.close(func() error { return b.stop(ctx, syscall.SIGTERM, 10*time.Second) })
}
