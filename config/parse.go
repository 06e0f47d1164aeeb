package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/sink/record"
)

// The parsers below turn a key's text into its field's value; each error says what was wanted.

func str(p func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *p(c) = v; return nil }
}

func boolean(p func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", v)
		}
		*p(c) = b
		return nil
	}
}

func duration(p func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("want a non-negative duration such as 10s or 500ms, got %q", v)
		}
		*p(c) = d
		return nil
	}
}

// minDuration is duration with a lower bound, for intervals that would busy-loop at zero.
func minDuration(least time.Duration, p func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < least {
			return fmt.Errorf("want a duration of at least %s such as 2s, got %q", least, v)
		}
		*p(c) = d
		return nil
	}
}

func integer(p func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive integer, got %q", v)
		}
		*p(c) = n
		return nil
	}
}

// integerOrAuto takes a positive integer, or auto (stored as 0), which validate resolves.
func integerOrAuto(p func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		if strings.EqualFold(strings.TrimSpace(v), "auto") {
			*p(c) = 0
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive integer or auto, got %q", v)
		}
		*p(c) = n
		return nil
	}
}

func size(p func(*Config) *int64) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := parseSize(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive size such as 67108864, 64MiB or 1MB, got %q", v)
		}
		*p(c) = n
		return nil
	}
}

func list(p func(*Config) *[]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		var out []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		*p(c) = out
		return nil
	}
}

func oneOf(p func(*Config) *string, allowed ...string) func(*Config, string) error {
	return func(c *Config, v string) error {
		for _, a := range allowed {
			if strings.EqualFold(v, a) {
				*p(c) = a
				return nil
			}
		}
		return fmt.Errorf("want one of %s, got %q", strings.Join(allowed, ", "), v)
	}
}

// parseSize reads a byte count with an optional KB/MB/GB (powers of 1000) or KiB/MiB/GiB suffix.
func parseSize(v string) (int64, error) {
	v = strings.TrimSpace(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"B", 1}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, err
	}
	if n > (1<<63-1)/mult {
		return 0, errors.New("size overflows") // n*mult would wrap, maybe to a small positive size
	}
	return n * mult, nil
}

// tableName takes table or schema.table; a bare table is in public.
func tableName(c *Config, v string) error {
	schema, table, ok := strings.Cut(v, ".")
	if !ok {
		schema, table = "public", v
	}
	if schema == "" || table == "" || strings.Contains(table, ".") {
		return fmt.Errorf("want table or schema.table, got %q", v)
	}
	c.Schema, c.Table = schema, table
	return nil
}

// extraFields takes column:placement[:alias] items, at most one of them placed as the partition
// (a record has one).
func extraFields(c *Config, v string) error {
	if err := list(func(c *Config) *[]string { return &c.ExtraFields })(c, v); err != nil {
		return err
	}
	partitions := 0
	for _, f := range c.ExtraFields {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || (len(parts) == 3 && parts[2] == "") {
			return fmt.Errorf("want column:placement or column:placement:alias, got %q", f)
		}
		switch parts[1] {
		case "header", "envelope":
		case "partition":
			partitions++
		default:
			return fmt.Errorf("placement %q of %q: want header, envelope or partition", parts[1], f)
		}
	}
	if partitions > 1 {
		return errors.New("at most one column may be placed as the partition")
	}
	return nil
}

// builtinHeaders takes some of id, event_type and aggregate_type; an empty list is kept as empty,
// not nil: no built-in header at all.
func builtinHeaders(c *Config, v string) error {
	if err := list(func(c *Config) *[]string { return &c.BuiltinHeaders })(c, v); err != nil {
		return err
	}
	for _, h := range c.BuiltinHeaders {
		if h != "id" && h != "event_type" && h != "aggregate_type" {
			return fmt.Errorf("want some of id, event_type, aggregate_type, got %q", h)
		}
	}
	if c.BuiltinHeaders == nil {
		c.BuiltinHeaders = []string{}
	}
	return nil
}

// topicPatterns takes a list of topic names or patterns where * stands for any characters.
func topicPatterns(p func(*Config) *[]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		if err := list(p)(c, v); err != nil {
			return err
		}
		for _, pattern := range *p(c) {
			if err := record.CheckTopicPattern(pattern); err != nil {
				return err
			}
		}
		return nil
	}
}

// backfillSince takes an RFC 3339 time or a positive duration before the start (BackfillFrom
// resolves it); empty means all rows.
func backfillSince(c *Config, v string) error {
	if v == "" {
		c.BackfillSince = ""
		return nil
	}
	if _, err := time.Parse(time.RFC3339, v); err == nil {
		c.BackfillSince = v
		return nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		c.BackfillSince = v
		return nil
	}
	return fmt.Errorf("want an RFC 3339 time (2026-01-02T15:04:05Z) or a positive duration (24h), got %q", v)
}
