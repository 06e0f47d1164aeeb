package schemas

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/twmb/franz-go/pkg/sr"
)

// registerError classifies a failed registration of a schema under subject: 409 (incompatible)
// and 422 (invalid) are the schema's fault, so the event's; anything else is retried.
func registerError(subject string, err error) error {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch re.StatusCode {
		case http.StatusConflict:
			return &Error{Reason: ReasonIncompatible, Subject: subject, Err: fmt.Errorf(
				"the schema inferred from the payload is not compatible with the subject's versions under its compatibility rule: %w "+
					"(make the payload compatible, or change the subject's compatibility rule in the registry)", err)}
		case http.StatusUnprocessableEntity:
			return &Error{Reason: ReasonRejected, Subject: subject, Err: fmt.Errorf("the registry refused the schema inferred from the payload as invalid: %w", err)}
		}
	}
	return heldError(subject, "registering a schema", err)
}

// lookupError classifies a failed lookup of a strict subject's schema: always retried (a subject
// not registered yet is waited for, loudly, never skipped).
func lookupError(subject string, version int, err error) error {
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
		what := "the subject has no schema"
		if version > 0 {
			what = fmt.Sprintf("the subject has no version %d", version)
		}
		return fmt.Errorf("schema registry, subject %s: %s (%w): register the schema, or set schema_registry.auto_register to infer and register it; events wait until then", subject, what, err)
	}
	return heldError(subject, "looking up the subject's schema", err)
}

// heldError is a registry error the stream waits out: one line naming the subject and the fix.
func heldError(subject, doing string, err error) error {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch {
		case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
			return fmt.Errorf("schema registry, subject %s, %s: refused the relay's credentials (%d: %w): fix schema_registry's basic auth or token; events wait until then",
				subject, doing, re.StatusCode, err)
		case re.StatusCode >= 400 && re.StatusCode < 500 && re.StatusCode != http.StatusRequestTimeout && re.StatusCode != http.StatusTooManyRequests:
			return fmt.Errorf("schema registry, subject %s, %s: refused (%d: %w): check schema_registry.url and the subject; events wait until then",
				subject, doing, re.StatusCode, err)
		}
	}
	return fmt.Errorf("schema registry unavailable, subject %s, %s: %w; retrying, events wait", subject, doing, err)
}
