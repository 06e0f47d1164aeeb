package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// StartStandby copies primary with pg_basebackup into a new cluster that streams from it as a
// physical standby (hot standby, readable), and starts it. opts may set Dir, Port, Settings
// (added to the primary's), Keep and Detached; the rest is the primary's. Failover tests promote it.
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
	// Through the primary's Unix socket, where replication connections are trusted: -R then writes
	// a primary_conninfo without a password.
	data := filepath.Join(p.dir, "data")
	err := run(ctx, p.dir, p.cred, filepath.Join(p.st.BinDir, "pg_basebackup"), "-D", data, "-R",
		"-X", "stream", "-c", "fast", "--no-sync", "-h", primary.st.SocketDir, "-p", strconv.Itoa(primary.st.Port), "-U", "postgres")
	if err != nil {
		return fmt.Errorf("postgres standby: %w", err)
	}
	settings := map[string]string{"port": strconv.Itoa(p.st.Port), "unix_socket_directories": p.st.SocketDir}
	conf, err := renderSettings(settings, extra, func(k, v string) string { return fmt.Sprintf("%s = '%s'", k, strings.ReplaceAll(v, "'", "''")) })
	if err != nil {
		return fmt.Errorf("postgres standby: %w", err)
	}
	// Later lines win over the primary's settings copied with the data directory.
	if err := appendFile(filepath.Join(data, "postgresql.conf"), "\n# outbox-relay devenv standby\n"+conf); err != nil {
		return fmt.Errorf("postgres standby config: %w", err)
	}
	return p.Start(ctx)
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

// appendFile appends to an existing file, keeping its owner (the service user).
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}
