package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README names keys in three forms: `key: value` (YAML), OUTBOX_KEY (the environment) and
// --key (a flag). Flags of the subcommands' own (--json, --older-than) are not keys.
var (
	readmeYAMLKey = regexp.MustCompile("`([a-z][a-z0-9_.]*): [^`]+`")
	readmeEnvKey  = regexp.MustCompile(`\bOUTBOX_[A-Z0-9_]+\b`)
	readmeFlagKey = regexp.MustCompile(`(?:^|[\s(` + "`" + `])--([a-z][a-z0-9.-]*)`)
	// commandFlags are the subcommands' own flags the README shows, which are not configuration keys.
	commandFlags = map[string]bool{"json": true, "standby-dsn": true, "older-than": true, "config": true,
		"event-id": true, "source": true, "dead-letters": true}
)

// TestReadmeLinksTheReferenceAndNamesOnlyKeysThatExist: the README leaves the keys to
// docs/configuration.md (generated from settings and tested by internal/configdoc), so it must
// link it, and every key it does name, as YAML, environment variable or flag, must exist.
func TestReadmeLinksTheReferenceAndNamesOnlyKeysThatExist(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	if !strings.Contains(readme, "](docs/configuration.md)") {
		t.Error("README.md does not link docs/configuration.md, the configuration reference")
	}
	byKey, byEnv, byFlag := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, s := range settings {
		byKey[s.key] = true
		byEnv[EnvName(s.key)] = true
		byFlag[FlagName(s.key)] = true
	}
	named := 0
	for _, m := range readmeYAMLKey.FindAllStringSubmatch(readme, -1) {
		named++
		if !byKey[m[1]] {
			t.Errorf("README.md names config key %q (in %q), which does not exist", m[1], m[0])
		}
	}
	for _, env := range readmeEnvKey.FindAllString(readme, -1) {
		named++
		if !byEnv[env] {
			t.Errorf("README.md names environment variable %s, which sets no config key", env)
		}
	}
	for _, m := range readmeFlagKey.FindAllStringSubmatch(readme, -1) {
		named++
		if !byFlag[m[1]] && !commandFlags[m[1]] {
			t.Errorf("README.md names flag --%s, which is no config key nor a subcommand's flag", m[1])
		}
	}
	if named < 10 {
		t.Fatalf("found only %d keys named in README.md: the patterns missed its text", named)
	}
}
