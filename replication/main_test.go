package replication

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestMain lets the package's tests share one PostgreSQL cluster (testenv.SharedPostgres).
func TestMain(m *testing.M) { testenv.Main(m) }
