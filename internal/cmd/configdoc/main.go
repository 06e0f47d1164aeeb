// Command configdoc writes the configuration reference, docs/configuration.md, from the
// configuration keys (config/keys.go): `make docs`, or go generate ./config.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/internal/configdoc"
)

func main() {
	out := flag.String("o", configdoc.Path, "the page to write")
	flag.Parse()
	if err := os.WriteFile(*out, configdoc.Render(config.Keys()), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "configdoc: %v\n", err)
		os.Exit(1)
	}
}
