package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// StartStandby makes a physical standby of primary (hot standby, readable) and starts it. It
// needs no pg_basebackup, which the server-only builds of scripts/pg-lib.sh lack: it stops
// primary (fast: a clean shutdown checkpoint), copies its data directory, and starts primary
// again, so connections to primary break once. The copy gets standby.signal and a
// primary_conninfo over primary's Unix socket (replication is trusted there; dbname is there for
// sync_replication_slots on 17+ and ignored by physical replication). The primary's replication
// slots are not copied, as pg_basebackup does not copy them. opts may set Dir, Port, Settings
// (added to the primary's, e.g. primary_slot_name, hot_standby_feedback), Keep and Detached; the
// rest is the primary's. Failover tests promote it.
func StartStandby(ctx context.Context, primary *Postgres, opts PostgresOptions) (*Postgres, error) {
	dir, err := newDir(opts.Dir, "outbox-pg-")
	if err != nil {
		return nil, fmt.Errorf("postgres standby: %w", err)
	}
	st := primary.st
	st.Port, st.SocketDir = opts.Port, dir
	p := newPostgres(dir, st, primary.cred)
	p.detached, p.keep = opts.Detached, opts.Keep
	if err := p.copyFrom(ctx, primary, opts.Settings); err != nil {
		if !opts.Keep {
			_ = p.Close(context.Background())
		}
		return nil, err
	}
	return p, nil
}

func (p *Postgres) copyFrom(ctx context.Context, primary *Postgres, extra map[string]string) error {
	if err := p.claimAddress(); err != nil {
		return err
	}
	if err := errors.Join(handOver(p.dir, p.cred), handOver(p.st.SocketDir, p.cred)); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	data := filepath.Join(p.dir, "data")
	if err := primary.copyDataTo(ctx, data, p.cred); err != nil {
		return fmt.Errorf("postgres standby: %w", err)
	}
	settings := map[string]string{
		"port":                    strconv.Itoa(p.st.Port),
		"unix_socket_directories": p.st.SocketDir,
		"hot_standby":             "on",
		"primary_conninfo": fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres application_name=%s",
			primary.st.SocketDir, primary.st.Port, filepath.Base(p.dir)),
	}
	conf, err := renderSettings(settings, extra, func(k, v string) string { return fmt.Sprintf("%s = '%s'", k, strings.ReplaceAll(v, "'", "''")) })
	if err != nil {
		return fmt.Errorf("postgres standby: %w", err)
	}
	// Later lines win over the primary's settings copied with the data directory.
	if err := appendFile(filepath.Join(data, "postgresql.conf"), "\n# outbox-relay devenv standby\n"+conf); err != nil {
		return fmt.Errorf("postgres standby config: %w", err)
	}
	if err := createFile(filepath.Join(data, "standby.signal"), p.cred); err != nil {
		return fmt.Errorf("postgres standby: %w", err)
	}
	return p.Start(ctx)
}

// copyDataTo stops the server (fast), copies its data directory to dst as cred's user and starts
// it again (also when the copy failed). What a new cluster must not inherit is left out: the
// replication slots (a copied logical slot would look like the primary's own on promotion) and
// the pid file.
func (p *Postgres) copyDataTo(ctx context.Context, dst string, cred *syscall.Credential) (err error) {
	if err := p.Stop(ctx); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Start(ctx)) }()
	src := filepath.Join(p.dir, "data")
	if err := run(ctx, filepath.Dir(dst), cred, "cp", "-a", src, dst); err != nil {
		return err
	}
	slots, _ := filepath.Glob(filepath.Join(dst, "pg_replslot", "*"))
	for _, f := range append(slots, filepath.Join(dst, "postmaster.pid"), filepath.Join(dst, "postmaster.opts")) {
		if err := os.RemoveAll(f); err != nil {
			return err
		}
	}
	return nil
}

// Promote ends recovery on a standby (pg_promote) and waits until it accepts writes on its new
// timeline.
func (p *Postgres) Promote(ctx context.Context) error {
	return p.Exec(ctx, "postgres", "SELECT pg_promote(true, 60)")
}

// MovePort restarts the server on another TCP port: a failover test moves a promoted standby to
// the address clients know, as a virtual IP or a DNS switch would.
func (p *Postgres) MovePort(ctx context.Context, port int) error {
	if err := p.Stop(ctx); err != nil {
		return err
	}
	p.st.Port = port
	if err := writeState(p.dir, p.st); err != nil {
		return fmt.Errorf("postgres state: %w", err)
	}
	conf := fmt.Sprintf("\n# outbox-relay devenv MovePort\nport = '%d'\n", port)
	if err := appendFile(filepath.Join(p.dir, "data", "postgresql.conf"), conf); err != nil {
		return fmt.Errorf("postgres config: %w", err)
	}
	return p.Start(ctx)
}

// createFile creates an empty file owned by cred's user.
func createFile(path string, cred *syscall.Credential) error {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return err
	}
	if cred != nil {
		return os.Lchown(path, int(cred.Uid), int(cred.Gid))
	}
	return nil
}

// appendFile appends to an existing file, keeping its owner (the service user).
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}
