// Package dbz runs Kafka Connect with Debezium's PostgreSQL connector, from the jars
// bench/debezium-lib.sh assembles: for the benchmark and for tests that compare the relay's
// records with Debezium's.
package dbz

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Lib is where bench/debezium-lib.sh puts Kafka Connect and the Debezium connector:
// $OUTBOX_DEBEZIUM_LIB or ~/.cache/outbox-relay/debezium-3.6.1/lib.
func Lib() string {
	if lib := os.Getenv("OUTBOX_DEBEZIUM_LIB"); lib != "" {
		return lib
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "outbox-relay", "debezium-3.6.1", "lib")
}

// LibReady reports whether lib holds a complete set of jars.
func LibReady(lib string) error {
	if _, err := os.Stat(filepath.Join(lib, ".complete")); err != nil {
		return fmt.Errorf("Kafka Connect + Debezium jars missing in %s: run bash bench/debezium-lib.sh (make bench does)", lib)
	}
	return nil
}

// RenderProperties writes a Java properties file, keys sorted. Values here hold no characters
// that need escaping except backslashes, which are doubled.
func RenderProperties(props map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(props)) {
		fmt.Fprintf(&b, "%s=%s\n", k, strings.ReplaceAll(props[k], `\`, `\\`))
	}
	return b.String()
}

// JVMArgs is how Kafka's connect-standalone.sh runs a worker (kafka-run-class.sh's defaults); the
// worker's and the connectors' properties files follow.
func JVMArgs(lib string) []string {
	return []string{"-Xms256m", "-Xmx2g", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
		"-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(lib, "log4j2.properties"),
		"-cp", filepath.Join(lib, "*"), "org.apache.kafka.connect.cli.ConnectStandalone"}
}

// DistributedJVMArgs is how Kafka's connect-distributed.sh runs a worker: the same JVM as
// JVMArgs, the distributed worker's main class; its one argument, the worker's properties file,
// follows. Connectors are created through its REST API (CreateConnector).
func DistributedJVMArgs(lib string) []string {
	args := JVMArgs(lib)
	return append(args[:len(args)-1], "org.apache.kafka.connect.cli.ConnectDistributed")
}
