package config

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Key describes one configuration key, for help and documentation.
type Key struct {
	Name    string // e.g. kafka.sasl.password
	Group   Group
	Type    string // as help shows it; "bool" for booleans
	Default string // "" when none
	Help    string
	Secret  bool
	// See names the documentation that explains the key further: "operations.md#Section title",
	// or a page alone ("registry-encodings.md"), relative to docs/.
	See []string
	// Commands are the subcommands that use the key (their -h lists it); run uses every key.
	Commands []string
}

// Flag is the key's command-line flag, with its dashes.
func (k Key) Flag() string { return "--" + FlagName(k.Name) }

// Env is the key's environment variable.
func (k Key) Env() string { return EnvName(k.Name) }

// Keys lists every configuration key, in the order of the settings; with groups, only theirs.
func Keys(in ...Group) []Key {
	var out []Key
	for _, s := range settings {
		if len(in) > 0 && !slices.Contains(in, s.group) {
			continue
		}
		typ := string(s.kind)
		if s.kind == kindBool {
			typ = "bool"
		}
		out = append(out, Key{Name: s.key, Group: s.group, Type: typ, Default: s.def, Help: s.help, Secret: s.secret, See: s.see, Commands: usedBy(s.key)})
	}
	return out
}

// KeyNames is the names of keys, for a command's list of what it uses.
func KeyNames(keys []Key) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.Name
	}
	return out
}

// flagValue is one key's flag. It holds the text as given: the key's parser checks it in Load,
// where an error can say which key and which source it came from.
type flagValue struct {
	kind kind
	text string
}

func (v *flagValue) String() string     { return v.text }
func (v *flagValue) Set(s string) error { v.text = s; return nil }

// IsBoolFlag lets a boolean key's flag stand alone for true (--failover), as flag documents.
func (v *flagValue) IsBoolFlag() bool { return v.kind == kindBool }

// Loader reads configuration for one command.
type Loader struct {
	fs      *flag.FlagSet
	file    *string
	uses    map[string]bool // the keys help lists
	getenv  func(string) string
	noKafka bool
	noPG    bool
}

// WithoutKafka is for subcommands that never contact Kafka (migrate, status, prune): kafka_brokers
// is then not required.
func (l *Loader) WithoutKafka() *Loader {
	l.noKafka = true
	return l
}

// WithoutPostgres is for subcommands that never contact PostgreSQL (redrive): pg_dsn is then not
// required.
func (l *Loader) WithoutPostgres() *Loader {
	l.noPG = true
	return l
}

// NewLoader registers --config and a flag per key on fs, and a usage that lists the command's own
// flags first, then keys (every key when none are given) by group: the ones the command uses. The
// others are accepted all the same, from flags as from the file and the environment, so that one
// configuration, a command line included, serves every command.
func NewLoader(fs *flag.FlagSet, getenv func(string) string, keys ...string) *Loader {
	l := &Loader{fs: fs, getenv: getenv, uses: make(map[string]bool)}
	l.file = fs.String("config", "", "YAML configuration `file`; flags win over the environment (OUTBOX_*), which wins over the file")
	for _, k := range keys {
		if !slices.ContainsFunc(settings, func(s setting) bool { return s.key == k }) {
			panic("config: NewLoader: no key " + k)
		}
		l.uses[k] = true
	}
	for _, s := range settings {
		if len(keys) == 0 {
			l.uses[s.key] = true
		}
		fs.Var(&flagValue{kind: s.kind}, FlagName(s.key), s.help)
	}
	fs.Usage = func() { l.Usage(fs.Output(), "") }
	return l
}

// Usage prints what the command does (about, when given), its own flags, then its keys by group,
// each with its type, default and environment variable.
func (l *Loader) Usage(w io.Writer, about string) {
	fmt.Fprintf(w, "Usage: %s [flags]\n", l.fs.Name())
	if about != "" {
		fmt.Fprintf(w, "\n%s\n", about)
	}
	fmt.Fprintln(w, "\nA boolean flag alone means true (--flag); --flag=false sets it false.")
	if len(l.uses) < len(settings) {
		fmt.Fprintln(w, "The keys below are those this command uses; the flags of the others are accepted and\nignored, so that one command line serves every command (outbox-relay run -h lists them all).")
	}
	var own []*flag.Flag
	l.fs.VisitAll(func(f *flag.Flag) {
		if _, isKey := f.Value.(*flagValue); !isKey {
			own = append(own, f)
		}
	})
	fmt.Fprintf(w, "\nFlags of this command:\n")
	for _, f := range own {
		typ, help := flag.UnquoteUsage(f)
		def := f.DefValue
		if strings.Contains(help, "(default") || slices.Contains([]string{"", "false", "0", "0s", "-1"}, def) {
			def = "" // said in the help, or nothing to say
		}
		writeFlag(w, f.Name, typ, help, def, "")
	}
	for _, g := range groups {
		first := true
		for _, s := range settings {
			if s.group != g || !l.uses[s.key] {
				continue
			}
			if first {
				fmt.Fprintf(w, "\n%s:\n", g)
				first = false
			}
			def := s.def
			if s.kind == kindBool && def == "false" {
				def = ""
			}
			writeFlag(w, FlagName(s.key), string(s.kind), s.help, def, EnvName(s.key))
		}
	}
}

func writeFlag(w io.Writer, name, typ, help, def, env string) {
	line := "  --" + name
	if typ != "" {
		line += " " + typ
	}
	fmt.Fprintln(w, line)
	if def != "" {
		help += " (default " + def + ")"
	}
	if env != "" {
		help += " [" + env + "]"
	}
	fmt.Fprintf(w, "    \t%s\n", help)
}
