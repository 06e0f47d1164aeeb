package config

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeDocumentsEveryKey keeps the README's configuration table in step with the settings.
func TestReadmeDocumentsEveryKey(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range settings {
		if !strings.Contains(string(readme), "| `"+s.key+"` |") {
			t.Errorf("README.md has no row for config key %s", s.key)
		}
	}
}
