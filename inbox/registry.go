package inbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Handler applies one event inside the consumer's transaction (e.Tx). It must make every change
// through e.Tx, and record effects outside the database with e.Intend, never perform them itself.
type Handler func(ctx context.Context, e *Event) error

// Upcaster turns the payload of one schema version into the next version's (from n to n+1).
type Upcaster func(payload []byte) ([]byte, error)

// ErrUnhandled is returned for an event whose (event type, schema version) no handler takes, not
// even through upcasters. The event is not applied and its offset must not be committed: deploy a
// consumer that knows the version, and it is applied then.
var ErrUnhandled = errors.New("inbox: no handler for this event type and schema version")

type schemaKey struct {
	eventType string
	version   int
}

// Registry maps (event type, schema version) to a handler, or to an upcaster that turns the
// payload into the next schema version, so one handler can serve every older version:
//
//	reg := inbox.NewRegistry()
//	reg.Handle("OrderPlaced", 2, applyOrderPlaced)
//	reg.Upcast("OrderPlaced", 1, orderPlacedV1toV2)
//
// A version with both a handler and an upcaster goes to the handler. Register everything before
// the first Handle; a Registry is then safe for concurrent use.
type Registry struct {
	handlers  map[schemaKey]Handler
	upcasters map[schemaKey]Upcaster
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{handlers: make(map[schemaKey]Handler), upcasters: make(map[schemaKey]Upcaster)}
}

// Handle registers h for events of eventType at schemaVersion (1 for events without a
// schema_version header). Registering a key twice panics: it is a programming error.
func (r *Registry) Handle(eventType string, schemaVersion int, h Handler) *Registry {
	k := schemaKey{eventType, schemaVersion}
	if _, dup := r.handlers[k]; dup || h == nil || schemaVersion < 1 {
		panic(fmt.Sprintf("inbox: Registry.Handle(%q, %d): registered twice, nil, or a version below 1", eventType, schemaVersion))
	}
	r.handlers[k] = h
	return r
}

// Upcast registers u to turn events of eventType at schema version from into version from+1.
func (r *Registry) Upcast(eventType string, from int, u Upcaster) *Registry {
	k := schemaKey{eventType, from}
	if _, dup := r.upcasters[k]; dup || u == nil || from < 1 {
		panic(fmt.Sprintf("inbox: Registry.Upcast(%q, %d): registered twice, nil, or a version below 1", eventType, from))
	}
	r.upcasters[k] = u
	return r
}

// resolve finds d's handler, upcasting d.Payload (and d.SchemaVersion) on the way.
func (r *Registry) resolve(d *Delivery) (Handler, error) {
	from := d.SchemaVersion
	for {
		k := schemaKey{d.EventType, d.SchemaVersion}
		if h, ok := r.handlers[k]; ok {
			return h, nil
		}
		u, ok := r.upcasters[k]
		if !ok {
			return nil, fmt.Errorf("%w: event %s of type %q has schema version %d, and %s; the event is not applied and its offset must not be committed: deploy a consumer that handles it",
				ErrUnhandled, d.ID, d.EventType, from, r.known(d.EventType))
		}
		p, err := u(d.Payload)
		if err != nil {
			return nil, fmt.Errorf("inbox: event %s: upcast %q from schema version %d to %d: %w", d.ID, d.EventType, d.SchemaVersion, d.SchemaVersion+1, err)
		}
		d.Payload, d.SchemaVersion = p, d.SchemaVersion+1
	}
}

// known describes what the registry does take for eventType, for the error message.
func (r *Registry) known(eventType string) string {
	var hs, us []int
	for k := range r.handlers {
		if k.eventType == eventType {
			hs = append(hs, k.version)
		}
	}
	for k := range r.upcasters {
		if k.eventType == eventType {
			us = append(us, k.version)
		}
	}
	if len(hs)+len(us) == 0 {
		return "this consumer registers nothing for that type"
	}
	sort.Ints(hs)
	sort.Ints(us)
	list := func(v []int) string {
		s := make([]string, len(v))
		for i, n := range v {
			s[i] = fmt.Sprint(n)
		}
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("this consumer handles versions [%s] and upcasts from [%s]", list(hs), list(us))
}
