package devenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RegistryVersion is the Apicurio Registry release scripts/registry-lib.sh unpacks.
const RegistryVersion = "2.6.13.Final"

// ErrRegistryLibMissing means the schema registry has not been unpacked.
var ErrRegistryLibMissing = errors.New("schema registry missing: run `make registry-lib`")

// DefaultRegistryLib is where scripts/registry-lib.sh unpacks the registry: $OUTBOX_REGISTRY_LIB
// or ~/.cache/outbox-relay/apicurio-registry-<RegistryVersion>.
func DefaultRegistryLib() string {
	if lib := os.Getenv("OUTBOX_REGISTRY_LIB"); lib != "" {
		return lib
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "outbox-relay", "apicurio-registry-"+RegistryVersion)
}

// RegistryLibReady checks for the stamp registry-lib.sh writes last into a complete folder.
func RegistryLibReady(lib string) error {
	if _, err := os.Stat(filepath.Join(lib, ".complete")); err != nil {
		return fmt.Errorf("%w (looked in %s)", ErrRegistryLibMissing, lib)
	}
	return nil
}

// RegistryOptions configures StartRegistry; zero values mean the defaults in the comments.
type RegistryOptions struct {
	Dir    string // instance directory; a fresh temp dir
	Port   int    // HTTP port on 127.0.0.1; a free one
	HeapMB int    // JVM -Xmx; 384
	Lib    string // the unpacked registry; DefaultRegistryLib()
	// TLSCertFile and TLSKeyFile (PEM, both or neither) add an HTTPS port beside the HTTP one:
	// TLSURL.
	TLSCertFile, TLSKeyFile string
	// TLSCAFile is the CA that signed TLSCertFile, for clients: TLSCAFile() returns it.
	TLSCAFile string
	TLSPort   int               // HTTPS port on 127.0.0.1; a free one
	Settings  map[string]string // extra system properties (-Dkey=value), e.g. Quarkus or Apicurio settings
	Keep      bool              // Close stops but keeps the directory
	Detached  bool              // the registry outlives this process (make up)
}

// Registry is an Apicurio Registry whose storage (H2, the in-memory variant's database) is a file in
// its directory: like a production registry, a stopped and started one still has its schemas and
// ids, so a registry outage can be played without the ids changing under the relay's cache. Its
// Confluent-compatible API is at ConfluentURL(). Its global compatibility rule is NONE, unlike
// Confluent's BACKWARD: tests set the rule per subject (PUT /config/{subject}).
type Registry struct {
	service
	st registryState
}

// registryState is persisted in <dir>/devenv.json for AttachRegistry.
type registryState struct {
	Port     int               `json:"port"`
	TLSPort  int               `json:"tls_port,omitempty"`
	TLSCert  string            `json:"tls_cert,omitempty"`
	TLSKey   string            `json:"tls_key,omitempty"`
	TLSCA    string            `json:"tls_ca,omitempty"`
	HeapMB   int               `json:"heap_mb"`
	Lib      string            `json:"lib"`
	Settings map[string]string `json:"settings,omitempty"`
}

// StartRegistry starts a schema registry in a new directory and waits until it is ready.
func StartRegistry(ctx context.Context, opts RegistryOptions) (*Registry, error) {
	st := registryState{Port: opts.Port, TLSPort: opts.TLSPort, TLSCert: opts.TLSCertFile, TLSKey: opts.TLSKeyFile, TLSCA: opts.TLSCAFile,
		HeapMB: cmp.Or(opts.HeapMB, 384), Lib: cmp.Or(opts.Lib, DefaultRegistryLib()), Settings: opts.Settings}
	if err := RegistryLibReady(st.Lib); err != nil {
		return nil, err
	}
	if (st.TLSCert == "") != (st.TLSKey == "") {
		return nil, errors.New("registry: TLSCertFile and TLSKeyFile go together: set both or neither")
	}
	for k, v := range st.Settings {
		if k == "" || strings.ContainsAny(k+v, "\n\r\x00") {
			return nil, fmt.Errorf("registry: invalid setting %q=%q", k, v)
		}
	}
	dir, err := newDir(opts.Dir, "outbox-registry-")
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	r := newRegistry(dir, st)
	r.detached, r.keep = opts.Detached, opts.Keep
	if err := r.create(ctx); err != nil {
		if !opts.Keep {
			_ = r.Close(context.Background())
		}
		return nil, err
	}
	return r, nil
}

// AttachRegistry opens a registry created earlier, maybe by another process (make down). Its
// Start runs detached; its Close removes the directory.
func AttachRegistry(dir string) (*Registry, error) {
	var st registryState
	dir, err := readState(dir, &st)
	if err != nil {
		return nil, err
	}
	r := newRegistry(dir, st)
	r.detached = true
	return r, nil
}

func newRegistry(dir string, st registryState) *Registry {
	// The JVM's temporary directory is the instance's own: Quarkus and Vert.x write there, and
	// its path in the command line tells this registry's process from any other (pid reuse).
	return &Registry{st: st, service: service{name: "registry", dir: dir,
		pidFile: filepath.Join(dir, "registry.pid"), writePid: true, needle: "-Djava.io.tmpdir=" + filepath.Join(dir, "tmp")}}
}

func (r *Registry) create(ctx context.Context) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	r.st.Port = cmp.Or(r.st.Port, ports[0])
	if r.st.TLSCert != "" {
		r.st.TLSPort = cmp.Or(r.st.TLSPort, ports[1])
	} else {
		r.st.TLSPort = 0
	}
	if err := os.MkdirAll(filepath.Join(r.dir, "tmp"), 0o755); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	if err := writeState(r.dir, r.st); err != nil {
		return fmt.Errorf("registry state: %w", err)
	}
	return r.Start(ctx)
}

// URL returns the registry's base URL, "http://127.0.0.1:<port>".
func (r *Registry) URL() string { return "http://127.0.0.1:" + strconv.Itoa(r.st.Port) }

// ConfluentURL returns the base URL of the Confluent-compatible API, the one a Confluent
// client (and the relay) is given: URL()+"/apis/ccompat/v7".
func (r *Registry) ConfluentURL() string { return r.URL() + "/apis/ccompat/v7" }

// TLSURL returns the HTTPS base URL of the Confluent-compatible API,
// "https://127.0.0.1:<port>/apis/ccompat/v7", or "" when the registry was started without TLS.
func (r *Registry) TLSURL() string {
	if r.st.TLSPort == 0 {
		return ""
	}
	return "https://127.0.0.1:" + strconv.Itoa(r.st.TLSPort) + "/apis/ccompat/v7"
}

// TLSCAFile returns the CA certificate file given as RegistryOptions.TLSCAFile.
func (r *Registry) TLSCAFile() string { return r.st.TLSCA }

// Port returns the HTTP port.
func (r *Registry) Port() int { return r.st.Port }

func (r *Registry) args() []string {
	props := map[string]string{
		"java.io.tmpdir":    filepath.Join(r.dir, "tmp"),
		"quarkus.http.host": "127.0.0.1",
		"quarkus.http.port": strconv.Itoa(r.st.Port),
		// The storage outlives a restart (see Registry). One connection at start instead of 20:
		// the registry serves a few requests per test.
		"quarkus.datasource.jdbc.url":          "jdbc:h2:file:" + filepath.Join(r.dir, "data", "registry_db"),
		"quarkus.datasource.jdbc.initial-size": "1",
		"quarkus.datasource.jdbc.min-size":     "1",
		"quarkus.datasource.jdbc.max-size":     "10",
		"quarkus.banner.enabled":               "false",
		"quarkus.log.console.color":            "false",
	}
	if r.st.TLSPort != 0 {
		props["quarkus.http.ssl-port"] = strconv.Itoa(r.st.TLSPort)
		props["quarkus.http.ssl.certificate.files"] = r.st.TLSCert
		props["quarkus.http.ssl.certificate.key-files"] = r.st.TLSKey
	}
	maps.Copy(props, r.st.Settings)
	// The serial collector, a small initial heap and the quick compiler only: the registry serves
	// a few requests per test on a loaded two-core machine, where G1's threads and C2's
	// compilations would only compete with the servers under test and slow its start.
	args := []string{"-Xms64m", fmt.Sprintf("-Xmx%dm", r.st.HeapMB), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Djava.awt.headless=true"}
	for _, k := range slices.Sorted(maps.Keys(props)) {
		args = append(args, "-D"+k+"="+props[k])
	}
	return append(args, "-jar", filepath.Join(r.st.Lib, "apicurio-registry-app-"+RegistryVersion+"-runner.jar"))
}

// Start starts the registry (same ports, same storage) unless it runs, and waits until it is
// ready (90s at most).
func (r *Registry) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	spec := spawnSpec{path: "java", args: r.args(), dir: r.dir, deathSig: syscall.SIGKILL}
	return r.start(ctx, spec, 90*time.Second, r.ping)
}

// ping succeeds once the registry calls itself ready and its Confluent-compatible API answers.
func (r *Registry) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for _, u := range []string{r.URL() + "/health/ready", r.ConfluentURL() + "/subjects"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", u, resp.Status)
		}
	}
	if r.st.TLSPort != 0 {
		// The HTTPS listener opens with the HTTP one; a test that starts with it must not race it.
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(r.st.TLSPort))
		if err != nil {
			return fmt.Errorf("HTTPS port: %w", err)
		}
		conn.Close()
	}
	return nil
}

// Stop shuts the registry down (SIGTERM), SIGKILL after 15s; Start brings it back with its
// schemas.
func (r *Registry) Stop(ctx context.Context) error {
	err := r.stop(ctx, syscall.SIGTERM, 15*time.Second)
	if err == nil {
		_ = os.Remove(r.pidFile)
	}
	return err
}

// Pause SIGSTOPs the registry: the kernel still accepts connections but nothing answers.
func (r *Registry) Pause() error { return r.signal(syscall.SIGSTOP) }

// Resume SIGCONTs a paused registry.
func (r *Registry) Resume() error { return r.signal(syscall.SIGCONT) }

func (r *Registry) signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.current()
	if p == nil {
		return fmt.Errorf("registry %v: not running", sig)
	}
	return p.pauseSignal(sig)
}

// Close stops the registry and removes its directory unless Keep was set.
func (r *Registry) Close(ctx context.Context) error {
	return r.close(func() error { return r.Stop(ctx) })
}

// SetCompatibility sets subject's compatibility rule (BACKWARD, FORWARD, FULL, NONE, or a
// _TRANSITIVE one) through the Confluent-compatible API. Apicurio's global default is NONE, which
// accepts any change: a test of schema evolution sets the rule it means.
func (r *Registry) SetCompatibility(ctx context.Context, subject, level string) error {
	body := strings.NewReader(fmt.Sprintf(`{"compatibility":%q}`, level))
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, r.ConfluentURL()+"/config/"+url.PathEscape(subject), body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("registry: set compatibility of %s: %w", subject, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("registry: set compatibility of %s to %s: %s: %s", subject, level, resp.Status, msg)
	}
	return nil
}
