// Package cluster owns the servers of a nemesis run (issue 23) and applies its faults to them: a
// PostgreSQL primary with, for the failover faults, a streaming standby that synchronises
// failover slots; a Kafka broker; and per client (a relay process) a network path of its own, to
// PostgreSQL and to Kafka, through proxies that can be cut like a partition. It runs inside tests
// and outside them (make chaos), so it takes no testing.TB: Close stops everything it started.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

// Options configures Start; zero values mean the defaults in the comments.
type Options struct {
	// Dir holds every server's directory (pg1, pg2, ... and kafka); a fresh temp dir, removed by
	// Close.
	Dir string
	// PGVersion is PostgreSQL's major version; "18". Standby needs 17 or later.
	PGVersion string
	// Standby starts a streaming standby that synchronises failover slots
	// (sync_replication_slots, hot_standby_feedback, a physical slot of its own on the primary):
	// what Failover needs.
	Standby bool
	// Clients names the processes that get a network path of their own ("r1", "r2", ...: letters,
	// digits, '_' and '-'): one proxy per PostgreSQL port and one Kafka listener with its proxy.
	Clients []string
	// KafkaSettings are extra server.properties entries.
	KafkaSettings map[string]string
	// Brokers is how many Kafka brokers run: 1 (the default) or 3. With three, as production runs
	// Kafka, node 1 is a broker and the cluster's KRaft controller, nodes 2 and 3 are brokers only
	// (devenv's StartBroker); every topic, the internal ones too, has three replicas and
	// min.insync.replicas 2, and each client has a path of its own to every broker.
	Brokers int
	// Log, when set, receives a line for every server started and every fault's steps.
	Log func(format string, args ...any)
}

// password is the superuser's, in every DSN.
const password = "outbox-test-secret"

// primarySettings are the PostgreSQL settings of every server (a standby inherits them with the
// data directory): room for three relays per mode in seven modes, each with a logical walsender
// and slot and a few more connections, besides writers, consumers' checks and the standby.
var primarySettings = map[string]string{
	"max_connections":       "300",
	"max_wal_senders":       "64",
	"max_replication_slots": "64",
}

// Cluster is the servers of one run. Its methods are safe for concurrent use; the PostgreSQL
// faults (RestartPostgres, Failover, SetSynchronized) run one at a time.
type Cluster struct {
	o       Options
	dir     string
	ownDir  bool // dir is a temp dir of ours: Close removes it
	ports   []int
	kafka   *devenv.Kafka     // node 1: a broker, and the KRaft controller
	brokers []*devenv.Kafka   // node i+1 at i, kafka first; fixed after Start
	clients map[string]*paths // fixed after Start
	// readyTimeout is Failover's wait for the standby; defaultReadyTimeout but in tests.
	readyTimeout time.Duration

	pgOps sync.Mutex // held by every change of PostgreSQL's topology, and by Close

	mu           sync.Mutex // guards what follows
	primary      *devenv.Postgres
	standby      *devenv.Postgres
	standbySlot  string
	synchronized bool
	syncSince    time.Time
	retired      []*devenv.Postgres // killed primaries not discarded yet
	serial       int                // numbers the PostgreSQL instances' directories (pg1, pg2, ...)
	closed       bool               // by Close
}

// paths is one client's network path: a proxy per PostgreSQL port (in the order of Cluster.ports),
// as many again for its leader lock's session alone (ClientLeaderDSN), and one per broker (in the
// order of Cluster.brokers) to its own listener there.
type paths struct {
	pg     []*proxy
	leader []*proxy
	kafka  []*proxy
}

// postgres returns every proxy of the client's path to PostgreSQL, the leader lock's among them.
func (p *paths) postgres() []*proxy { return append(append([]*proxy(nil), p.pg...), p.leader...) }

// all returns every proxy of the client's path.
func (p *paths) all() []*proxy { return append(p.postgres(), p.kafka...) }

var clientName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Start starts the servers and the clients' proxies. On an error, also when ctx ends, it stops
// what it started.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	o.PGVersion = cmp.Or(o.PGVersion, devenv.NewestPGVersion)
	o.Brokers = cmp.Or(o.Brokers, 1)
	if o.Brokers != 1 && o.Brokers != 3 {
		return nil, fmt.Errorf("cluster: %d Kafka brokers: want 1 or 3", o.Brokers)
	}
	if v, _ := strconv.Atoi(o.PGVersion); o.Standby && v < 17 {
		return nil, fmt.Errorf("cluster: a standby that synchronises failover slots needs PostgreSQL 17 or later, not %s", o.PGVersion)
	}
	c := &Cluster{o: o, dir: o.Dir, clients: make(map[string]*paths), readyTimeout: defaultReadyTimeout}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "outbox-chaos-"); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		c.ownDir = true
	} else if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close(context.WithoutCancel(ctx)))
		}
	}()

	// The proxies listen first: the broker advertises their addresses.
	listeners := make(map[string]string)               // Kafka listener name -> client
	plain := make([][]devenv.KafkaListener, o.Brokers) // per broker
	pgPorts := 1
	if o.Standby {
		pgPorts = 2
	}
	for _, name := range o.Clients {
		if !clientName.MatchString(name) {
			return nil, fmt.Errorf("cluster: client name %q: want letters, digits, '_' and '-'", name)
		}
		listener := "CLIENT_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		if other, ok := listeners[listener]; ok {
			return nil, fmt.Errorf("cluster: clients %q and %q would share Kafka listener %s", other, name, listener)
		}
		listeners[listener] = name
		p := &paths{}
		c.clients[name] = p
		for b := range o.Brokers {
			kp, err := listen()
			if err != nil {
				return nil, fmt.Errorf("cluster: proxy for %s: %w", name, err)
			}
			p.kafka = append(p.kafka, kp)
			plain[b] = append(plain[b], devenv.KafkaListener{Name: listener, Advertised: kp.Addr()})
		}
		for range pgPorts {
			pp, err := listen()
			if err != nil {
				return nil, fmt.Errorf("cluster: proxy for %s: %w", name, err)
			}
			p.pg = append(p.pg, pp)
			lp, err := listen()
			if err != nil {
				return nil, fmt.Errorf("cluster: leader lock proxy for %s: %w", name, err)
			}
			p.leader = append(p.leader, lp)
		}
	}

	// PostgreSQL and Kafka start side by side (the JVM is the long pole); the first failure
	// cancels the other.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var pgErr, kafkaErr error
	wg.Go(func() {
		if pgErr = c.startPostgres(sctx); pgErr != nil {
			cancel()
		}
	})
	wg.Go(func() {
		if kafkaErr = c.startKafka(sctx, plain); kafkaErr != nil {
			cancel()
		}
	})
	wg.Wait()
	// Both: the first failure cancels the other start, whose "context canceled" would hide it.
	if err := errors.Join(pgErr, kafkaErr); err != nil {
		return nil, err
	}
	// Both may have been up before ctx ended (the log hook may end it): a Start whose context
	// ended fails all the same, and stops them.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cluster: start: %w", context.Cause(ctx))
	}
	for listener, name := range listeners {
		p := c.clients[name]
		for b, kp := range p.kafka {
			kp.serve(c.brokers[b].ListenerAddr(listener))
		}
		for i, pp := range p.pg {
			pp.serve("127.0.0.1:" + strconv.Itoa(c.ports[i]))
			p.leader[i].serve("127.0.0.1:" + strconv.Itoa(c.ports[i]))
		}
	}
	return c, nil
}

// startPostgres starts the primary and, with Options.Standby, the standby; c.ports lists the
// primary's port, then the standby's.
func (c *Cluster) startPostgres(ctx context.Context) error {
	start := time.Now()
	primary, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: c.nextDir(), Version: c.o.PGVersion,
		Password: password, Database: "postgres", Settings: primarySettings})
	if err != nil {
		return fmt.Errorf("cluster: primary: %w", err)
	}
	c.mu.Lock()
	c.primary = primary
	c.mu.Unlock()
	c.ports = []int{primary.Port()}
	c.logf("postgres %s primary on port %d started in %v", c.o.PGVersion, primary.Port(), time.Since(start).Round(time.Millisecond))
	if !c.o.Standby {
		return nil
	}
	standby, slot, err := c.buildStandby(ctx, primary, 0)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.standby, c.standbySlot = standby, slot
	c.mu.Unlock()
	c.ports = append(c.ports, standby.Port())
	return nil
}

// nextDir returns the directory of the next PostgreSQL instance: pg1, pg2, ...
func (c *Cluster) nextDir() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.serial++
	return filepath.Join(c.dir, "pg"+strconv.Itoa(c.serial))
}

func (c *Cluster) logf(format string, args ...any) {
	if c.o.Log != nil {
		c.o.Log(format, args...)
	}
}

// Close stops every server and proxy, also after errors; with ctx ended it kills rather than
// waits for clean shutdowns. A fault running meanwhile is waited for (it honours its own ctx).
func (c *Cluster) Close(ctx context.Context) error {
	c.pgOps.Lock()
	defer c.pgOps.Unlock()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	servers := append([]*devenv.Postgres{c.standby, c.primary}, c.retired...)
	c.mu.Unlock()
	// The servers' logs outlive their directories: a run is read afterwards.
	for _, s := range servers {
		if s != nil {
			keepLog(s.Logs(), filepath.Join(c.dir, filepath.Base(s.Dir())+".log"))
		}
	}
	for i, k := range c.brokers {
		keepLog(k.Logs(), filepath.Join(c.dir, brokerDir(i+1)+".log"))
	}
	var errs []error
	for _, p := range c.clients {
		for _, pp := range p.all() {
			if pp != nil {
				errs = append(errs, pp.Close())
			}
		}
	}
	for _, s := range servers {
		if s != nil {
			errs = append(errs, s.Close(ctx))
		}
	}
	// The brokers before node 1: a broker's controlled shutdown asks node 1's controller.
	for i := len(c.brokers) - 1; i >= 0; i-- {
		errs = append(errs, c.brokers[i].Close(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster close: %w", err)
	}
	if c.ownDir {
		return os.RemoveAll(c.dir)
	}
	return nil
}

// DSN returns a URL for superuser postgres on database over both PostgreSQL ports, with
// target_session_attrs=read-write: it reaches whichever server is the primary, before and after a
// failover.
func (c *Cluster) DSN(database string) string {
	hosts := make([]string, len(c.ports))
	for i, port := range c.ports {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(port)
	}
	return dsn(hosts, database)
}

// ClientDSN is DSN through client's own proxies, one per PostgreSQL port.
func (c *Cluster) ClientDSN(client, database string) string {
	p := c.paths(client)
	hosts := make([]string, len(p.pg))
	for i, pp := range p.pg {
		hosts[i] = pp.Addr()
	}
	return dsn(hosts, database)
}

// ClientLeaderDSN is ClientDSN through proxies of the client's own for its leader lock's session
// alone (the relay's leader_dsn): CutLeaderLock cuts them and nothing else.
func (c *Cluster) ClientLeaderDSN(client, database string) string {
	p := c.paths(client)
	hosts := make([]string, len(p.leader))
	for i, pp := range p.leader {
		hosts[i] = pp.Addr()
	}
	return dsn(hosts, database)
}

func dsn(hosts []string, database string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password), Host: strings.Join(hosts, ","),
		Path: "/" + database, RawQuery: "sslmode=disable&target_session_attrs=read-write"}
	return u.String()
}

// Brokers returns the brokers' own bootstrap addresses, comma-separated, for consumers and admin
// clients.
func (c *Cluster) Brokers() string {
	addrs := make([]string, len(c.brokers))
	for i, k := range c.brokers {
		addrs[i] = k.Brokers()
	}
	return strings.Join(addrs, ",")
}

// Kafka returns node 1, a broker and the controller, for its admin helpers (CreateTopic).
func (c *Cluster) Kafka() *devenv.Kafka { return c.kafka }

// ClientBrokers returns the bootstrap addresses, comma-separated, of client's own Kafka path: a
// proxy per broker in front of a listener that advertises that proxy, so that metadata, produce
// and fetch all cross them.
func (c *Cluster) ClientBrokers(client string) string {
	p := c.paths(client)
	addrs := make([]string, len(p.kafka))
	for i, kp := range p.kafka {
		addrs[i] = kp.Addr()
	}
	return strings.Join(addrs, ",")
}

// paths returns client's network path; a name not in Options.Clients is a bug of the caller.
func (c *Cluster) paths(client string) *paths {
	p, ok := c.clients[client]
	if !ok {
		panic(fmt.Sprintf("cluster: client %q is not in Options.Clients", client))
	}
	return p
}

// Primary returns the current primary.
func (c *Cluster) Primary() *devenv.Postgres {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.primary
}

// Standby returns the current standby, nil without one (Options.Standby false, or a failover
// that could not build the next one).
func (c *Cluster) Standby() *devenv.Postgres {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.standby
}

// CreateDatabase creates database name on the primary and returns DSN(name).
func (c *Cluster) CreateDatabase(ctx context.Context, name string) (string, error) {
	if _, err := c.Primary().CreateDatabase(ctx, name); err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	return c.DSN(name), nil
}

// ErrNoSlot means SlotSample found no slot of that name on the primary.
var ErrNoSlot = errors.New("no such replication slot")

// SlotSample returns, in one statement on the current primary, slot's confirmed_flush_lsn and
// the primary's flushed end of WAL (what a walsender can have sent: a confirmed position above it
// is a bug).
func (c *Cluster) SlotSample(ctx context.Context, database, slot string) (confirmed, walEnd uint64, err error) {
	conn, err := pgx.Connect(ctx, c.Primary().DSN(database))
	if err != nil {
		return 0, 0, fmt.Errorf("cluster slot sample: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var conf, end int64
	err = conn.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn - '0/0', 0)::bigint, (pg_current_wal_flush_lsn() - '0/0')::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&conf, &end)
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrNoSlot
	}
	if err != nil {
		return 0, 0, fmt.Errorf("cluster slot sample %s: %w", slot, err)
	}
	return uint64(conf), uint64(end), nil
}

// AddColumn adds a text column with a default to table (maybe schema-qualified) on the primary.
func (c *Cluster) AddColumn(ctx context.Context, database, table, column string) error {
	sql := fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s text DEFAULT 'x'",
		pgx.Identifier(strings.Split(table, ".")).Sanitize(), pgx.Identifier{column}.Sanitize())
	if err := c.Primary().Exec(ctx, database, sql); err != nil {
		return fmt.Errorf("cluster add column: %w", err)
	}
	return nil
}

// keepLog copies a server's log beside the run's other output; a log that cannot be copied is
// only a loss for the reader.
func keepLog(src, dst string) {
	b, err := os.ReadFile(src)
	if err != nil {
		return
	}
	_ = os.WriteFile(dst, b, 0o644)
}

// Pending counts the rows of a polled outbox table (maybe schema-qualified) on the current
// primary that no poller has marked processed yet, and all of its rows.
func (c *Cluster) Pending(ctx context.Context, database, table string) (pending, rows int64, err error) {
	conn, err := pgx.Connect(ctx, c.Primary().DSN(database))
	if err != nil {
		return 0, 0, fmt.Errorf("cluster pending rows: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = conn.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FILTER (WHERE processed_at IS NULL), count(*) FROM %s",
		pgx.Identifier(strings.Split(table, ".")).Sanitize())).Scan(&pending, &rows)
	if err != nil {
		return 0, 0, fmt.Errorf("cluster pending rows of %s: %w", table, err)
	}
	return pending, rows, nil
}

// Exec runs sql on database of the current primary.
func (c *Cluster) Exec(ctx context.Context, database, sql string) error {
	return c.Primary().Exec(ctx, database, sql)
}
