package schemaregistry_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testpki"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/schemaregistry"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func avro(fields ...string) sr.Schema {
	return sr.Schema{Type: sr.TypeAvro,
		Schema: `{"type":"record","name":"Order","namespace":"shop","fields":[` + strings.Join(fields, ",") + `]}`}
}

const (
	idField    = `{"name":"id","type":"string"}`
	noteField  = `{"name":"note","type":["null","string"],"default":null}`
	totalField = `{"name":"total","type":"long"}`
)

// newClient returns a client of o with fresh metrics, closed at t's end.
func newClient(t *testing.T, o schemaregistry.Options) (*schemaregistry.Client, *metrics.Metrics) {
	t.Helper()
	m := metrics.New(prometheus.NewRegistry())
	up, requests := m.SchemaRegistryMetrics()
	o.Metrics = &schemaregistry.Metrics{Up: up, Requests: requests}
	// A cold registry on a loaded machine can take longer than DefaultTimeout to answer its first
	// requests; a test that is about timeouts sets its own.
	o.Timeout = cmp.Or(o.Timeout, time.Minute)
	c, err := schemaregistry.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, m
}

func requests(m *metrics.Metrics, outcome string) float64 {
	return testutil.ToFloat64(m.SchemaRegistryRequests.WithLabelValues(outcome))
}

func subject(t *testing.T) string { return testenv.UniqueName(t, "orders") + "-value" }

func TestRegisteredIdsAndSchemasAreServedFromTheCacheAfterTheFirstRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := testenv.SharedRegistry(t)
	c, m := newClient(t, schemaregistry.Options{URLs: []string{reg.ConfluentURL()}})
	subj := subject(t)
	if err := reg.SetCompatibility(ctx, subj, "BACKWARD"); err != nil {
		t.Fatal(err)
	}

	v1 := avro(idField)
	id1, err := c.Register(ctx, subj, v1)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if id, err := c.Register(ctx, subj, v1); err != nil || id != id1 {
			t.Fatalf("Register again = %d, %v; want %d", id, err, id1)
		}
	}
	if got := requests(m, "ok"); got != 1 {
		t.Fatalf("%v requests for 101 registrations of one schema, want 1", got)
	}

	// A compatible change is a new version with a new id.
	v2 := avro(idField, noteField)
	id2, err := c.Register(ctx, subj, v2)
	if err != nil || id2 == id1 {
		t.Fatalf("Register(compatible change) = %d, %v; want a new id", id2, err)
	}
	latest, err := c.Latest(ctx, subj)
	if err != nil || latest.ID != id2 || latest.Version != 2 {
		t.Fatalf("Latest = %+v, %v; want id %d version 2", latest, err, id2)
	}
	first, err := c.Version(ctx, subj, 1)
	if err != nil || first.ID != id1 {
		t.Fatalf("Version 1 = %+v, %v; want id %d", first, err, id1)
	}
	before := requests(m, "ok")
	for range 10 {
		if _, err := c.Latest(ctx, subj); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Version(ctx, subj, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := c.SchemaByID(ctx, id2); err != nil {
			t.Fatal(err)
		}
	}
	if got := requests(m, "ok"); got != before {
		t.Fatalf("%v requests for cached reads, want none", got-before)
	}

	// A consumer knows only the URL and the id in the frame.
	consumer, _ := newClient(t, schemaregistry.Options{URLs: []string{reg.ConfluentURL()}})
	got, err := consumer.SchemaByID(ctx, id1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Type != sr.TypeAvro || !strings.Contains(got.Schema, `"name":"Order"`) || strings.Contains(got.Schema, "note") {
		t.Fatalf("SchemaByID(%d) = %+v, want version 1 of the Order record", id1, got)
	}
}

func TestLatestIsAskedAgainAfterItsTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := testenv.SharedRegistry(t)
	c, _ := newClient(t, schemaregistry.Options{URLs: []string{reg.ConfluentURL()}, LatestTTL: 50 * time.Millisecond})
	other, _ := newClient(t, schemaregistry.Options{URLs: []string{reg.ConfluentURL()}})
	subj := subject(t)
	if _, err := other.Register(ctx, subj, avro(idField)); err != nil {
		t.Fatal(err)
	}
	if ss, err := c.Latest(ctx, subj); err != nil || ss.Version != 1 {
		t.Fatalf("Latest = %+v, %v; want version 1", ss, err)
	}
	// The application's team registers a new version: the relay picks it up after the TTL.
	if _, err := other.Register(ctx, subj, avro(idField, noteField)); err != nil {
		t.Fatal(err)
	}
	await.True(t, 10*time.Second, "Latest returns version 2", func() bool {
		ss, err := c.Latest(ctx, subj)
		return err == nil && ss.Version == 2
	})
}

func TestErrorsSayWhatToDoAndWhetherToRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := testenv.SharedRegistry(t)
	c, m := newClient(t, schemaregistry.Options{URLs: []string{reg.ConfluentURL()}})
	subj := subject(t)
	if err := reg.SetCompatibility(ctx, subj, "BACKWARD"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Register(ctx, subj, avro(idField)); err != nil {
		t.Fatal(err)
	}
	closedPort := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return "http://" + l.Addr().String()
	}()
	noAPI, _ := newClient(t, schemaregistry.Options{URLs: []string{reg.URL()}}) // without /apis/ccompat/v7
	down, _ := newClient(t, schemaregistry.Options{URLs: []string{closedPort}})

	tests := []struct {
		name        string
		call        func() error
		unavailable bool
		incompat    bool
		notFound    bool
		says        []string
	}{
		{"a new required field without a default breaks BACKWARD: incompatible, naming the subject and the fix",
			func() error { _, err := c.Register(ctx, subj, avro(idField, totalField)); return err },
			false, true, false, []string{`subject "` + subj + `"`, "409", "make the change compatible"}},
		{"the latest schema of a subject that has none: not found, saying to register one",
			func() error { _, err := c.Latest(ctx, subject(t)); return err },
			false, false, true, []string{"404", "register one", "auto_register"}},
		{"a version the subject does not have: not found, saying to pin one it has",
			func() error { _, err := c.Version(ctx, subj, 99); return err },
			false, false, true, []string{"version 99", "pin one it has"}},
		{"a schema id nobody registered: not found",
			func() error { _, err := c.SchemaByID(ctx, 987654); return err },
			false, false, true, []string{"schema id 987654", "no schema with this id"}},
		{"a schema the registry cannot parse: neither retried nor incompatible",
			func() error {
				_, err := c.Register(ctx, subject(t), sr.Schema{Type: sr.TypeAvro, Schema: `{"type":"record","name":`})
				return err
			},
			false, false, false, []string{"register a schema", "subject"}},
		{"a URL that is not the Confluent-compatible API: held as unavailable, naming the path to use",
			func() error { _, err := noAPI.Latest(ctx, subj); return err },
			true, false, false, []string{"schema_registry.urls", "/apis/ccompat/v7"}},
		{"nothing listening: unavailable",
			func() error { _, err := down.SchemaByID(ctx, 1); return err },
			true, false, false, []string{"read a schema by id", `Get "http://127.0.0.1:`, "connection refused"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if err == nil {
				t.Fatal("no error")
			}
			if got := schemaregistry.IsUnavailable(err); got != tt.unavailable {
				t.Errorf("IsUnavailable = %v, want %v: %v", got, tt.unavailable, err)
			}
			if got := schemaregistry.IsIncompatible(err); got != tt.incompat {
				t.Errorf("IsIncompatible = %v, want %v: %v", got, tt.incompat, err)
			}
			if got := schemaregistry.IsNotFound(err); got != tt.notFound {
				t.Errorf("IsNotFound = %v, want %v: %v", got, tt.notFound, err)
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "unable to") {
				t.Errorf("error %q is more than one line, or repeats the URL (sr's preamble)", err)
			}
		})
	}
	// The registry answered each of c's requests: it stays up.
	if h := c.Health(); !h.Up {
		t.Fatalf("health after answered requests = %+v, want up", h)
	}
	if requests(m, "incompatible") != 1 || requests(m, "not_found") != 3 || requests(m, "rejected") != 1 {
		t.Fatalf("requests by outcome: incompatible %v, not_found %v, rejected %v; want 1, 3, 1",
			requests(m, "incompatible"), requests(m, "not_found"), requests(m, "rejected"))
	}
}

func TestHTTPSWithTheRegistrysOwnCA(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := testenv.SharedRegistry(t)
	c, _ := newClient(t, schemaregistry.Options{URLs: []string{reg.TLSURL()}, CAFile: reg.TLSCAFile()})
	if _, err := c.Register(ctx, subject(t), avro(idField)); err != nil {
		t.Fatalf("register over HTTPS with the CA: %v", err)
	}
	// Without the CA, the system's roots do not know the certificate: unavailable, saying why.
	noCA, _ := newClient(t, schemaregistry.Options{URLs: []string{reg.TLSURL()}})
	_, err := noCA.Register(ctx, subject(t), avro(idField))
	if !schemaregistry.IsUnavailable(err) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("register over HTTPS without the CA: %v; want unavailable naming the certificate", err)
	}
}

func TestOptionsRefusedAtStartNameTheKey(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		o    schemaregistry.Options
		says string
	}{
		{"no URL", schemaregistry.Options{}, "schema_registry.urls: empty"},
		{"a URL with a password in it", schemaregistry.Options{URLs: []string{"http://u:hunter2@reg:8081"}}, "schema_registry.password_file"},
		{"a URL of another scheme", schemaregistry.Options{URLs: []string{"ftp://reg"}}, "want http(s)://"},
		{"a user without a password file", schemaregistry.Options{URLs: []string{"http://reg"}, Username: "relay"}, "go together"},
		{"basic auth and a token", schemaregistry.Options{URLs: []string{"http://reg"}, Username: "relay", PasswordFile: pw, BearerTokenFile: pw}, "set one, not both"},
		{"an empty password file", schemaregistry.Options{URLs: []string{"http://reg"}, Username: "relay", PasswordFile: empty}, "schema_registry.password_file"},
		{"a missing token file", schemaregistry.Options{URLs: []string{"http://reg"}, BearerTokenFile: filepath.Join(dir, "nope")}, "schema_registry.bearer_token_file"},
		{"a CA file without a certificate", schemaregistry.Options{URLs: []string{"https://reg"}, CAFile: pw}, "schema_registry.ca_file"},
		{"a client certificate without its key", schemaregistry.Options{URLs: []string{"https://reg"}, CertFile: pw}, "schema_registry.key_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := schemaregistry.New(tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("New = %v, want an error saying %q", err, tt.says)
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "secret") {
				t.Fatalf("error %q shows a secret", err)
			}
		})
	}
}

// authProxy is the real registry behind a gate that wants the given Authorization header (a
// registry with authentication, which Apicurio offers only with an identity server).
func authProxy(t *testing.T, target string, want func(*http.Request) bool) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !want(r) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error_code":401,"message":"Unauthorized"}`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestCredentialsAreReadFromTheirFilesForEveryRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := testenv.SharedRegistry(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	tests := []struct {
		name       string
		options    func(file string) schemaregistry.Options
		valid      func(*http.Request) bool
		old, fresh string
	}{
		{"basic auth",
			func(file string) schemaregistry.Options {
				return schemaregistry.Options{Username: "relay", PasswordFile: file}
			},
			func(r *http.Request) bool { u, p, ok := r.BasicAuth(); return ok && u == "relay" && p == "rotated-pw" },
			"old-pw\n", "rotated-pw\n"},
		{"a bearer token",
			func(file string) schemaregistry.Options { return schemaregistry.Options{BearerTokenFile: file} },
			func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer rotated-token" },
			"old-token", "rotated-token\n"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := write(fmt.Sprint("secret", i), tt.old)
			o := tt.options(file)
			o.URLs = []string{authProxy(t, reg.ConfluentURL(), tt.valid)}
			c, m := newClient(t, o)
			subj := subject(t)

			_, err := c.Register(ctx, subj, avro(idField))
			if !schemaregistry.IsUnavailable(err) || !strings.Contains(err.Error(), "refused the credentials") {
				t.Fatalf("with the old secret: %v; want unavailable (held) saying the credentials were refused", err)
			}
			if strings.Contains(err.Error(), "old-") {
				t.Fatalf("error %q shows the secret", err)
			}
			if h := c.Health(); h.Up || testutil.ToFloat64(m.SchemaRegistryUp.WithLabelValues()) != 0 {
				t.Fatalf("health %+v after a refusal, want down (and the gauge 0)", h)
			}

			// The Secret is rotated in place: the next request uses it, no new client.
			write(fmt.Sprint("secret", i), tt.fresh)
			if _, err := c.Register(ctx, subj, avro(idField)); err != nil {
				t.Fatalf("with the rotated secret: %v", err)
			}
			if h := c.Health(); !h.Up || testutil.ToFloat64(m.SchemaRegistryUp.WithLabelValues()) != 1 {
				t.Fatalf("health %+v after a success, want up (and the gauge 1)", h)
			}

			// The Secret is unmounted for a moment: the request waits (unavailable), naming the key.
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
			_, err = c.Register(ctx, subject(t), avro(idField))
			if !schemaregistry.IsUnavailable(err) || !strings.Contains(err.Error(), "schema_registry.") || !strings.Contains(err.Error(), "remount") {
				t.Fatalf("with the file gone: %v; want unavailable naming the key and the fix", err)
			}
		})
	}
}

func TestServerErrorsAndThrottlingAreUnavailableAndTheProbeSeesTheRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := testenv.SharedRegistry(t)
	u, _ := url.Parse(reg.ConfluentURL())
	proxy := httputil.NewSingleHostReverseProxy(u)
	status := make(chan int, 1)
	status <- http.StatusServiceUnavailable
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := <-status
		status <- code
		if code != 0 {
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error_code":%d,"message":"busy"}`, code*100+3)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	defer srv.Close()
	set := func(code int) { <-status; status <- code }

	c, m := newClient(t, schemaregistry.Options{URLs: []string{srv.URL}})
	subj := subject(t)
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusInternalServerError, http.StatusTooManyRequests, http.StatusRequestTimeout} {
		set(code)
		_, err := c.Register(ctx, subj, avro(idField))
		if !schemaregistry.IsUnavailable(err) || !strings.Contains(err.Error(), fmt.Sprint(code)) {
			t.Fatalf("answer %d: %v; want unavailable naming the status", code, err)
		}
	}
	if h := c.Health(); h.Up || !strings.Contains(h.Reason, "408") {
		t.Fatalf("Health() = %+v; want down, saying why (the last answer, 408)", h)
	}
	if got := requests(m, "unavailable"); got < 4 {
		t.Fatalf("unavailable requests = %v, want at least 4", got)
	}

	// The registry recovers while nobody asks it: the client's own probe brings health back.
	set(0)
	await.True(t, 20*time.Second, "health comes back without a request of ours", func() bool { return c.Health().Up })

}

func TestARegistryOutageHoldsOnlyWhatTheCachesCannotAnswer(t *testing.T) {
	t.Parallel() // its own registry starts while the other tests use the shared one
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := testenv.Registry(t) // its own: this test stops it
	c, m := newClient(t, schemaregistry.Options{URLs: []string{reg.ConfluentURL()}, LatestTTL: time.Millisecond})
	subj := subject(t)
	known := avro(idField)
	id, err := c.Register(ctx, subj, known)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Latest(ctx, subj); err != nil {
		t.Fatal(err)
	}

	// A registry that accepts connections and answers nothing (frozen) costs one Timeout per
	// request, not a hung stream.
	if err := reg.Pause(); err != nil {
		t.Fatal(err)
	}
	impatient, _ := newClient(t, schemaregistry.Options{URLs: []string{reg.ConfluentURL()}, Timeout: 300 * time.Millisecond})
	start := time.Now()
	_, err = impatient.SchemaByID(ctx, id)
	if took := time.Since(start); !schemaregistry.IsUnavailable(err) || !strings.Contains(err.Error(), "Timeout") || took > 5*time.Second {
		t.Fatalf("SchemaByID from a frozen registry: %v after %v; want unavailable, a timeout, within 300ms or so", err, took)
	}
	if err := reg.Resume(); err != nil {
		t.Fatal(err)
	}

	if err := reg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// What the caches hold needs no registry: the stream goes on.
	if got, err := c.Register(ctx, subj, known); err != nil || got != id {
		t.Fatalf("Register(cached) during the outage = %d, %v; want %d", got, err, id)
	}
	if got, err := c.SchemaByID(ctx, id); err != nil || got.Schema != known.Schema {
		t.Fatalf("SchemaByID(cached) during the outage = %+v, %v", got, err)
	}
	// A latest past its TTL is asked for, and served stale when nothing answers.
	if ss, err := c.Latest(ctx, subj); err != nil || ss.ID != id {
		t.Fatalf("Latest during the outage = %+v, %v; want the cached one", ss, err)
	}
	if h := c.Health(); h.Up || !strings.Contains(h.Reason, "connection refused") {
		t.Fatalf("health after a refused request = %+v, want down, saying why", h)
	}
	if st := c.Status(ctx); st.Up || !strings.Contains(st.Error, "check the registry") || st.URLs[0] != reg.ConfluentURL() {
		t.Fatalf("Status during the outage = %+v, want down with the check's error", st)
	}
	// A new schema needs the registry: unavailable, to be retried.
	if _, err := c.Register(ctx, subj, avro(idField, noteField)); !schemaregistry.IsUnavailable(err) {
		t.Fatalf("Register(new) during the outage: %v, want unavailable", err)
	}
	if got := testutil.ToFloat64(m.SchemaRegistryUp.WithLabelValues()); got != 0 {
		t.Fatalf("outbox_relay_schema_registry_up = %v during the outage, want 0", got)
	}

	// Back, with its schemas (a registry's storage outlives it): the probe notices by itself.
	if err := reg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	await.True(t, 30*time.Second, "health comes back with the registry", func() bool { return c.Health().Up })
	if st := c.Status(ctx); !st.Up || st.Error != "" {
		t.Fatalf("Status after the outage = %+v, want up", st)
	}
	fresh, _ := newClient(t, schemaregistry.Options{URLs: []string{reg.ConfluentURL()}})
	if got, err := fresh.SchemaByID(ctx, id); err != nil || got.Schema != known.Schema {
		t.Fatalf("SchemaByID(%d) after the restart = %+v, %v; want the schema registered before", id, got, err)
	}
	if _, err := c.Register(ctx, subj, avro(idField, noteField)); err != nil {
		t.Fatalf("Register(new) after the outage: %v", err)
	}
}

func TestConcurrentMissesForOneKeyMakeOneRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := testenv.SharedRegistry(t)
	writer, _ := newClient(t, schemaregistry.Options{URLs: []string{reg.ConfluentURL()}})
	id, err := writer.Register(ctx, subject(t), avro(idField))
	if err != nil {
		t.Fatal(err)
	}

	// The real registry behind a gate that holds every request until released.
	u, _ := url.Parse(reg.ConfluentURL())
	proxy := httputil.NewSingleHostReverseProxy(u)
	arrived, release := make(chan struct{}, 100), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		proxy.ServeHTTP(w, r)
	}))
	defer srv.Close()
	c, m := newClient(t, schemaregistry.Options{URLs: []string{srv.URL}})

	const readers = 20
	errs := make(chan error, readers)
	for range readers {
		go func() {
			s, err := c.SchemaByID(ctx, id)
			if err == nil && !strings.Contains(s.Schema, "Order") {
				err = fmt.Errorf("SchemaByID(%d) = %+v", id, s)
			}
			errs <- err
		}()
	}
	<-arrived
	// A caller whose context ends leaves at once; the request goes on for the others.
	impatient, cancel := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() { _, err := c.SchemaByID(impatient, id); left <- err }()
	cancel()
	if err := <-left; err == nil || !strings.Contains(err.Error(), "context canceled") || schemaregistry.IsUnavailable(err) {
		t.Fatalf("a cancelled caller got %v, want its context's error (not unavailability)", err)
	}
	close(release)
	for range readers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := len(arrived); n != 0 {
		t.Fatalf("%d more requests reached the registry, want the one", n)
	}
	if got := requests(m, "ok"); got != 1 {
		t.Fatalf("%v requests recorded, want 1", got)
	}
	if h := c.Health(); !h.Up {
		t.Fatalf("health %+v: a caller's cancelled context says nothing of the registry", h)
	}
}

func TestTheNextURLIsAskedWhenOneGivesNoAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := testenv.SharedRegistry(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	c, _ := newClient(t, schemaregistry.Options{URLs: []string{dead, reg.ConfluentURL()}})
	if _, err := c.Register(ctx, subject(t), avro(idField)); err != nil {
		t.Fatalf("Register with the first URL dead: %v", err)
	}
	if h := c.Health(); !h.Up {
		t.Fatalf("health %+v, want up: the second URL answered", h)
	}
}

func TestAClientCertificateIsReadAgainForEveryHandshake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := testenv.SharedRegistry(t)
	dir := t.TempDir()
	ca := testpki.NewCA(t, "registry gate CA")
	caFile := ca.WriteCA(t, dir, "ca")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)

	// The real registry behind a gate that wants a client certificate of ca (mutual TLS).
	u, _ := url.Parse(reg.ConfluentURL())
	srv := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(u))
	pair := ca.Localhost(t)
	server, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.StartTLS()
	defer srv.Close()

	// At first the files hold a certificate of another CA.
	other := testpki.NewCA(t, "another CA").Issue(t, testpki.Leaf{CommonName: "relay", Client: true})
	files := other.Write(t, dir, "client")
	c, _ := newClient(t, schemaregistry.Options{URLs: []string{srv.URL}, CAFile: caFile, CertFile: files.Cert, KeyFile: files.Key})
	if _, err := c.Register(ctx, subject(t), avro(idField)); !schemaregistry.IsUnavailable(err) {
		t.Fatalf("with a certificate the gate does not trust: %v, want unavailable", err)
	}
	// cert-manager renews the files in place: the next handshake uses them.
	ca.Issue(t, testpki.Leaf{CommonName: "relay", Client: true}).Write(t, dir, "client")
	if _, err := c.Register(ctx, subject(t), avro(idField)); err != nil {
		t.Fatalf("with the renewed certificate: %v", err)
	}
}

func TestAnAnswerOf200WithoutAUsableSchemaOrIdIsUnavailableNeverAnIdOfZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name, body string
		idOnly     bool // the answer a registration gets: an id, and nothing else
		text       bool // the answer to a request by id: a schema's text
	}{
		{name: "an empty object", body: `{}`},
		{name: "an id of zero", body: `{"id":0,"subject":"s","version":1,"schema":"\"string\""}`, text: true},
		{name: "a schema without its text", body: `{"id":7,"subject":"s","version":1}`, idOnly: true},
		{name: "a page that is not JSON", body: `<html>maintenance</html>`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, tc.body)
			}))
			defer srv.Close()
			c, _ := newClient(t, schemaregistry.Options{URLs: []string{srv.URL}})
			id, err := c.Register(ctx, "orders-value", avro(idField))
			if tc.idOnly && (err != nil || id != 7) {
				t.Errorf("Register = id %d, %v; want id 7", id, err)
			} else if !tc.idOnly && !schemaregistry.IsUnavailable(err) {
				t.Errorf("Register = id %d, %v; want unavailable (a frame with that id would be garbage)", id, err)
			}
			ss, err := c.Latest(ctx, "orders-value")
			if !schemaregistry.IsUnavailable(err) {
				t.Errorf("Latest = %+v, %v; want unavailable", ss, err)
			}
			ss, err = c.Version(ctx, "orders-value", 1)
			if !schemaregistry.IsUnavailable(err) {
				t.Errorf("Version = %+v, %v; want unavailable", ss, err)
			}
			if tc.idOnly || tc.text {
				return // SchemaByID's answer (or the id just registered) is a schema
			}
			s, err := c.SchemaByID(ctx, 7)
			if !schemaregistry.IsUnavailable(err) {
				t.Errorf("SchemaByID = %+v, %v; want unavailable", s, err)
			}
		})
	}
}
