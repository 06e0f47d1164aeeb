// Command devenv runs the local PostgreSQL and Kafka for development (make up / make down), and a
// schema registry when asked (make up REGISTRY=1):
//
//	devenv up     [--dir .local] [--pg-version 18] [--pg-port N] [--kafka-port N] [--registry] [--registry-port N]
//	devenv down   [--dir .local] [--purge]
//	devenv status [--dir .local]   (exit status 1 unless every created service runs)
//
// State lives in <dir>/postgres, <dir>/kafka and <dir>/registry; up writes <dir>/services.env.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: devenv up|down|status [--dir .local] [--purge] [--pg-version N] [--pg-port N] [--kafka-port N]")
		os.Exit(2)
	}
	flags := flag.NewFlagSet("devenv "+os.Args[1], flag.ExitOnError)
	dir := flags.String("dir", ".local", "state directory")
	purge := flags.Bool("purge", false, "down: also delete the data")
	pgVersion := flags.String("pg-version", "", "up: PostgreSQL major version ("+strings.Join(devenv.PGVersions(), ", ")+"); empty: the existing cluster's, or "+devenv.NewestPGVersion+" for a new one")
	pgPort := flags.Int("pg-port", 0, "up: port of a new PostgreSQL cluster (0: a free one)")
	kafkaPort := flags.Int("kafka-port", 0, "up: port of a new Kafka broker (0: a free one)")
	withRegistry := flags.Bool("registry", false, "up: also run a schema registry (Apicurio Registry; make registry-lib), for the registry-backed encodings")
	registryPort := flags.Int("registry-port", 0, "up: port of a new schema registry (0: a free one)")
	_ = flags.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pgDir, kDir, rDir := filepath.Join(*dir, "postgres"), filepath.Join(*dir, "kafka"), filepath.Join(*dir, "registry")
	envFile := filepath.Join(*dir, "services.env")
	pg, pgErr := devenv.AttachPostgres(pgDir)
	k, kErr := devenv.AttachKafka(kDir)
	// A registry is there only when an earlier up made one (or this one is asked to).
	reg, rErr := devenv.AttachRegistry(rDir)
	var err error
	switch os.Args[1] {
	case "up":
		// Attach to what exists (Start is a no-op when running), create what does not.
		if *pgVersion != "" && !slices.Contains(devenv.PGVersions(), *pgVersion) {
			fail(fmt.Errorf("--pg-version (PG_VERSION) %q: want one of %s", *pgVersion, strings.Join(devenv.PGVersions(), ", ")))
		}
		if errors.Is(pgErr, fs.ErrNotExist) {
			pg, pgErr = devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: pgDir, Port: *pgPort, Version: cmp.Or(*pgVersion, devenv.NewestPGVersion), Detached: true})
		} else if pgErr == nil {
			// A cluster's data directory belongs to one major version: another needs a new cluster.
			if have, err := pg.Version(); err != nil {
				pgErr = err
			} else if *pgVersion != "" && have != *pgVersion {
				pgErr = fmt.Errorf("%s holds a PostgreSQL %s cluster, PostgreSQL %s was asked for (--pg-version, PG_VERSION): run `make up PG_VERSION=%s` to keep it, or `go run ./internal/cmd/devenv down --dir %s --purge` to delete it and its data first",
					pgDir, have, *pgVersion, have, *dir)
			} else {
				pgErr = pg.Start(ctx)
			}
		}
		if pgErr != nil {
			fail(pgErr)
		}
		if errors.Is(kErr, fs.ErrNotExist) {
			k, kErr = devenv.StartKafka(ctx, devenv.KafkaOptions{Dir: kDir, Port: *kafkaPort, Detached: true})
		} else if kErr == nil {
			kErr = k.Start(ctx)
		}
		if kErr != nil {
			fail(kErr)
		}
		env := fmt.Sprintf("OUTBOX_PG_DSN=%s\nOUTBOX_KAFKA_BROKERS=%s\n", pg.DSN(pg.Database()), k.Brokers())
		logs := pg.Logs() + " " + k.Logs()
		if *withRegistry && errors.Is(rErr, fs.ErrNotExist) {
			reg, rErr = devenv.StartRegistry(ctx, devenv.RegistryOptions{Dir: rDir, Port: *registryPort, Detached: true})
		} else if rErr == nil {
			rErr = reg.Start(ctx)
		}
		switch {
		case rErr == nil:
			env += fmt.Sprintf("OUTBOX_SCHEMA_REGISTRY_URLS=%s\n", reg.ConfluentURL())
			logs += " " + reg.Logs()
		case *withRegistry || !errors.Is(rErr, fs.ErrNotExist):
			fail(rErr)
		}
		err = os.WriteFile(envFile, []byte(env), 0o644)
		fmt.Printf("%s# in %s; logs: %s\n", env, envFile, logs)
	case "down":
		_ = os.Remove(envFile) // its addresses are dead from here on
		var errs []error
		if pgErr == nil {
			errs = append(errs, pg.Stop(ctx))
			if *purge {
				errs = append(errs, pg.Close(ctx))
			}
		}
		if kErr == nil {
			errs = append(errs, k.Stop(ctx))
			if *purge {
				errs = append(errs, k.Close(ctx))
			}
		}
		if rErr == nil {
			errs = append(errs, reg.Stop(ctx))
			if *purge {
				errs = append(errs, reg.Close(ctx))
			}
		}
		if *purge {
			_ = os.Remove(*dir) // only when empty: it may hold other things
		}
		if err = errors.Join(errs...); err == nil {
			fmt.Println(map[bool]string{false: "postgres and kafka stopped", true: "postgres, kafka and the schema registry stopped"}[rErr == nil])
		}
	case "status":
		ok := report("postgres", pgErr, func() (bool, string, string) { return pg.Running(), pg.DSN(pg.Database()), pg.Logs() })
		ok = report("kafka", kErr, func() (bool, string, string) { return k.Running(), k.Brokers(), k.Logs() }) && ok
		if !errors.Is(rErr, fs.ErrNotExist) {
			ok = report("registry", rErr, func() (bool, string, string) { return reg.Running(), reg.ConfluentURL(), reg.Logs() }) && ok
		}
		if !ok {
			os.Exit(1)
		}
	default:
		err = fmt.Errorf("unknown command %q (want up, down or status)", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func report(name string, attachErr error, state func() (running bool, addr, logs string)) bool {
	if attachErr != nil {
		fmt.Printf("%-9s not created (%v)\n", name+":", attachErr)
		return false
	}
	running, addr, logs := state()
	fmt.Printf("%-9s %s %s (log %s)\n", name+":", map[bool]string{true: "running", false: "stopped"}[running], addr, logs)
	return running
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "devenv:", err)
	os.Exit(1)
}
