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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PostgresOptions configures StartPostgres; zero values mean the defaults in the comments.
type PostgresOptions struct {
	Dir      string            // instance directory; a fresh temp dir
	Port     int               // TCP port on 127.0.0.1; a free one
	Password string            // of superuser postgres; "outbox-test-secret"
	Database string            // created at start; "outbox"
	WALLevel string            // "logical"
	Settings map[string]string // extra postgresql.conf settings, e.g. wal_sender_timeout
	BinDir   string            // server binaries; by Version, else found on PATH or in /usr/lib/postgresql/*/bin
	Version  string            // major version ("14" to "18") when BinDir is empty: see PGBinDir
	Keep     bool              // Close stops but keeps the directory
	Detached bool              // the server outlives this process (make up)
	// TLS turns ssl on with these files; DSN then asks for TLS (sslmode=require).
	TLS *PostgresTLS
	// HBA, when set, replaces the TCP lines of pg_hba.conf (by default password logins from
	// 127.0.0.1, with or without TLS); the Unix socket stays trusted for the superuser's tools.
	HBA []string
}

// PostgresTLS is the server side of TLS: PEM files, copied into the data directory (server.crt,
// server.key with mode 0600, root.crt) and handed to the server's OS user, as PostgreSQL insists.
type PostgresTLS struct {
	CertFile, KeyFile string
	// CAFile, when set, is ssl_ca_file: the CAs client certificates must chain to (needed by
	// pg_hba's cert method and clientcert=verify-full).
	CAFile string
}

// Postgres is a throwaway cluster: data in <dir>/data, log in <dir>/postgres.log.
type Postgres struct {
	service
	st   pgState
	cred *syscall.Credential
}

// pgState is persisted in <dir>/devenv.json for AttachPostgres.
type pgState struct {
	Port      int    `json:"port"`
	Password  string `json:"password"`
	Database  string `json:"database"`
	SocketDir string `json:"socket_dir"`
	BinDir    string `json:"bin_dir"`
	TLS       bool   `json:"tls,omitempty"`
}

// StartPostgres creates a new cluster and starts it.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	binDir := opts.BinDir
	if binDir == "" && opts.Version != "" {
		d, err := PGBinDir(opts.Version)
		if err != nil {
			return nil, err
		}
		binDir = d
	}
	bin, err := findPGBin(binDir)
	if err != nil {
		return nil, err
	}
	cred, err := serviceUser()
	if err != nil {
		return nil, err
	}
	dir, err := newDir(opts.Dir, "outbox-pg-")
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	p := newPostgres(dir, pgState{Port: opts.Port, BinDir: bin, SocketDir: dir,
		Password: cmp.Or(opts.Password, "outbox-test-secret"), Database: cmp.Or(opts.Database, "outbox"), TLS: opts.TLS != nil}, cred)
	p.detached, p.keep = opts.Detached, opts.Keep
	if err := p.create(ctx, cmp.Or(opts.WALLevel, "logical"), opts); err != nil {
		if !opts.Keep {
			_ = p.Close(context.Background())
		}
		return nil, err
	}
	return p, nil
}

// AttachPostgres opens a cluster created earlier, maybe by another process (make down). Its
// Start runs detached; its Close removes the directory.
func AttachPostgres(dir string) (*Postgres, error) {
	var st pgState
	dir, err := readState(dir, &st)
	if err != nil {
		return nil, err
	}
	cred, err := serviceUser()
	if err != nil {
		return nil, err
	}
	p := newPostgres(dir, st, cred)
	p.detached = true
	return p, nil
}

func newPostgres(dir string, st pgState, cred *syscall.Credential) *Postgres {
	data := filepath.Join(dir, "data")
	return &Postgres{st: st, cred: cred, service: service{name: "postgres", dir: dir,
		pidFile: filepath.Join(data, "postmaster.pid"), needle: data}}
}

// claimAddress picks the cluster's port (when not set) and socket directory and records them in
// its state file, before the cluster's files are made.
func (p *Postgres) claimAddress() error {
	if p.st.Port == 0 {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		p.st.Port = ports[0]
	}
	// Unix socket paths are limited to 107 bytes: deep temp dirs need a short socket dir.
	if len(p.dir)+len("/.s.PGSQL.65535.lock") > 100 {
		var err error
		if p.st.SocketDir, err = os.MkdirTemp("/tmp", "opgs"); err != nil {
			return fmt.Errorf("postgres socket dir: %w", err)
		}
	}
	if err := writeState(p.dir, p.st); err != nil {
		return fmt.Errorf("postgres state: %w", err)
	}
	return nil
}

func (p *Postgres) create(ctx context.Context, walLevel string, opts PostgresOptions) error {
	if err := p.claimAddress(); err != nil {
		return err
	}
	pwFile := filepath.Join(p.dir, ".pwfile")
	if err := os.WriteFile(pwFile, []byte(p.st.Password+"\n"), 0o600); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer os.Remove(pwFile)
	if err := errors.Join(handOver(p.dir, p.cred), handOver(p.st.SocketDir, p.cred)); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	data := filepath.Join(p.dir, "data")
	err := run(ctx, p.dir, p.cred, filepath.Join(p.st.BinDir, "initdb"), "-D", data, "-U", "postgres",
		"--pwfile="+pwFile, "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
		"--no-sync", "--no-instructions")
	if err != nil {
		return fmt.Errorf("postgres initdb: %w", err)
	}
	conf, err := renderSettings(map[string]string{
		"port":                    strconv.Itoa(p.st.Port),
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": p.st.SocketDir,
		"wal_level":               walLevel,
		// A test package's shared cluster holds the slots of every test that ran in it (few drop
		// theirs): 40 was exhausted once the cmd package grew past it.
		"max_wal_senders":       "40",
		"max_replication_slots": "100",
		"fsync":                 "off", // throwaway data: speed over crash safety of the files...
		"full_page_writes":      "off",
		"synchronous_commit":    "on", // ...but the commit semantics the relay relies on stay
	}, withTLS(opts), func(k, v string) string { return fmt.Sprintf("%s = '%s'", k, strings.ReplaceAll(v, "'", "''")) })
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	// Appending to and rewriting initdb's files keeps their owner (postgres).
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString("\n# outbox-relay devenv\n" + conf)
		err = errors.Join(err, f.Close())
	}
	hba := opts.HBA
	if hba == nil {
		hba = []string{"host all all 127.0.0.1/32 scram-sha-256", "host replication all 127.0.0.1/32 scram-sha-256"}
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte("local all all trust\n"+
			"local replication all trust\n"+strings.Join(hba, "\n")+"\n"), 0o600)
	}
	if err == nil && opts.TLS != nil {
		err = p.installTLS(data, *opts.TLS)
	}
	if err != nil {
		return fmt.Errorf("postgres config: %w", err)
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	if p.st.Database != "postgres" {
		_, err = p.CreateDatabase(ctx, p.st.Database)
	}
	return err
}

// withTLS adds ssl = on to the settings when the cluster has TLS; explicit settings still win.
func withTLS(opts PostgresOptions) map[string]string {
	if opts.TLS == nil {
		return opts.Settings
	}
	out := map[string]string{"ssl": "on"}
	if opts.TLS.CAFile != "" {
		out["ssl_ca_file"] = "root.crt"
	}
	for k, v := range opts.Settings {
		out[k] = v
	}
	return out
}

// installTLS copies the server's certificate, key and client CA into the data directory, where
// ssl_cert_file, ssl_key_file and ssl_ca_file find them by their relative names. The server refuses
// a key that others can read, and runs as its own OS user.
func (p *Postgres) installTLS(data string, t PostgresTLS) error {
	files := map[string]string{"server.crt": t.CertFile, "server.key": t.KeyFile}
	if t.CAFile != "" {
		files["root.crt"] = t.CAFile
	}
	for name, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		dst := filepath.Join(data, name)
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		if p.cred != nil {
			if err := os.Chown(dst, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
				return fmt.Errorf("tls: %w", err)
			}
		}
	}
	return nil
}

// Version returns the cluster's major version, from its data directory (PG_VERSION).
func (p *Postgres) Version() (string, error) {
	b, err := os.ReadFile(filepath.Join(p.dir, "data", "PG_VERSION"))
	if err != nil {
		return "", fmt.Errorf("postgres version: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Port returns the TCP port on 127.0.0.1.
func (p *Postgres) Port() int { return p.st.Port }

// Database returns the name of the database created at start.
func (p *Postgres) Database() string { return p.st.Database }

// DSN returns a URL for superuser postgres on database: without TLS, or with TLS that verifies
// nothing (sslmode=require) when the cluster has TLS.
func (p *Postgres) DSN(database string) string {
	mode := "disable"
	if p.st.TLS {
		mode = "require"
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", p.st.Password),
		Host: "127.0.0.1:" + strconv.Itoa(p.st.Port), Path: "/" + database, RawQuery: "sslmode=" + mode}
	return u.String()
}

// Start starts the server (same directory and port) unless it runs, and waits until it accepts
// connections.
func (p *Postgres) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	// postgres runs as our child rather than via pg_ctl so that it can get a parent-death
	// signal: SIGQUIT is an immediate shutdown.
	err := p.start(ctx, spawnSpec{path: filepath.Join(p.st.BinDir, "postgres"), args: []string{"-D", p.needle},
		dir: p.dir, cred: p.cred, deathSig: syscall.SIGQUIT}, time.Minute, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := pgconn.Connect(ctx, p.DSN("postgres"))
		if err == nil {
			err = conn.Close(ctx)
		}
		return err
	})
	return err
}

// Stop shuts the server down in fast mode (SIGINT, like pg_ctl stop -m fast), SIGKILL after 60s.
func (p *Postgres) Stop(ctx context.Context) error { return p.stop(ctx, syscall.SIGINT, time.Minute) }

// StopImmediate shuts the server down in immediate mode (SIGQUIT, like pg_ctl stop -m immediate):
// no shutdown checkpoint, so the next start runs crash recovery. SIGKILL after 60s.
func (p *Postgres) StopImmediate(ctx context.Context) error {
	return p.stop(ctx, syscall.SIGQUIT, time.Minute)
}

// Restart stops (fast) and starts the server.
func (p *Postgres) Restart(ctx context.Context) error {
	if err := p.Stop(ctx); err != nil {
		return err
	}
	return p.Start(ctx)
}

// Close stops the server and removes its directory unless Keep was set.
func (p *Postgres) Close(ctx context.Context) error {
	var extra []string
	if p.st.SocketDir != p.dir {
		extra = append(extra, p.st.SocketDir)
	}
	return p.close(func() error { return p.Stop(ctx) }, extra...)
}

// Exec runs sql (one or more statements, simple protocol) on database.
func (p *Postgres) Exec(ctx context.Context, database, sql string) error {
	conn, err := pgconn.Connect(ctx, p.DSN(database))
	if err != nil {
		return fmt.Errorf("postgres connect %s: %w", database, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("postgres exec on %s: %w", database, err)
	}
	return nil
}

// CreateDatabase creates database name and returns its DSN.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) (string, error) {
	err := p.Exec(ctx, "postgres", "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	return p.DSN(name), err
}

// NewestPGVersion is the newest supported major version: `make up` and the test suite use it
// unless told otherwise.
const NewestPGVersion = "18"

// PGVersions returns the major versions the project supports and tests, oldest first.
func PGVersions() []string { return []string{"14", "15", "16", "17", NewestPGVersion} }

// PGLibDir is where scripts/pg-lib.sh unpacks the server binaries of the version matrix:
// $OUTBOX_PG_LIB, else /var/cache/outbox-relay/postgres for root (whose home the postgres OS user
// cannot read), else ~/.cache/outbox-relay/postgres.
func PGLibDir() string {
	if d := os.Getenv("OUTBOX_PG_LIB"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/cache/outbox-relay/postgres"
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "outbox-relay", "postgres")
}

// PGBinDir returns the bin directory of PostgreSQL major version major ("17"): Debian's package
// when installed, else the binaries scripts/pg-lib.sh unpacked (postgres-<major>.*/bin).
func PGBinDir(major string) (string, error) {
	candidates := []string{filepath.Join("/usr/lib/postgresql", major, "bin")}
	found, _ := filepath.Glob(filepath.Join(PGLibDir(), "postgres-"+major+".*", "bin"))
	slices.Reverse(found) // newest minor first
	candidates = append(candidates, found...)
	for _, d := range candidates {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("postgres %s: no server binaries in /usr/lib/postgresql/%s/bin or %s: run scripts/pg-lib.sh", major, major, PGLibDir())
}

// findPGBin locates a directory holding initdb and postgres: Debian puts only client wrappers
// (and maybe symlinks) on PATH.
func findPGBin(dir string) (string, error) {
	candidates := []string{dir}
	if dir == "" {
		if path, err := exec.LookPath("pg_ctl"); err == nil {
			if real, err := filepath.EvalSymlinks(path); err == nil {
				candidates = append(candidates, filepath.Dir(real))
			}
		}
		versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		slices.Reverse(versions) // newest first (lexical order holds for majors 10 to 99)
		candidates = append(candidates, versions...)
	}
	for _, d := range candidates {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("postgres: no server binaries (initdb, postgres) found: run scripts/ensure-tools.sh")
}

func isExec(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// CopyData copies the stopped server's data directory to dst (a cold copy, like a volume
// snapshot), owners and modes kept, for RestoreData.
func (p *Postgres) CopyData(ctx context.Context, dst string) error {
	if err := exec.CommandContext(ctx, "cp", "-a", p.needle, dst).Run(); err != nil {
		return fmt.Errorf("postgres: copy %s to %s (is the server stopped?): %w", p.needle, dst, err)
	}
	return nil
}

// RestoreData replaces the stopped server's data directory with a copy CopyData made: the server
// then starts where the copy was taken, on the same timeline (a restore in place).
func (p *Postgres) RestoreData(ctx context.Context, src string) error {
	if err := os.RemoveAll(p.needle); err != nil {
		return fmt.Errorf("postgres: remove %s: %w", p.needle, err)
	}
	if err := exec.CommandContext(ctx, "cp", "-a", src, p.needle).Run(); err != nil {
		return fmt.Errorf("postgres: restore %s from %s: %w", p.needle, src, err)
	}
	return nil
}
