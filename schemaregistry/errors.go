package schemaregistry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"
)

// Class is what a caller does about an error.
type Class int

const (
	// Unavailable: the registry cannot answer now (down, unreachable, 5xx, 408, 429) or refuses
	// the relay itself (401, 403, a URL that is not a registry's API). Nothing is wrong with the
	// event: retry with backoff while the stream holds.
	Unavailable Class = iota + 1
	// Incompatible: the registry refused to register a schema under the subject's compatibility
	// rule (409). The event whose schema it is goes to the failure policy (schema_incompatible).
	Incompatible
	// NotFound: the subject, version or schema id does not exist (404 with a registry error
	// code). The event that needed it goes to the failure policy.
	NotFound
	// Rejected: any other answer in the 4xx range (an invalid schema, 422): the request itself is
	// wrong, and sending it again would not help.
	Rejected
)

func (c Class) String() string {
	switch c {
	case Unavailable:
		return "unavailable"
	case Incompatible:
		return "incompatible"
	case NotFound:
		return "not_found"
	case Rejected:
		return "rejected"
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// Error is a failed registry request: one line naming the operation, the subject (or id), what
// the registry said, and what to do. It never holds a credential.
type Error struct {
	Class   Class
	Op      string // what was asked: "register a schema", "read the latest schema", ...
	Subject string // "" for a request by id
	ID      int    // the schema id of a request by id
	Version int    // the version of a request for one (0: none)
	Status  int    // the HTTP status; 0 when nothing answered
	Code    int    // the registry's error_code, 0 when none
	Message string // the registry's message, or the transport error's
	Fix     string // what an operator does about it
	err     error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("schema registry: ")
	b.WriteString(e.Op)
	switch {
	case e.Subject != "" && e.Version > 0:
		fmt.Fprintf(&b, " (subject %q, version %d)", e.Subject, e.Version)
	case e.Subject != "":
		fmt.Fprintf(&b, " (subject %q)", e.Subject)
	case e.ID != 0:
		fmt.Fprintf(&b, " (schema id %d)", e.ID)
	}
	if e.Status != 0 {
		fmt.Fprintf(&b, ": %d %s", e.Status, http.StatusText(e.Status))
		if e.Code != 0 && e.Code != e.Status {
			fmt.Fprintf(&b, " (error code %d)", e.Code)
		}
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(oneLine(e.Message))
	}
	if e.Fix != "" {
		b.WriteString(": ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.err }

// IsUnavailable reports whether err says the registry cannot answer now: retry with backoff,
// holding the stream. A cancelled or expired caller's context is not unavailability.
func IsUnavailable(err error) bool { return classOf(err) == Unavailable }

// IsIncompatible reports whether err is the registry's refusal of a schema under the subject's
// compatibility rule.
func IsIncompatible(err error) bool { return classOf(err) == Incompatible }

// IsNotFound reports whether err says the subject, version or schema id does not exist.
func IsNotFound(err error) bool { return classOf(err) == NotFound }

func classOf(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return 0
}

// request names one registry request for its error.
type request struct {
	op      string
	subject string
	id      int
	version int
}

// classify turns what sr returned for req into an *Error, or returns the caller's context error
// (wrapped, with the request) when that context ended.
func classify(ctx context.Context, req request, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("schema registry: %s: %w", req.op, ctx.Err())
	}
	e := &Error{Op: req.op, Subject: req.subject, ID: req.id, Version: req.version, err: err}
	var resp *sr.ResponseError
	if !errors.As(err, &resp) {
		// Nothing answered: refused, reset, timed out, a TLS failure, an unreadable credential
		// file. The stream waits; the message says which.
		e.Class, e.Message = Unavailable, transportMessage(err)
		if errors.Is(err, errCredentialFile) {
			e.Fix = "the file is read again for every request: fix or remount it"
		}
		return e
	}
	e.Status, e.Code = resp.StatusCode, resp.ErrorCode
	e.Message = resp.Message
	if e.Message == "" || e.Message == "no response" {
		e.Message = string(resp.Raw)
	}
	if len(e.Message) > 300 {
		e.Message = e.Message[:300] + "..."
	}
	switch s := resp.StatusCode; {
	case s >= 500, s == http.StatusRequestTimeout, s == http.StatusTooManyRequests:
		e.Class = Unavailable
	case s == http.StatusUnauthorized:
		e.Class = Unavailable
		e.Message = "" // may echo what was sent
		e.Fix = "the registry refused the credentials: check schema_registry.username and the file of schema_registry.password_file, or of schema_registry.bearer_token_file (read again for every request, so a corrected file is used at the next retry)"
	case s == http.StatusForbidden:
		e.Class = Unavailable
		e.Fix = "the registry's authorization refuses the relay's principal: grant it this operation on the subject (read, and write where schemas are registered)"
	case s == http.StatusConflict:
		e.Class = Incompatible
		e.Fix = "the schema breaks the subject's compatibility rule: make the change compatible (add a field with a default, or optional), register the new schema as a new subject, or change the rule (PUT /config/{subject})"
	case s == http.StatusNotFound && (resp.ErrorCode < 40400 || resp.ErrorCode > 40499):
		// A registry names what it did not find with an error code (40401 subject, 40402
		// version, 40403 schema); a 404 without one (or with a plain 404, as Apicurio's server
		// answers a path it does not serve) is a server that is not the registry's API at this
		// path: a wrong URL holds every event alike.
		e.Class = Unavailable
		e.Message = ""
		e.Fix = "no registry API at " + resp.URL + ": schema_registry.urls must name the Confluent-compatible API's base (Confluent: http://host:8081; Apicurio 2.x: http://host:8080/apis/ccompat/v7)"
	case s == http.StatusNotFound:
		e.Class = NotFound
		e.Fix = notFoundFix(req, resp.ErrorCode)
	default:
		e.Class = Rejected
		if s == http.StatusUnprocessableEntity {
			e.Fix = "the registry refuses the request as invalid (a schema it cannot parse, an unknown version or compatibility level)"
		}
	}
	return e
}

func notFoundFix(req request, code int) string {
	switch {
	case code == 40403 || req.id != 0:
		return "no schema with this id: the record was written against another registry, or the schema was deleted"
	case code == 40402 || req.version > 0:
		return "the subject has no such version: pin one it has (GET /subjects/{subject}/versions), or use the latest"
	default:
		return "the subject has no schema: register one, or let the relay register what it infers (schema_registry.auto_register: true)"
	}
}

// transportMessage is err's text on one line, without sr's `unable to GET "url": ` preamble where
// the rest names the URL again (net/http's `Get "url": ...`). URLs hold no credentials: Options
// refuses a URL with them.
func transportMessage(err error) string {
	msg := oneLine(err.Error())
	if rest, ok := strings.CutPrefix(msg, "unable to "); ok {
		if _, after, ok := strings.Cut(rest, `": `); ok && strings.Contains(after, `"http`) {
			return after
		}
	}
	return msg
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
