package config

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load applies defaults, the file, the environment and the flags that were set, then validates.
func (l *Loader) Load() (*Config, error) {
	c := &Config{}
	type source struct {
		value, from string
	}
	values := make(map[string]source)
	for _, s := range settings {
		values[s.key] = source{s.def, "default"}
	}
	if *l.file != "" {
		fileValues, err := readFile(*l.file)
		if err != nil {
			return nil, err
		}
		for k, v := range fileValues {
			values[k] = source{v, *l.file}
		}
	}
	for _, s := range settings {
		if v, ok := lookupEnv(l.getenv, EnvName(s.key)); ok {
			values[s.key] = source{v, EnvName(s.key)}
		}
	}
	l.fs.Visit(func(f *flag.Flag) {
		for _, s := range settings {
			if FlagName(s.key) == f.Name {
				values[s.key] = source{f.Value.String(), "--" + f.Name}
			}
		}
	})
	if p := values["profile"]; p.value != "" {
		preset, ok := profiles[strings.ToLower(p.value)]
		if !ok {
			return nil, fmt.Errorf("config key profile (from %s): want debezium, got %q", p.from, p.value)
		}
		for k, v := range preset {
			if values[k].from == "default" {
				values[k] = source{v, "profile " + p.value}
			}
		}
	}
	var errs []error
	for _, s := range settings {
		v := values[s.key]
		if err := s.apply(c, v.value); err != nil {
			errs = append(errs, fmt.Errorf("config key %s (from %s): %w", s.key, v.from, err))
		}
	}
	if err := joinErrors(errs); err != nil {
		return nil, err
	}
	from := func(key string) string { return values[key].from }
	c.resolveDefaults(from)
	if err := c.validate(from, !l.noKafka, !l.noPG); err != nil {
		return nil, err
	}
	c.Warnings = c.securityWarnings(from)
	return c, nil
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	if getenv == nil {
		return os.LookupEnv(name)
	}
	v := getenv(name)
	return v, v != ""
}

// readFile flattens a YAML document into dotted keys; lists become comma-separated values.
func readFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	out := make(map[string]string)
	if err := flatten("", doc, out); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	known := make(map[string]bool, len(settings))
	for _, s := range settings {
		known[s.key] = true
	}
	var unknown []string
	for k := range out {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("config file %s: unknown key %s (see `outbox-relay run -h` for the keys)", path, strings.Join(unknown, ", "))
	}
	return out, nil
}

func flatten(prefix string, v any, out map[string]string) error {
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			if err := flatten(key, sub, out); err != nil {
				return err
			}
		}
	case []any:
		parts := make([]string, len(v))
		for i, item := range v {
			parts[i] = fmt.Sprint(item)
		}
		out[prefix] = strings.Join(parts, ",")
	case nil:
		out[prefix] = ""
	default:
		out[prefix] = fmt.Sprint(v)
	}
	return nil
}
