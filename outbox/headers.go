package outbox

import "context"

// Header names with a conventional meaning. Any other name works too; the relay sends every member
// of the headers column as a Kafka header.
const (
	HeaderTenant        = "tenant"
	HeaderSchemaVersion = "schema_version"
	// HeaderTraceparent and HeaderTracestate carry W3C Trace Context
	// (https://www.w3.org/TR/trace-context/), so a consumer can continue the producer's trace.
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

type traceparentKey struct{}

// ContextWithTraceparent returns ctx carrying a W3C traceparent ("00-<trace id>-<parent id>-<flags>"),
// which Write adds to every event that does not set its own. A malformed value is ignored, as the
// W3C recommendation says to: a bad trace id must not fail a business transaction. This keeps the
// package free of a tracing dependency; with OpenTelemetry, format the span context yourself or
// use its propagator to fill Event.Headers.
func ContextWithTraceparent(ctx context.Context, traceparent string) context.Context {
	if !ValidTraceparent(traceparent) {
		return ctx
	}
	return context.WithValue(ctx, traceparentKey{}, traceparent)
}

// TraceparentFrom returns the traceparent ContextWithTraceparent stored in ctx.
func TraceparentFrom(ctx context.Context) (string, bool) {
	tp, ok := ctx.Value(traceparentKey{}).(string)
	return tp, ok
}

// ValidTraceparent reports whether s is a version-00 traceparent with a non-zero trace id and parent
// id, in lower-case hex as the specification requires.
func ValidTraceparent(s string) bool {
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	if len(s) != 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' || s[:2] != "00" {
		return false
	}
	traceID, parentID, flags := s[3:35], s[36:52], s[53:55]
	return lowerHex(traceID) && lowerHex(parentID) && lowerHex(flags) &&
		traceID != "00000000000000000000000000000000" && parentID != "0000000000000000"
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
