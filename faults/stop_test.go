package faults

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestSIGTERMWhileTheDeadLetterTopicIsMissing runs the relay against brokers that do not create
// topics, with no dead-letter topic. An event with an invalid topic name must go there, so the
// relay waits for a topic that will not appear: /readyz must say so, and SIGTERM must still end the
// process within shutdown_timeout (the leader lock is released with it, so a standby can take over)
// instead of waiting for the topic for ever.
func TestSIGTERMWhileTheDeadLetterTopicIsMissing(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t, devenv.KafkaOptions{Settings: map[string]string{"auto.create.topics.enable": "false"}})
	d := newDB(t, testenv.SharedPostgres(t), 1)
	dlq := testenv.UniqueName(t, "dlq")
	const shutdownTimeout = 2 * time.Second
	r := d.startRelay(k.Brokers(), "--dead-letter-topic="+dlq, "--shutdown-timeout="+shutdownTimeout.String())
	r.waitSessions(1, 90*time.Second)
	if err := d.outbox.WriteTx(context.Background(), harness.Spec{AggregateType: badAggregateType, AggregateID: "b-1"}); err != nil {
		t.Fatal(err)
	}
	const missing = "the brokers do not create it; create it"
	if _, ok := r.waitLog(0, missing, 60*time.Second); !ok {
		t.Fatal("the relay did not log that the dead-letter topic is missing and must be created")
	}
	line := ""
	for _, l := range strings.Split(r.Output(), "\n") {
		if strings.Contains(l, missing) {
			line = l
			break
		}
	}
	if !strings.Contains(line, `"level":"error"`) || !strings.Contains(line, dlq) {
		t.Errorf("the log line about the missing topic is not an error naming %s: %s", dlq, line)
	}
	if got := r.mustMetric("topic_unavailable", `topic="`+dlq+`"`); got != 1 {
		t.Errorf("topic_unavailable{topic=%q} = %v, want 1", dlq, got)
	}
	client := http.Client{Timeout: 5 * time.Second}
	res, err := client.Get("http://" + r.metrics + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), dlq) {
		t.Errorf("/readyz answered %d %q while stalled on the missing topic, want 503 naming %s", res.StatusCode, body, dlq)
	}

	start := time.Now()
	r.Terminate()
	// shutdown_timeout, the sink's 1s close, and the process's exit on a loaded machine.
	if _, ok := r.Wait(shutdownTimeout + 15*time.Second); !ok {
		t.Fatalf("the relay did not exit within %v of SIGTERM (shutdown_timeout %v) while waiting for the dead-letter topic",
			time.Since(start).Round(time.Millisecond), shutdownTimeout)
	}
	t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}
