// Package configdoc writes the configuration reference (docs/configuration.md) from the
// configuration keys (config.Keys), so that the page says what the code does.
package configdoc

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/outbox-relay/outbox-relay/config"
)

// Path is the page's place in the repository.
const Path = "docs/configuration.md"

// Regenerate is the command that rewrites the page, for messages that find it stale.
const Regenerate = "`make docs` (go run ./internal/cmd/configdoc)"

// Render is the page for keys, grouped as help groups them.
func Render(keys []config.Key) []byte {
	var b bytes.Buffer
	b.WriteString(`# Configuration reference

<!-- Generated from config/keys.go by ` + Regenerate + `; do not edit by hand. -->

Every key can be set in a YAML file (` + "`--config relay.yaml`" + `, nested maps for dotted keys), as an
environment variable (` + "`OUTBOX_`" + ` and the key in upper case, dots as underscores), or as a flag (the key with
underscores as dashes). Flags win over the environment, which wins over the file. Every
value is validated at start, and an error names the key and where the value came from. One
configuration serves every command: a command accepts every key's flag and uses the keys listed for
it below (` + "`outbox-relay COMMAND -h`" + ` lists them too). A boolean flag alone means true
(` + "`--failover`" + `); ` + "`--flag=false`" + ` sets it false. Durations are Go durations (` + "`1s`, `15ms`, `24h`" + `), sizes
take a unit (` + "`64MiB`" + `). Secret values are never logged.

`)
	byGroup := map[config.Group][]config.Key{}
	for _, k := range keys {
		byGroup[k.Group] = append(byGroup[k.Group], k)
	}
	var groups []config.Group
	for _, g := range config.Groups() {
		if len(byGroup[g]) > 0 {
			groups = append(groups, g)
		}
	}

	// Anchors as GitHub numbers them, in the order of the headings (the group Delivery and the key
	// delivery share a name).
	anchors := map[string]string{}
	seen := map[string]int{}
	add := func(id, heading string) {
		a := anchor(heading)
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		anchors[id] = a
	}
	for _, g := range groups {
		add("group "+string(g), string(g))
		for _, k := range byGroup[g] {
			add("key "+k.Name, k.Name)
		}
	}

	b.WriteString("| Group | Keys |\n|---|---|\n")
	for _, g := range groups {
		var links []string
		for _, k := range byGroup[g] {
			links = append(links, fmt.Sprintf("[`%s`](#%s)", k.Name, anchors["key "+k.Name]))
		}
		fmt.Fprintf(&b, "| [%s](#%s) | %s |\n", g, anchors["group "+string(g)], strings.Join(links, ", "))
	}
	for _, g := range groups {
		fmt.Fprintf(&b, "\n## %s\n", g)
		for _, k := range byGroup[g] {
			fmt.Fprintf(&b, "\n### %s\n\n", k.Name)
			b.WriteString("| Type | Default | Environment variable | Flag | Commands |\n|---|---|---|---|---|\n")
			def := "(none)"
			if k.Default != "" {
				def = code(k.Default)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n\n", code(k.Type), def, code(k.Env()), code(k.Flag()), commands(k.Commands))
			help := k.Help
			if k.Secret {
				help += " (secret: never logged)"
			}
			b.WriteString(capitalize(strings.TrimSuffix(help, ".")) + ".")
			if len(k.See) > 0 {
				b.WriteString(" See " + seeLinks(k.See) + ".")
			}
			b.WriteString("\n")
		}
	}
	return b.Bytes()
}

// anchor is the id GitHub gives a heading: lower case, punctuation but - and _ dropped, spaces
// as dashes.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// seeLinks is the links to the pages that explain a key further: "operations.md#Section title"
// links the section by its heading's anchor, a page alone the page.
func seeLinks(see []string) string {
	links := make([]string, len(see))
	for i, s := range see {
		page, section, ok := strings.Cut(s, "#")
		if !ok {
			links[i] = fmt.Sprintf("[%s](%s)", page, page)
			continue
		}
		links[i] = fmt.Sprintf("[%s, \"%s\"](%s#%s)", page, section, page, anchor(section))
	}
	return strings.Join(links, ", ")
}

// code is s as inline code, with a table's pipes escaped.
func code(s string) string { return "`" + strings.ReplaceAll(s, "|", `\|`) + "`" }

func commands(cs []string) string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = code(c)
	}
	return strings.Join(out, ", ")
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
