package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
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
