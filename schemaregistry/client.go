// Package schemaregistry is the relay's and the consumers' client of a Confluent-compatible schema
// registry (Confluent Schema Registry, Apicurio Registry's /apis/ccompat/v7, Karapace, Redpanda).
// It wraps franz-go's pkg/sr with what the relay needs around it:
//
//   - Base URLs tried in order (the next one when a request gets no answer at all), basic auth or a
//     bearer token read from files for every request (a rotated Secret is used at the next request,
//     no restart), TLS with a CA of its own and an optional client certificate, and a timeout per
//     request (Options.Timeout).
//   - Caches, so the hot path makes no round trip: (subject, schema) -> id for Register, id ->
//     schema for SchemaByID and (subject, version) -> schema for Version (ids and versions never
//     change meaning), and the latest schema of a subject for Options.LatestTTL, served stale while
//     the registry cannot be reached (it is still a registered schema).
//   - Errors in classes a caller acts on (Class): IsUnavailable (nothing answered, 5xx, 408, 429,
//     and answers that refuse the relay itself rather than the event: 401, 403, a URL with no
//     registry API; retry with backoff while the stream holds), IsIncompatible (409 on register:
//     the event goes to the failure policy as schema_incompatible), IsNotFound, and the rest of the
//     4xx range; each error is one line naming the operation, the subject and the fix, and never a
//     credential.
//   - Health: up or down with the reason, from every request's outcome; while down, the client
//     probes the registry itself (with backoff) so that health comes back when the registry does,
//     also while nothing needs it. Health feeds the metrics outbox_relay_schema_registry_up and
//     outbox_relay_schema_registry_requests_total{outcome}, the alert
//     OutboxRelaySchemaRegistryDown; Status asks the registry now, for a status report. /readyz
//     names a wait for the registry where one happens: in the sink, whose events wait.
//
// Why 401 and 403 hold the stream instead of sending the event to the failure policy: they are the
// registry's verdict on the relay's credentials, the same for every event; dead-lettering every
// event until an operator fixes a Secret would scatter the stream, while holding it loses nothing
// and the metric, the alert, /readyz (once events wait) and the log say what to fix.
package schemaregistry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"
)

// Defaults of Options.
const (
	// DefaultTimeout bounds one request to one URL: a registry answers a cached lookup in
	// milliseconds, and one slower than this is treated as down (the caller retries) rather than
	// holding the stream on one request.
	DefaultTimeout = 10 * time.Second
	// DefaultCacheSize bounds each cache. Inferred schemas of one subject differ only when the
	// payloads' shapes do, so thousands of entries mean a payload with ever new field names.
	DefaultCacheSize = 10000
	// DefaultLatestTTL is how long Latest serves a subject's latest schema from the cache: a new
	// version registered by the application's team is picked up within a minute, without a
	// round trip per event.
	DefaultLatestTTL = time.Minute
)

// probeBackoff bounds the pause between the probes of a client whose registry is down.
const (
	probeFirst = 500 * time.Millisecond
	probeMax   = 15 * time.Second
)

// Options configures a Client; zero values mean the defaults in the comments.
type Options struct {
	// URLs are base URLs of the registry's Confluent-compatible API, tried in order for each
	// request (the next one only when the one before gave no answer at all). Required.
	URLs []string
	// Username and PasswordFile: basic auth, the password read from the file for every request.
	Username     string
	PasswordFile string
	// BearerTokenFile: a bearer token read from the file for every request (instead of basic
	// auth).
	BearerTokenFile string
	// CAFile is the PEM bundle that https URLs' certificates are checked against; the system's
	// roots when empty. CertFile and KeyFile are a client certificate for mutual TLS (both or
	// neither), read again for every handshake.
	CAFile, CertFile, KeyFile string
	// Timeout bounds one request to one URL; DefaultTimeout.
	Timeout time.Duration
	// CacheSize bounds each cache; DefaultCacheSize.
	CacheSize int
	// LatestTTL is how long Latest serves a subject's latest schema from the cache;
	// DefaultLatestTTL. Negative: never ask again once known.
	LatestTTL time.Duration
	// Metrics, when set, are updated with every request's outcome and the health.
	Metrics *Metrics
	// Logger logs health changes (WARN when the registry goes down, INFO when it is back); none
	// when nil.
	Logger *zap.Logger
}

// Metrics are the client's collectors (created by the relay's metrics package).
type Metrics struct {
	Up       prometheus.Gauge       // 1 while the registry answers, 0 while it is down
	Requests *prometheus.CounterVec // by outcome: ok, unavailable, incompatible, not_found, rejected
}

// Client is a schema registry client; safe for concurrent use. Close ends its probe.
type Client struct {
	sr        *sr.Client
	transport *http.Transport
	urls      []string
	latestT   time.Duration
	m         *Metrics
	log       *zap.Logger

	ids    *cache[string, int]
	byID   *cache[int, sr.Schema]
	byVer  *cache[string, sr.SubjectSchema]
	latest *cache[string, latestEntry]

	flight singleflight.Group

	mu      sync.Mutex
	health  Health
	probing bool
	closed  bool
	stop    chan struct{}
	probeWG sync.WaitGroup
}

type latestEntry struct {
	ss      sr.SubjectSchema
	fetched time.Time
}

// New returns a client for the registry of o. It reads the credential, CA and certificate files
// now, so a missing one fails the start naming its key; it sends no request (Check does).
func New(o Options) (*Client, error) {
	urls, err := checkURLs(o.URLs)
	if err != nil {
		return nil, err
	}
	auth, err := newAuthenticator(o)
	if err != nil {
		return nil, err
	}
	tlsConf, err := tlsConfig(o)
	if err != nil {
		return nil, err
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsConf
	httpClient := &http.Client{Timeout: cmp.Or(o.Timeout, DefaultTimeout), Transport: transport}
	client, err := sr.NewClient(sr.URLs(urls...), sr.HTTPClient(httpClient), sr.UserAgent("outbox-relay"),
		sr.PreReq(auth.set))
	if err != nil {
		return nil, fmt.Errorf("schema registry client: %w", err)
	}
	size := cmp.Or(o.CacheSize, DefaultCacheSize)
	c := &Client{
		sr: client, transport: transport, urls: urls, latestT: cmp.Or(o.LatestTTL, DefaultLatestTTL), m: o.Metrics,
		log:    o.Logger,
		ids:    newCache[string, int](size),
		byID:   newCache[int, sr.Schema](size),
		byVer:  newCache[string, sr.SubjectSchema](size),
		latest: newCache[string, latestEntry](size),
		health: Health{Up: true},
		stop:   make(chan struct{}),
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	c.health.Since = time.Now()
	if c.m != nil {
		c.m.Up.Set(1)
	}
	return c, nil
}

// URLs returns the base URLs the client asks, in order.
func (c *Client) URLs() []string { return append([]string(nil), c.urls...) }

// Register returns the id of schema s under subject, registering it if the subject does not have
// it yet (a new version, if the subject's compatibility rule allows it: else an error that
// IsIncompatible). The id of a (subject, schema) pair once known is served from the cache.
func (c *Client) Register(ctx context.Context, subject string, s sr.Schema) (int, error) {
	key := registerKey(subject, s)
	if id, ok := c.ids.get(key); ok {
		return id, nil
	}
	req := request{op: "register a schema", subject: subject}
	id, err := shared(ctx, c, "register\x00"+key, req, func(ctx context.Context) (int, error) {
		id, err := c.sr.RegisterSchema(ctx, subject, s, -1, -1)
		if err == nil && id <= 0 {
			err = fmt.Errorf("%w: id %d", errNoAnswer, id)
		}
		if err == nil {
			c.ids.put(key, id)
			c.byID.put(id, s)
		}
		return id, err
	})
	return id, err
}

// Latest returns subject's latest schema, from the cache while it is younger than LatestTTL. A
// stale one is served when the registry cannot be reached (it is still a registered schema: the
// stream goes on with it, and health says the registry is down).
func (c *Client) Latest(ctx context.Context, subject string) (sr.SubjectSchema, error) {
	cached, ok := c.latest.get(subject)
	if ok && (c.latestT < 0 || time.Now().Sub(cached.fetched) < c.latestT) {
		return cached.ss, nil
	}
	ss, err := c.FreshLatest(ctx, subject)
	if err != nil && ok && IsUnavailable(err) {
		return cached.ss, nil
	}
	return ss, err
}

// FreshLatest is Latest read from the registry, not the cache (the cache keeps the answer): for
// a payload that does not fit the cached latest, whose version may have been registered since.
func (c *Client) FreshLatest(ctx context.Context, subject string) (sr.SubjectSchema, error) {
	req := request{op: "read the latest schema", subject: subject}
	return shared(ctx, c, "latest\x00"+subject, req, func(ctx context.Context) (sr.SubjectSchema, error) {
		ss, err := c.sr.SchemaByVersion(ctx, subject, -1)
		if err == nil {
			err = checkSubjectSchema(ss)
		}
		if err == nil {
			c.latest.put(subject, latestEntry{ss: ss, fetched: time.Now()})
			c.byVer.put(versionKey(subject, ss.Version), ss)
			c.byID.put(ss.ID, ss.Schema)
		}
		return ss, err
	})
}

// Version returns version version (1 and up) of subject's schema, cached once read.
func (c *Client) Version(ctx context.Context, subject string, version int) (sr.SubjectSchema, error) {
	if version < 1 {
		return sr.SubjectSchema{}, fmt.Errorf("schema registry: version %d of subject %q: versions start at 1 (use Latest for the latest)", version, subject)
	}
	key := versionKey(subject, version)
	if ss, ok := c.byVer.get(key); ok {
		return ss, nil
	}
	req := request{op: "read a schema version", subject: subject, version: version}
	ss, err := shared(ctx, c, "version\x00"+key, req, func(ctx context.Context) (sr.SubjectSchema, error) {
		ss, err := c.sr.SchemaByVersion(ctx, subject, version)
		if err == nil {
			err = checkSubjectSchema(ss)
		}
		if err == nil {
			c.byVer.put(key, ss)
			c.byID.put(ss.ID, ss.Schema)
		}
		return ss, err
	})
	return ss, err
}

// SchemaByID returns the schema with id id (what a consumer reads from a record's frame), cached
// once read.
func (c *Client) SchemaByID(ctx context.Context, id int) (sr.Schema, error) {
	if s, ok := c.byID.get(id); ok {
		return s, nil
	}
	req := request{op: "read a schema by id", id: id}
	s, err := shared(ctx, c, "id\x00"+strconv.Itoa(id), req, func(ctx context.Context) (sr.Schema, error) {
		s, err := c.sr.SchemaByID(ctx, id)
		if err == nil && s.Schema == "" {
			err = fmt.Errorf("%w: no schema text", errNoAnswer)
		}
		if err == nil {
			c.byID.put(id, s)
		}
		return s, err
	})
	return s, err
}

// Check asks the registry a cheap question (the schema types it supports) and records the
// outcome in Health: for a start-up check and the status command.
func (c *Client) Check(ctx context.Context) error {
	_, err := do(ctx, c, request{op: "check the registry"}, func(ctx context.Context) ([]sr.SchemaType, error) {
		return c.sr.SupportedTypes(ctx)
	})
	return err
}

// Close ends the client's probe and its idle connections; the client must not be used afterwards.
func (c *Client) Close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.stop)
	}
	c.mu.Unlock()
	c.probeWG.Wait()
	c.transport.CloseIdleConnections()
}

// shared runs call once for every caller that asks for key while it runs: a burst of records with
// an id a consumer has not seen yet, or of events with a new schema, makes one request. call fills
// the caches itself, so that a caller arriving just after it ended finds the answer there. The
// request runs to its own end (the per-request timeout bounds it) whoever leaves: each caller waits
// under its own context.
// errNoAnswer is a 200 whose body is not the answer asked for (a proxy's or a broken registry's
// page that happens to be JSON): unavailable, like no answer, never an id of 0 or an empty schema
// in the cache and in a frame (TestAnAnswerOf200WithoutAUsableSchemaOrIdIsUnavailableNeverAnIdOfZero).
var errNoAnswer = errors.New("the registry answered 200 without the schema or id asked for")

// checkSubjectSchema refuses a version without an id or a schema text (errNoAnswer).
func checkSubjectSchema(ss sr.SubjectSchema) error {
	if ss.ID <= 0 || ss.Schema.Schema == "" {
		return fmt.Errorf("%w: id %d, %d bytes of schema", errNoAnswer, ss.ID, len(ss.Schema.Schema))
	}
	return nil
}

func shared[T any](ctx context.Context, c *Client, key string, req request, call func(context.Context) (T, error)) (T, error) {
	ch := c.flight.DoChan(key, func() (any, error) {
		return do(context.WithoutCancel(ctx), c, req, call)
	})
	var zero T
	select {
	case r := <-ch:
		if r.Err != nil {
			return zero, r.Err
		}
		return r.Val.(T), nil
	case <-ctx.Done():
		return zero, fmt.Errorf("schema registry: %s: %w", req.op, ctx.Err())
	}
}

// do runs one request, classifies its error and records the outcome.
func do[T any](ctx context.Context, c *Client, req request, call func(context.Context) (T, error)) (T, error) {
	v, err := call(ctx)
	err = classify(ctx, req, err)
	c.record(ctx, err)
	return v, err
}
