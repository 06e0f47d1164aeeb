package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/chaos/cluster"
)

// The network faults beyond a clean cut, each on one relay's own path (issue 39, item 10): a slow
// network, the replies of Kafka or of PostgreSQL lost while requests still arrive, a partition
// healed before either side gave up on its connections, and the leader lock's session cut alone
// while replication and Kafka go on.

// netDuration draws how long a network fault lasts and, for a slow network, how slow: the detail
// holds the whole shaping (parseShaping reads it back), so that the history says what was applied.
func netDuration(kind string, rng *rand.Rand, between func(lo, hi time.Duration) time.Duration) (time.Duration, string) {
	switch kind {
	case kindNetSlow:
		d := between(5*time.Second, 30*time.Second)
		latency := between(20*time.Millisecond, 250*time.Millisecond).Round(time.Millisecond)
		jitter := between(0, latency/2).Round(time.Millisecond)
		rate := int64(64<<10) << rng.IntN(5) // 64 KiB/s to 1 MiB/s each way
		return d, formatShaping(cluster.Shaping{Latency: latency, Jitter: jitter, Rate: rate})
	case kindCutHealOpen:
		// Under leader_check_timeout (2 s) nothing gives up and the connections go on; past it the
		// leader fences itself and its connections end on its side.
		if rng.IntN(2) == 0 {
			return between(300*time.Millisecond, 1800*time.Millisecond), "shorter than the leader check timeout"
		}
		return between(2*time.Second, 15*time.Second), "longer than the leader check timeout"
	}
	return between(2*time.Second, 20*time.Second), "" // the one-way cuts and the leader lock's
}

func formatShaping(s cluster.Shaping) string {
	return fmt.Sprintf("latency %dms, jitter %dms, %d bytes/s", s.Latency.Milliseconds(), s.Jitter.Milliseconds(), s.Rate)
}

// parseShaping reads formatShaping's detail back.
func parseShaping(detail string) (cluster.Shaping, error) {
	var latency, jitter, rate int64
	if _, err := fmt.Sscanf(detail, "latency %dms, jitter %dms, %d bytes/s", &latency, &jitter, &rate); err != nil {
		return cluster.Shaping{}, fmt.Errorf("net-slow detail %q: want \"latency <n>ms, jitter <n>ms, <n> bytes/s\": %w", detail, err)
	}
	return cluster.Shaping{Latency: time.Duration(latency) * time.Millisecond, Jitter: time.Duration(jitter) * time.Millisecond, Rate: rate}, nil
}

// actNet applies the network fault f to its relay's path, waits its duration (or until ctx ends)
// and heals it.
func actNet(ctx context.Context, c *cluster.Cluster, f *fault, heal func(func(context.Context) error)) error {
	name := f.relay.name
	var end func()
	switch f.kind {
	case kindNetSlow:
		s, err := parseShaping(f.detail)
		if err != nil {
			return err
		}
		c.SlowNetwork(name, s)
		end = func() { c.SlowNetwork(name, cluster.Shaping{}) }
	case kindOneWayKafka:
		// A produce is appended and its acknowledgement lost: the relay sends it again.
		c.CutKafkaReplies(name)
		end = func() { c.HealKafka(name) }
	case kindOneWayPG:
		// Statements run and their answers are lost; the relay's status updates still arrive.
		c.CutPostgresReplies(name)
		end = func() { c.HealPostgres(name) }
	case kindCutHealOpen:
		c.CutAll(name)
		end = func() { c.HealAllOpen(name) }
	case kindCutLeaderLock:
		c.CutLeaderLock(name)
		end = func() { c.HealLeaderLock(name) }
	default:
		return fmt.Errorf("actNet: %s is not a network fault", f.kind)
	}
	sleep(ctx, f.d)
	heal(func(context.Context) error { end(); return nil })
	return nil
}
