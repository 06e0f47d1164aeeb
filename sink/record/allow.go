package record

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Whoever may insert an outbox row chooses its aggregate type, and through the routing its topic:
// with the relay's principal, a row could write to Kafka Connect's configuration topic, a schema
// registry's _schemas, or the relay's own positions. So every routed name must be allowed
// (Options.TopicAllow, by default the routing's own literal prefix) and not reserved (a leading
// '_', Options.TopicDeny); an event that is refused goes to the failure policy.

// ErrTopicNotAllowed marks a route the allowlist or the reserved names refuse.
var ErrTopicNotAllowed = errors.New("a topic outbox rows may not reach (topic_allow, topic_deny)")

// topicAllow decides which routed names an event may reach.
type topicAllow struct {
	allow []string // patterns: * stands for any run of characters
	deny  map[string]bool
	// denyPatterns are the TopicDeny entries with a *: a name cannot hold one, so taken as a
	// name such an entry would refuse nothing, silently.
	denyPatterns []string
}

// DefaultTopicAllow is the allowlist the routing implies: the topic template's (or, with a topic
// regex, the replacement's) literal text before its first placeholder followed by *, or the name
// itself when it has no placeholder. A routing that starts with a placeholder implies *: any name.
func DefaultTopicAllow(o Options) []string {
	o = o.WithDefaults()
	pattern, cut := o.TopicTemplate, "{"
	if o.TopicRegex != "" {
		pattern, cut = o.TopicReplacement, "$"
	}
	prefix, _, placeholder := strings.Cut(pattern, cut)
	if !placeholder {
		return []string{pattern}
	}
	return []string{prefix + "*"}
}

// CheckTopicPattern reports whether p can be a topic_allow entry: a topic name in which * may
// stand for any run of characters.
func CheckTopicPattern(p string) error {
	if p == "*" {
		return nil
	}
	if err := ValidTopic(strings.ReplaceAll(p, "*", "x")); err != nil {
		return fmt.Errorf("pattern %q: %w", p, err)
	}
	return nil
}

func newTopicAllow(o Options) (*topicAllow, error) {
	a := &topicAllow{allow: o.TopicAllow, deny: make(map[string]bool, len(o.TopicDeny))}
	if len(a.allow) == 0 {
		a.allow = DefaultTopicAllow(o)
	}
	for _, p := range a.allow {
		if err := CheckTopicPattern(p); err != nil {
			return nil, fmt.Errorf("topic allowlist: %w", err)
		}
	}
	for _, t := range o.TopicDeny {
		if !strings.Contains(t, "*") {
			a.deny[t] = true
			continue
		}
		if err := CheckTopicPattern(t); err != nil {
			return nil, fmt.Errorf("topic denylist: %w", err)
		}
		a.denyPatterns = append(a.denyPatterns, t)
	}
	return a, nil
}

// check returns why topic t is refused, or nil. A nil topicAllow allows every name.
func (a *topicAllow) check(t string) error {
	if a == nil {
		return nil
	}
	switch {
	case strings.HasPrefix(t, "_"):
		return fmt.Errorf("%s, a name starting with '_' (internal topics: Kafka's, a schema registry's, the relay's positions): %w", t, ErrTopicNotAllowed)
	case a.deny[t] || slices.ContainsFunc(a.denyPatterns, func(p string) bool { return globMatch(p, t) }):
		return fmt.Errorf("%s, a topic reserved for the relay or the platform (its dead-letter topic, redrive's ledger, its positions topic, or topic_deny): %w", t, ErrTopicNotAllowed)
	}
	for _, p := range a.allow {
		if globMatch(p, t) {
			return nil
		}
	}
	return fmt.Errorf("%s, outside topic_allow %s: %w", t, strings.Join(a.allow, ","), ErrTopicNotAllowed)
}

// ReservedTopic reports whether t is a name no event may reach whatever the allowlist says: one
// starting with '_' or matching an entry of deny (a name, or a pattern with *). The relay's own
// dead-letter topic must not be one either: a row that fails on purpose would write there.
func ReservedTopic(t string, deny []string) bool {
	return strings.HasPrefix(t, "_") || slices.ContainsFunc(deny, func(p string) bool { return globMatch(p, t) })
}

// globMatch reports whether name matches pattern, where * stands for any run of characters
// (possibly empty) and every other character for itself.
func globMatch(pattern, name string) bool {
	star, back := -1, 0 // the last * seen, and where in name its run ends so far
	p, n := 0, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, back = p, n
			p++
		case p < len(pattern) && pattern[p] == name[n]:
			p++
			n++
		case star >= 0:
			back++
			p, n = star+1, back
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
