package devenv

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
)

// ErrKafkaLibMissing means the broker jars have not been assembled.
var ErrKafkaLibMissing = errors.New("Kafka jars missing: run `make kafka-lib`")

// DefaultKafkaLib is where scripts/kafka-lib.sh puts the broker jars: $OUTBOX_KAFKA_LIB or
// ~/.cache/outbox-relay/kafka-4.4.0/lib.
func DefaultKafkaLib() string {
	if lib := os.Getenv("OUTBOX_KAFKA_LIB"); lib != "" {
		return lib
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "outbox-relay", "kafka-4.4.0", "lib")
}

// KafkaLibReady checks for the stamp kafka-lib.sh writes last into a complete lib folder.
func KafkaLibReady(lib string) error {
	if _, err := os.Stat(filepath.Join(lib, ".complete")); err != nil {
		return fmt.Errorf("%w (looked in %s)", ErrKafkaLibMissing, lib)
	}
	return nil
}

// KafkaOptions configures StartKafka; zero values mean the defaults in the comments.
type KafkaOptions struct {
	Dir            string            // instance directory; a fresh temp dir
	Port           int               // broker port on 127.0.0.1; a free one
	ControllerPort int               // KRaft controller port; a free one
	Partitions     int               // num.partitions for auto-created topics; 3
	HeapMB         int               // JVM -Xmx; 512
	Lib            string            // jar folder; DefaultKafkaLib()
	Settings       map[string]string // extra server.properties entries, override the defaults
	Keep           bool              // Close stops but keeps the directory
	Detached       bool              // the broker outlives this process (make up)
	// SCRAMUsers (name -> password) adds a SASL_PLAINTEXT listener, SASLBrokers(), that accepts
	// SCRAM-SHA-256 and SCRAM-SHA-512, with these users' credentials written when the storage is
	// formatted (kafka-storage format --add-scram). The PLAINTEXT listener stays for tools and the
	// broker's own traffic. Passwords must not contain ',', ']' or '"'.
	SCRAMUsers map[string]string
	// TLSListeners adds listeners with TLS, each on a free port: ListenerAddr(name).
	TLSListeners []KafkaTLSListener
	// PlaintextListeners adds listeners without TLS or SASL, each on a free port:
	// ListenerAddr(name). With Advertised set, each gives a client a path of its own through a
	// proxy (metadata, produce and fetch all cross it), so that a test can cut one client off.
	PlaintextListeners []KafkaListener
	// NodeID is the node.id of a broker that StartBroker adds; 2. StartKafka's node is always 1.
	NodeID int
	// LogLevels (logger name -> level, e.g. "kafka.coordinator.transaction": "INFO") sets the
	// levels of loggers of this node; the shared log4j2.properties logs WARN and up.
	LogLevels map[string]string
	// SystemProperties are the broker JVM's -D properties, e.g.
	// "org.apache.kafka.sasl.oauthbearer.allowed.urls" (Kafka 4 reaches no JWKS endpoint not listed).
	SystemProperties map[string]string
}

// KafkaListener is a further PLAINTEXT-type broker listener.
type KafkaListener struct {
	// Name is the listener's name: upper-case letters, digits and underscores, e.g. "CLIENT_R1";
	// not a built-in listener's (PLAINTEXT, SASL_PLAINTEXT, CONTROLLER) nor a TLS listener's.
	Name string
	// Port is the listener's port on 127.0.0.1; a free one.
	Port int
	// Advertised, when set, is the address the broker gives clients for this listener (a proxy
	// in front of it); ListenerAddr stays the real one.
	Advertised string
}

// KafkaTLSListener is a broker listener with TLS, its certificate read from PEM files (Kafka's
// PEM key and trust stores: no keytool, no JKS).
type KafkaTLSListener struct {
	// Name is the listener's name: upper-case letters, digits and underscores, e.g. "MTLS"; not
	// PLAINTEXT, SASL_PLAINTEXT or CONTROLLER.
	Name string
	// CertFile and KeyFile are the broker's certificate (chain) and its PKCS#8 key.
	CertFile, KeyFile string
	// ClientCAFile, when set, makes the listener require a client certificate signed by this CA
	// (ssl.client.auth=required); the principal is then the certificate's subject.
	ClientCAFile string
	// SASL makes it a SASL_SSL listener authenticating the SCRAMUsers (SCRAM-SHA-256 and -512).
	SASL bool
	// Settings are further settings of this listener, without the listener.name.<name>. prefix,
	// e.g. "scram-sha-512.connections.max.reauth.ms".
	Settings map[string]string
	// Port is the listener's port on 127.0.0.1; a free one.
	Port int
	// Advertised, when set, is the address the broker gives clients for this listener (a proxy in
	// front of it, so that a test can cut clients' connections); ListenerAddr stays the real one.
	Advertised string
}

// Kafka is a KRaft node: server.properties, data/ and kafka.log in its directory, the JVM's pid
// in kafka.pid. StartKafka's is a broker and the cluster's only controller (node 1); StartBroker
// adds broker-only nodes to its cluster.
type Kafka struct {
	service
	st kafkaState
}

// kafkaState is persisted in <dir>/devenv.json for AttachKafka.
type kafkaState struct {
	Port           int            `json:"port"`
	ControllerPort int            `json:"controller_port"`
	HeapMB         int            `json:"heap_mb"`
	Lib            string         `json:"lib"`
	SASLPort       int            `json:"sasl_port,omitempty"`
	TLSPorts       map[string]int `json:"tls_ports,omitempty"`
	PlainPorts     map[string]int `json:"plain_ports,omitempty"`
	NodeID         int            `json:"node_id,omitempty"`    // 0: 1 (a state written before there were more nodes)
	ClusterID      string         `json:"cluster_id,omitempty"` // "": read data/meta.properties
	// Quorum is the controller a broker-only node (StartBroker) joins; "" for a node that is its
	// own controller.
	Quorum string `json:"quorum,omitempty"`
	// SystemProperties are KafkaOptions.SystemProperties, kept for a restart.
	SystemProperties map[string]string `json:"system_properties,omitempty"`
}

// StartKafka formats a new broker directory and starts the broker.
func StartKafka(ctx context.Context, opts KafkaOptions) (*Kafka, error) {
	st := kafkaState{Port: opts.Port, ControllerPort: opts.ControllerPort, NodeID: 1, ClusterID: kafkaClusterID(),
		HeapMB: cmp.Or(opts.HeapMB, 512), Lib: cmp.Or(opts.Lib, DefaultKafkaLib())}
	return startKafka(ctx, st, opts)
}

// StartBroker formats and starts a broker-only node (process.roles=broker, node.id opts.NodeID,
// 2 by default) that joins k's cluster: k's controller quorum, k's cluster id. Its internal topics'
// settings are k's (replication factor 1 unless opts.Settings name others), so a partition whose
// only replica is on one node has no leader while that node is stopped. opts.ControllerPort and opts.SCRAMUsers are refused (SCRAM
// credentials live in the cluster's metadata: give them to StartKafka). Close the brokers before
// k: a broker's controlled shutdown asks k's controller.
func (k *Kafka) StartBroker(ctx context.Context, opts KafkaOptions) (*Kafka, error) {
	if k.st.Quorum != "" {
		return nil, errors.New("kafka: StartBroker needs the node that runs the controller")
	}
	if opts.ControllerPort != 0 || len(opts.SCRAMUsers) > 0 {
		return nil, errors.New("kafka: a broker-only node has no controller port and no SCRAM users of its own")
	}
	id := cmp.Or(opts.NodeID, 2)
	if id == k.nodeID() {
		return nil, fmt.Errorf("kafka: node.id %d is the controller's", id)
	}
	cluster, err := k.ClusterID()
	if err != nil {
		return nil, err
	}
	st := kafkaState{Port: opts.Port, NodeID: id, ClusterID: cluster, Quorum: k.controllerAddr(),
		HeapMB: cmp.Or(opts.HeapMB, 512), Lib: cmp.Or(opts.Lib, k.st.Lib)}
	return startKafka(ctx, st, opts)
}

func startKafka(ctx context.Context, st kafkaState, opts KafkaOptions) (*Kafka, error) {
	if err := KafkaLibReady(st.Lib); err != nil {
		return nil, err
	}
	dir, err := newDir(opts.Dir, "outbox-kafka-")
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	st.SystemProperties = opts.SystemProperties
	k := newKafka(dir, st)
	k.detached, k.keep = opts.Detached, opts.Keep
	if err := k.create(ctx, cmp.Or(opts.Partitions, 3), opts); err != nil {
		if !opts.Keep {
			_ = k.Close(context.Background())
		}
		return nil, err
	}
	return k, nil
}

// AttachKafka opens a broker created earlier, maybe by another process (make down). Its Start
// runs detached; its Close removes the directory.
func AttachKafka(dir string) (*Kafka, error) {
	var st kafkaState
	dir, err := readState(dir, &st)
	if err != nil {
		return nil, err
	}
	k := newKafka(dir, st)
	k.detached = true
	return k, nil
}

func newKafka(dir string, st kafkaState) *Kafka {
	return &Kafka{st: st, service: service{name: "kafka", dir: dir,
		pidFile: filepath.Join(dir, "kafka.pid"), writePid: true, needle: filepath.Join(dir, "server.properties")}}
}

func (k *Kafka) create(ctx context.Context, partitions int, opts KafkaOptions) error {
	ports, err := freePorts(3 + len(opts.TLSListeners) + len(opts.PlaintextListeners))
	if err != nil {
		return err
	}
	k.st.Port = cmp.Or(k.st.Port, ports[0])
	if k.st.Quorum == "" {
		k.st.ControllerPort = cmp.Or(k.st.ControllerPort, ports[1])
	}
	if len(opts.SCRAMUsers) > 0 {
		k.st.SASLPort = ports[2]
	}
	for i, l := range opts.TLSListeners {
		if k.st.TLSPorts == nil {
			k.st.TLSPorts = make(map[string]int)
		}
		k.st.TLSPorts[l.Name] = cmp.Or(l.Port, ports[3+i])
	}
	for i, l := range opts.PlaintextListeners {
		if k.st.PlainPorts == nil {
			k.st.PlainPorts = make(map[string]int)
		}
		k.st.PlainPorts[l.Name] = cmp.Or(l.Port, ports[3+len(opts.TLSListeners)+i])
	}
	if err := writeState(k.dir, k.st); err != nil {
		return fmt.Errorf("kafka state: %w", err)
	}
	listeners, err := k.listenerSettings(opts.TLSListeners, opts.PlaintextListeners)
	if err != nil {
		return fmt.Errorf("kafka config: %w", err)
	}
	for key, v := range opts.Settings {
		listeners[key] = v
	}
	if err := k.writeLogConfig(opts.LogLevels); err != nil {
		return fmt.Errorf("kafka log config: %w", err)
	}
	// log.dirs is a comma-separated list: a directory with a comma in its path would be split,
	// and the broker would format and use a directory outside its own (one a previous run left
	// behind fails the format with "Invalid cluster.id").
	if strings.Contains(k.dir, ",") {
		return fmt.Errorf("kafka: directory %q contains a comma, which log.dirs would split: use another", k.dir)
	}
	settings := map[string]string{
		"process.roles":                       "broker,controller",
		"node.id":                             strconv.Itoa(k.nodeID()),
		"controller.quorum.bootstrap.servers": k.controllerAddr(),
		"controller.listener.names":           "CONTROLLER",
		"inter.broker.listener.name":          "PLAINTEXT",
		"log.dirs":                            filepath.Join(k.dir, "data"),
		"num.partitions":                      strconv.Itoa(partitions),
		"auto.create.topics.enable":           "true",
		"group.initial.rebalance.delay.ms":    "0",
		// Replication factor and min ISR 1, also with further brokers (StartBroker): a partition
		// is on one node only. One partition per internal topic makes the first consumer group or
		// transaction faster to set up.
		"offsets.topic.replication.factor":                 "1",
		"offsets.topic.num.partitions":                     "1",
		"transaction.state.log.replication.factor":         "1",
		"transaction.state.log.min.isr":                    "1",
		"transaction.state.log.num.partitions":             "1",
		"share.coordinator.state.topic.replication.factor": "1",
		"share.coordinator.state.topic.min.isr":            "1",
		"share.coordinator.state.topic.num.partitions":     "1",
	}
	if k.st.Quorum != "" {
		settings["process.roles"] = "broker"
		// A restarted broker waits until the controller calls it caught up, which takes a few
		// heartbeats: at the default 2s, 6s of a 10s restart.
		settings["broker.heartbeat.interval.ms"] = "500"
	}
	props, err := renderSettings(settings, listeners, func(k, v string) string { return k + "=" + v })
	if err == nil {
		err = os.WriteFile(k.needle, []byte(props), 0o644)
	}
	if err != nil {
		return fmt.Errorf("kafka config: %w", err)
	}
	// Dynamic quorum (bootstrap servers + format --standalone), the 4.x default; a broker-only node
	// joins it (--no-initial-controllers: it neither is nor names a voter). The cluster id is made
	// by StartKafka: a `StorageTool random-uuid` run would cost another JVM start.
	quorum := "--standalone"
	if k.st.Quorum != "" {
		quorum = "--no-initial-controllers"
	}
	format := []string{"format", quorum, "-t", k.st.ClusterID, "-c", k.needle}
	for name, password := range opts.SCRAMUsers {
		for _, mech := range []string{"SCRAM-SHA-256", "SCRAM-SHA-512"} {
			format = append(format, "--add-scram", fmt.Sprintf("%s=[name=%s,password=%s]", mech, name, password))
		}
	}
	err = run(ctx, k.dir, nil, "java", append(append(k.jvmFlags(), "-Xmx256m", "kafka.tools.StorageTool"), format...)...)
	if err != nil {
		return fmt.Errorf("kafka format: %w", err)
	}
	return k.Start(ctx)
}

// listenerSettings lists the broker's listeners: PLAINTEXT (tools and the broker's own traffic),
// SASL_PLAINTEXT with SCRAM users, the TLS listeners, the further plaintext ones, and the
// controller's.
func (k *Kafka) listenerSettings(tlsListeners []KafkaTLSListener, plainListeners []KafkaListener) (map[string]string, error) {
	// What the broker listens on, and the addresses it gives clients: the same but where a TLS
	// listener names another.
	listeners := []string{"PLAINTEXT://" + k.Brokers()}
	advertised := []string{"PLAINTEXT://" + k.Brokers()}
	protocols := []string{"CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"}
	out := map[string]string{}
	scram := func(name string) {
		// The server side of SCRAM checks clients against the credentials in the metadata log; its
		// login module needs no options.
		for _, mech := range []string{"scram-sha-256", "scram-sha-512"} {
			out["listener.name."+name+"."+mech+".sasl.jaas.config"] = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
		}
		out["sasl.enabled.mechanisms"] = "SCRAM-SHA-256,SCRAM-SHA-512"
	}
	if k.st.SASLPort != 0 {
		listeners = append(listeners, "SASL_PLAINTEXT://"+k.SASLBrokers())
		advertised = append(advertised, "SASL_PLAINTEXT://"+k.SASLBrokers())
		protocols = append(protocols, "SASL_PLAINTEXT:SASL_PLAINTEXT")
		scram("sasl_plaintext")
	}
	for _, l := range tlsListeners {
		if !listenerName.MatchString(l.Name) || l.Name == "PLAINTEXT" || l.Name == "SASL_PLAINTEXT" || l.Name == "CONTROLLER" {
			return nil, fmt.Errorf("TLS listener name %q: want upper-case letters, digits and underscores, not a built-in listener", l.Name)
		}
		if l.SASL && k.st.SASLPort == 0 {
			return nil, fmt.Errorf("TLS listener %s: SASL needs SCRAMUsers", l.Name)
		}
		name := strings.ToLower(l.Name)
		prefix := "listener.name." + name + "."
		// Kafka's PEM key store is one file: the private key, then the certificate chain.
		store := filepath.Join(k.dir, "tls-"+name+".pem")
		if err := concatFiles(store, l.KeyFile, l.CertFile); err != nil {
			return nil, fmt.Errorf("TLS listener %s: %w", l.Name, err)
		}
		out[prefix+"ssl.keystore.type"] = "PEM"
		out[prefix+"ssl.keystore.location"] = store
		if l.ClientCAFile != "" {
			trust := filepath.Join(k.dir, "trust-"+name+".pem")
			if err := concatFiles(trust, l.ClientCAFile); err != nil {
				return nil, fmt.Errorf("TLS listener %s: %w", l.Name, err)
			}
			out[prefix+"ssl.truststore.type"] = "PEM"
			out[prefix+"ssl.truststore.location"] = trust
			out[prefix+"ssl.client.auth"] = "required"
		}
		protocol := "SSL"
		if l.SASL {
			protocol = "SASL_SSL"
			scram(name)
		}
		for key, v := range l.Settings {
			out[prefix+key] = v
		}
		listeners = append(listeners, l.Name+"://"+k.ListenerAddr(l.Name))
		advertised = append(advertised, l.Name+"://"+cmp.Or(l.Advertised, k.ListenerAddr(l.Name)))
		protocols = append(protocols, l.Name+":"+protocol)
	}
	for _, l := range plainListeners {
		if !listenerName.MatchString(l.Name) || l.Name == "PLAINTEXT" || l.Name == "SASL_PLAINTEXT" || l.Name == "CONTROLLER" || k.st.TLSPorts[l.Name] != 0 {
			return nil, fmt.Errorf("plaintext listener name %q: want upper-case letters, digits and underscores, not a built-in or TLS listener", l.Name)
		}
		listeners = append(listeners, l.Name+"://"+k.ListenerAddr(l.Name))
		advertised = append(advertised, l.Name+"://"+cmp.Or(l.Advertised, k.ListenerAddr(l.Name)))
		protocols = append(protocols, l.Name+":PLAINTEXT")
	}
	if k.st.Quorum == "" { // the controller's listener; a broker-only node only reaches out to it
		listeners = append(listeners, "CONTROLLER://"+k.controllerAddr())
		advertised = append(advertised, "CONTROLLER://"+k.controllerAddr())
	}
	out["listeners"] = strings.Join(listeners, ",")
	out["advertised.listeners"] = strings.Join(advertised, ",")
	out["listener.security.protocol.map"] = strings.Join(protocols, ",")
	return out, nil
}

var listenerName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// concatFiles writes the files' contents, one after the other, to path (mode 0600: it may hold a
// key).
func concatFiles(path string, files ...string) error {
	var b []byte
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		b = append(append(b, data...), '\n')
	}
	return os.WriteFile(path, b, 0o600)
}

// ListenerAddr returns the address of the TLS or further plaintext listener name,
// "127.0.0.1:<port>", or "" when the broker has no such listener.
func (k *Kafka) ListenerAddr(name string) string {
	port, ok := k.st.TLSPorts[name]
	if !ok {
		port, ok = k.st.PlainPorts[name]
	}
	if !ok {
		return ""
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// SASLBrokers returns the SASL_PLAINTEXT bootstrap address, "127.0.0.1:<port>", or "" when the
// broker was created without SCRAMUsers.
func (k *Kafka) SASLBrokers() string {
	if k.st.SASLPort == 0 {
		return ""
	}
	return "127.0.0.1:" + strconv.Itoa(k.st.SASLPort)
}

// kafkaClusterID makes an id like Kafka's Uuid.randomUuid: 16 random bytes in URL-safe base64,
// not starting with '-' (it would read as a flag).
func kafkaClusterID() string {
	for {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		if id := base64.RawURLEncoding.EncodeToString(b); id[0] != '-' {
			return id
		}
	}
}

func (k *Kafka) jvmFlags() []string {
	// kafka-lib.sh copies scripts/kafka/log4j2.properties next to the jars; a node with LogLevels
	// has its own copy, with them added.
	logConfig := filepath.Join(k.dir, "log4j2.properties")
	if _, err := os.Stat(logConfig); err != nil {
		logConfig = filepath.Join(k.st.Lib, "log4j2.properties")
	}
	flags := []string{"-XX:+UseG1GC", "-Djava.awt.headless=true", "-Dkafka.logs.dir=" + k.dir,
		"-Dlog4j2.configurationFile=" + logConfig}
	for _, name := range slices.Sorted(maps.Keys(k.st.SystemProperties)) {
		flags = append(flags, "-D"+name+"="+k.st.SystemProperties[name])
	}
	return append(flags, "-cp", filepath.Join(k.st.Lib, "*"))
}

// writeLogConfig writes <dir>/log4j2.properties, the lib's with levels (logger -> level) added,
// when there are any.
func (k *Kafka) writeLogConfig(levels map[string]string) error {
	if len(levels) == 0 {
		return nil
	}
	base, err := os.ReadFile(filepath.Join(k.st.Lib, "log4j2.properties"))
	if err != nil {
		return err
	}
	b := append(base, "\n# devenv KafkaOptions.LogLevels\n"...)
	for i, name := range slices.Sorted(maps.Keys(levels)) {
		if strings.ContainsAny(name+levels[name], "\n\r") {
			return fmt.Errorf("invalid log level %q=%q", name, levels[name])
		}
		b = fmt.Appendf(b, "logger.devenv%d.name = %s\nlogger.devenv%d.level = %s\n", i, name, i, levels[name])
	}
	return os.WriteFile(filepath.Join(k.dir, "log4j2.properties"), b, 0o644)
}

// NodeID returns the node's node.id: 1 for StartKafka's, the one given for StartBroker's.
func (k *Kafka) NodeID() int { return k.nodeID() }

func (k *Kafka) nodeID() int { return cmp.Or(k.st.NodeID, 1) }

// controllerAddr is the controller quorum's bootstrap address: the node's own controller
// listener, or the one a broker-only node joined.
func (k *Kafka) controllerAddr() string {
	if k.st.Quorum != "" {
		return k.st.Quorum
	}
	return "127.0.0.1:" + strconv.Itoa(k.st.ControllerPort)
}

// ClusterID returns the cluster's id, from the state or, for a node created before the state
// held it, from data/meta.properties.
func (k *Kafka) ClusterID() (string, error) {
	if k.st.ClusterID != "" {
		return k.st.ClusterID, nil
	}
	b, err := os.ReadFile(filepath.Join(k.dir, "data", "meta.properties"))
	if err != nil {
		return "", fmt.Errorf("kafka cluster id: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster.id="); ok && id != "" {
			return id, nil
		}
	}
	return "", fmt.Errorf("kafka cluster id: no cluster.id in %s", filepath.Join(k.dir, "data", "meta.properties"))
}

// Brokers returns the bootstrap address, "127.0.0.1:<port>".
func (k *Kafka) Brokers() string { return "127.0.0.1:" + strconv.Itoa(k.st.Port) }

// Start starts the broker (same ports and data) unless it runs, and waits until it answers
// metadata requests (90s at most).
func (k *Kafka) Start(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	args := append([]string{"-Xms128m", fmt.Sprintf("-Xmx%dm", k.st.HeapMB)}, k.jvmFlags()...)
	spec := spawnSpec{path: "java", args: append(args, "kafka.Kafka", k.needle), dir: k.dir, deathSig: syscall.SIGKILL}
	err := k.start(ctx, spec, 90*time.Second, k.ping)
	return err
}

// ping succeeds once the broker answers ApiVersions and lists itself in metadata, i.e. it has
// registered with the controller and been unfenced.
func (k *Kafka) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := (&kafka.Dialer{}).DialContext(ctx, "tcp", k.Brokers())
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	if _, err := conn.ApiVersions(); err != nil {
		return err
	}
	brokers, err := conn.Brokers()
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if !slices.ContainsFunc(brokers, func(b kafka.Broker) bool { return b.ID == k.nodeID() }) {
		return fmt.Errorf("node %d not in metadata yet (%d brokers listed)", k.nodeID(), len(brokers))
	}
	// A restarted node is listed before the controller has made it the leader of its partitions
	// again: a client that writes at once meets "no leader" (a clean-clone run failed the chaos
	// workload's broker-stop test so).
	parts, err := conn.ReadPartitions()
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	for _, p := range parts {
		mine := slices.ContainsFunc(p.Replicas, func(b kafka.Broker) bool { return b.ID == k.nodeID() })
		if mine && p.Leader.Host == "" {
			return fmt.Errorf("partition %s/%d without a leader yet", p.Topic, p.ID)
		}
	}
	return nil
}

// Stop shuts the broker down (SIGTERM: controlled shutdown), SIGKILL after 30s.
func (k *Kafka) Stop(ctx context.Context) error {
	err := k.stop(ctx, syscall.SIGTERM, 30*time.Second)
	if err == nil {
		_ = os.Remove(k.pidFile)
	}
	return err
}

// Pause SIGSTOPs the broker: the kernel still accepts connections but nothing answers.
func (k *Kafka) Pause() error { return k.signal(syscall.SIGSTOP) }

// Resume SIGCONTs a paused broker.
func (k *Kafka) Resume() error { return k.signal(syscall.SIGCONT) }

func (k *Kafka) signal(sig syscall.Signal) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.current()
	if p == nil {
		return fmt.Errorf("kafka %v: broker not running", sig)
	}
	return p.pauseSignal(sig)
}

// Close stops the broker and removes its directory unless Keep was set.
func (k *Kafka) Close(ctx context.Context) error {
	return k.close(func() error { return k.Stop(ctx) })
}

// CreateTopic creates a topic (the broker's default.replication.factor: 1 unless Settings name
// another) and waits until every partition has a
// leader, so producing right away does not hit LEADER_NOT_AVAILABLE.
func (k *Kafka) CreateTopic(ctx context.Context, name string, partitions int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// kafka.Client sends CreateTopics to the controller the metadata names.
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers())}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: name, NumPartitions: partitions, ReplicationFactor: -1}}})
	if err == nil {
		err = resp.Errors[name]
	}
	if err != nil {
		return fmt.Errorf("kafka create topic %s: %w", name, err)
	}
	for {
		meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{name}})
		if err == nil && len(meta.Topics) == 1 && allLed(meta.Topics[0].Partitions, partitions) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafka create topic %s: partitions without leader: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func allLed(parts []kafka.Partition, want int) bool {
	for _, p := range parts {
		if p.Leader.ID < 0 || p.Leader.Host == "" {
			return false
		}
	}
	return len(parts) == want
}
