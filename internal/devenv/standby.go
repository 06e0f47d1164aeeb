package devenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
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
	if err := p.copyFrom(ctx, primary, opts.Settings, primary.copyDataTo); err != nil {
		if !opts.Keep {
			_ = p.Close(context.Background())
		}
		return nil, err
	}
	return p, nil
}

// StartStandbyOnline is StartStandby without stopping primary: the copy is an online base backup
// (pg_backup_start, the files, pg_backup_stop's backup label), as pg_basebackup -X none takes
// one, so primary's clients notice nothing. The copy has no WAL of its own and streams it from
// primary's start of the backup on: opts.Settings must name, as primary_slot_name, a physical
// slot on primary made with its WAL reserved (pg_create_physical_replication_slot(name, true))
// before this call, or primary may recycle WAL the standby needs.
func StartStandbyOnline(ctx context.Context, primary *Postgres, opts PostgresOptions) (*Postgres, error) {
	if opts.Settings["primary_slot_name"] == "" {
		return nil, errors.New("postgres standby: an online copy needs a physical slot as primary_slot_name")
	}
	dir, err := newDir(opts.Dir, "outbox-pg-")
	if err != nil {
		return nil, fmt.Errorf("postgres standby: %w", err)
	}
	st := primary.st
	st.Port, st.SocketDir = opts.Port, dir
	p := newPostgres(dir, st, primary.cred)
	p.detached, p.keep = opts.Detached, opts.Keep
	if err := p.copyFrom(ctx, primary, opts.Settings, primary.backupTo); err != nil {
		if !opts.Keep {
			_ = p.Close(context.Background())
		}
		return nil, err
	}
	return p, nil
}

// copyFrom makes p a standby of primary from a copy of its data directory made by copyData.
func (p *Postgres) copyFrom(ctx context.Context, primary *Postgres, extra map[string]string,
	copyData func(ctx context.Context, dst string, cred *syscall.Credential) error) error {
	if err := p.claimAddress(); err != nil {
		return err
	}
	if err := errors.Join(handOver(p.dir, p.cred), handOver(p.st.SocketDir, p.cred)); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	data := filepath.Join(p.dir, "data")
	if err := copyData(ctx, data, p.cred); err != nil {
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

// backupDirsLeftEmpty are the data directory's folders whose contents an online copy leaves out,
// as pg_basebackup does: WAL (streamed instead), slots (a copied logical slot would look like the
// standby's own after a promotion) and runtime state the server rebuilds.
var backupDirsLeftEmpty = []string{"pg_wal", "pg_replslot", "pg_stat_tmp", "pg_dynshmem", "pg_notify",
	"pg_serial", "pg_snapshots", "pg_subtrans"}

// backupTo copies the running server's data directory to dst, owned by cred's user, without
// stopping it: between pg_backup_start (with a fast checkpoint) and pg_backup_stop on one
// session, every file that still exists is copied; the backup label pg_backup_stop returns
// then tells the copy where its recovery starts. Files the server writes meanwhile are made
// consistent by replaying WAL from that point, as with any base backup.
func (p *Postgres) backupTo(ctx context.Context, dst string, cred *syscall.Credential) error {
	conn, err := pgconn.Connect(ctx, p.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("base backup: %w", err)
	}
	// Closing the session also aborts a backup left running by an error below.
	defer conn.Close(context.WithoutCancel(ctx))
	start, stop := "SELECT pg_backup_start('devenv standby', true)", "SELECT labelfile FROM pg_backup_stop(false)"
	if v, _ := p.Version(); v == "14" {
		start, stop = "SELECT pg_start_backup('devenv standby', true, false)", "SELECT labelfile FROM pg_stop_backup(false)"
	}
	if _, err := conn.Exec(ctx, start).ReadAll(); err != nil {
		return fmt.Errorf("base backup start: %w", err)
	}
	if err := copyLiveTree(ctx, p.needle, dst); err != nil {
		return fmt.Errorf("base backup copy: %w", err)
	}
	res, err := conn.Exec(ctx, stop).ReadAll()
	if err == nil && (len(res) != 1 || len(res[0].Rows) != 1) {
		err = fmt.Errorf("unexpected result %v", res)
	}
	if err != nil {
		return fmt.Errorf("base backup stop: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dst, "backup_label"), res[0].Rows[0][0], 0o600); err != nil {
		return fmt.Errorf("base backup: %w", err)
	}
	return handOver(dst, cred)
}

// copyLiveTree copies a running server's data directory: files that vanish during the copy
// (temporary files, dropped relations) are skipped, and the folders of backupDirsLeftEmpty are
// created empty, with pg_wal/archive_status, which a server needs.
func copyLiveTree(ctx context.Context, src, dst string) error {
	gone := func(err error) bool { return errors.Is(err, fs.ErrNotExist) }
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if gone(err) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			if gone(err) {
				return nil
			}
			return err
		}
		switch {
		case d.IsDir():
			if err := os.MkdirAll(target, info.Mode().Perm()); err != nil {
				return err
			}
			if slices.Contains(backupDirsLeftEmpty, rel) {
				return fs.SkipDir
			}
			return nil
		case !info.Mode().IsRegular(), rel == "postmaster.pid", rel == "postmaster.opts", rel == "backup_label",
			d.Name() == "pg_internal.init", strings.HasPrefix(d.Name(), "pgsql_tmp"):
			return nil
		}
		if err := copyFile(path, target, info.Mode().Perm()); err != nil && !gone(err) {
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return os.MkdirAll(filepath.Join(dst, "pg_wal", "archive_status"), 0o700)
}

// copyFile copies src to a new file dst with mode perm.
func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
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
