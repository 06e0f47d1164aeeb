// Package credentials builds what the relay authenticates and encrypts its connections with:
// passwords and TLS certificates read from files, read again for every new connection, so that a
// rotated secret (a Kubernetes Secret volume, a renewed certificate) is used at the next reconnect
// without a restart; and one wording for the TLS failures that retrying cannot fix.
//
// Secrets never appear in what this package returns: errors name the config key and the file,
// never the file's content.
package credentials

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// maxSecretBytes bounds a password file: anything larger is a mistake (a key or a binary named by
// the wrong key), and reading it for every connection would be wasteful.
const maxSecretBytes = 64 << 10

// ReadSecret reads the secret in path for config key key. Trailing line breaks are dropped (echo and
// most editors end a file with one; Kubernetes keeps whatever the Secret held); anything else is the
// secret. An empty file is an error: it is a Secret not mounted yet, not a password.
func ReadSecret(key, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("config key %s: %w", key, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
	if err != nil {
		return "", fmt.Errorf("config key %s: read %s: %w", key, path, err)
	}
	if len(b) > maxSecretBytes {
		return "", fmt.Errorf("config key %s: %s is larger than %d bytes: not a password file", key, path, maxSecretBytes)
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) == 0 {
		return "", fmt.Errorf("config key %s: %s is empty", key, path)
	}
	return string(b), nil
}
