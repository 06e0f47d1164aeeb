package main

// Binary-level tests of exactly-once delivery where the single-leader deployment meets Kafka's
// producer fencing: a zombie leader (paused past its lease while a standby took over) and a
// transactional id shared by mistake.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/await"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// eosEnv is the environment of an exactly-once relay with a quick lease, so a paused leader is
// replaced within seconds (lease = 1s + 2 x 1s + 2s).
func eosEnv(extra map[string]string) map[string]string {
	env := map[string]string{
		"OUTBOX_DELIVERY":              "exactly-once",
		"OUTBOX_LEADER_CHECK_TIMEOUT":  "1s",
		"OUTBOX_LEADER_RETRY_INTERVAL": "300ms",
		"OUTBOX_STATUS_INTERVAL":       "500ms",
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// verifyCommitted is verify with a read_committed consumer: every written event, in order per
// aggregate, and no duplicate.
func (f *haFixture) verifyCommitted(t *testing.T) harness.Report {
	t.Helper()
	written := f.outbox.Written()
	c := harness.NewCommittedConsumer(f.brokers, harness.Topics(written, nil)...)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), haDeliverTimeout)
	defer cancel()
	err := c.ReadUntil(ctx, 2*time.Second, func(recs []harness.Record) bool {
		return harness.Verify(written, recs, nil).Missing == 0
	})
	rep := harness.Verify(written, c.Records(), nil)
	if err != nil || !rep.OK() || rep.Duplicates != 0 {
		t.Fatalf("read_committed delivery check failed (read error: %v): %s", err, rep)
	}
	return rep
}

func TestAZombieLeaderIsFencedByKafkaAndWritesNothingAReadCommittedConsumerSees(t *testing.T) {
	t.Parallel()
	f := newHAFixture(t, testenv.SharedPostgres(t), testenv.SharedKafka(t).Brokers(), 2)
	a := f.start("relay-a", eosEnv(nil))
	f.waitStreamer(t, a, haStartTimeout)
	b := f.start("relay-b", eosEnv(nil))
	b.waitLog(t, haStartTimeout, "", "another instance holds the leader lock")
	w := f.startWriter(context.Background(), 7)
	writing := true
	defer func() {
		if writing {
			w.stop(t)
		}
	}()
	await.True(t, haDeliverTimeout, "relay-a to commit Kafka transactions", func() bool {
		return a.findLog("info", "the first Kafka transaction committed") != nil
	})
	aMetrics := a.metricsAddr(t)
	f.outbox.AwaitMore(t, 30, "into a's open Kafka transaction")

	// The pause: a keeps its sockets, its lock session and its walsender, and answers nothing.
	if err := syscall.Kill(a.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(a.PID(), syscall.SIGCONT)
		}
	}
	defer resume()
	f.waitStreamer(t, b, time.Minute)
	b.waitLog(t, time.Minute, "info", "transactional producer ready")
	bMetrics := b.metricsAddr(t)
	await.True(t, haDeliverTimeout, "relay-b to publish", func() bool {
		return sumMetric(scrape(t, bMetrics), "outbox_relay_events_published_total") > 0
	})
	t.Logf("relay-b took over and published %s after relay-a was paused", time.Since(paused).Round(time.Millisecond))

	mark := len(a.Output())
	resume()
	// The zombie wakes up with produce requests and a transaction to commit: Kafka refuses them
	// (its epoch is older than b's), and its lock is gone. It must say so and stand by.
	await.True(t, time.Minute, "relay-a to notice it was replaced", func() bool {
		out := a.Output()[mark:]
		return strings.Contains(out, "Standing by") || strings.Contains(out, "lost the leader lock connection")
	})
	await.True(t, time.Minute, "relay-a to stand by", func() bool {
		return strings.Contains(a.Output()[mark:], "another instance holds the leader lock")
	})
	if a.Exited() {
		t.Fatalf("relay-a exited; it must stand by:\n%s", a.Output()[mark:])
	}
	// Standing by, relay-a's run has ended (the stand-by line comes after it): from here to the end
	// of the test, while b goes on committing, a late commit by a has no business being counted.
	committedBefore := sumMetric(scrape(t, aMetrics), "outbox_relay_kafka_transactions_total", `outcome="committed"`)
	for _, l := range a.logs()[strings.Count(a.Output()[:mark], "\n"):] {
		if l["level"] == "error" || l["level"] == "warn" {
			t.Logf("relay-a after the pause: %s %v", l["level"], l["msg"])
		}
	}
	if app, _ := f.streamer(); app != "relay-b" {
		t.Fatalf("%q streams the slot after the zombie woke up, want relay-b", app)
	}

	w.stop(t)
	writing = false
	rep := f.verifyCommitted(t)
	t.Logf("read_committed: %s", rep)
	if after := sumMetric(scrape(t, aMetrics), "outbox_relay_kafka_transactions_total", `outcome="committed"`); after != committedBefore {
		t.Errorf("relay-a committed %v Kafka transactions after it was replaced", after-committedBefore)
	}
	b.stop(t)
	a.stop(t)
}

func TestARelayFencedByKafkaWhileItHoldsItsLockExitsNamingTransactionalID(t *testing.T) {
	t.Parallel()
	pg := testenv.SharedPostgres(t)
	brokers := testenv.SharedKafka(t).Brokers()
	// Two slots configured with one transactional id: a mistake the leader election cannot see.
	shared := map[string]string{"OUTBOX_TRANSACTIONAL_ID": testenv.UniqueName(t, "shared")}
	f1, f2 := newHAFixture(t, pg, brokers, 1), newHAFixture(t, pg, brokers, 1)
	r1 := f1.start("relay-1", eosEnv(shared))
	f1.waitStreamer(t, r1, haStartTimeout)
	w := f1.startWriter(context.Background(), 11)
	r1.waitLog(t, haDeliverTimeout, "info", "the first Kafka transaction committed")
	w.stop(t)

	// The other slot's relay starts twice while relay-1 is idle, so the producer epoch is two
	// ahead of relay-1's when it next writes: the sink's check for a newer producer (InitProducerId
	// with its own epoch) cannot take relay-1's epoch for the one just before the current one,
	// which the coordinator accepts as a retry (see the report on the sink's fencing check).
	for _, name := range []string{"relay-2", "relay-3"} {
		r := f2.start(name, eosEnv(shared))
		r.waitLog(t, haStartTimeout, "info", "transactional producer ready")
		f2.waitStreamer(t, r, haStartTimeout)
		if name == "relay-2" {
			r.stop(t)
		}
	}
	w = f1.startWriter(context.Background(), 12)
	defer w.stop(t)
	code, ok := r1.Wait(time.Minute)
	if !ok || code != 1 {
		t.Fatalf("relay-1: exit status %d (exited: %v), want 1:\n%s", code, ok, r1.Output())
	}
	last := lastLine(r1.Output())
	for _, want := range []string{"fenced by Kafka", "transactional_id", "still holds the leader lock"} {
		if !strings.Contains(last, want) {
			t.Errorf("relay-1's last line lacks %q: %s", want, last)
		}
	}
	t.Logf("relay-1: %s", last)
}

// eosRunEnv is the environment of a relay started with relayproc.Run for an error it must end with.
func (f *haFixture) eosRunEnv(name string, extra map[string]string) map[string]string {
	env := f.env(name, eosEnv(nil))
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// lastLine is the last line of a process's output.
func lastLine(out string) string {
	out = strings.TrimRight(out, "\n")
	return out[strings.LastIndex(out, "\n")+1:]
}

func TestAPositionsTopicDeletedStopsTheRelayWithTheFix(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKafka(t)
	f := newHAFixture(t, testenv.SharedPostgres(t), k.Brokers(), 1)
	topic := testenv.UniqueName(t, "positions")
	extra := map[string]string{"OUTBOX_POSITIONS_TOPIC": topic}
	r := f.start("relay-p", eosEnv(extra))
	f.waitStreamer(t, r, haStartTimeout)
	for i := range 10 {
		if err := f.outbox.WriteTx(context.Background(), harness.Spec{AggregateType: f.types[0], AggregateID: fmt.Sprint(i % 3)}); err != nil {
			t.Fatal(err)
		}
	}
	r.waitLog(t, haDeliverTimeout, "info", "the first Kafka transaction committed")
	f.verifyCommitted(t)
	r.stop(t)

	// status shows the mode and the committed position.
	statusEnv := f.eosRunEnv("status", extra)
	code, out := relayproc.Run(t, relayproc.Options{Subcommand: "status", Args: []string{"--json"}, Env: statusEnv}, 30*time.Second)
	var st struct {
		Delivery struct {
			Mode            string `json:"mode"`
			TransactionalID string `json:"transactional_id"`
			Position        *struct {
				CommitLSN string `json:"commit_lsn"`
				Events    int    `json:"events"`
			} `json:"committed_position"`
		} `json:"delivery"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("status --json: exit %d, %v:\n%s", code, err, out)
	}
	if st.Delivery.Mode != "exactly-once" || st.Delivery.Position == nil || st.Delivery.Position.Events == 0 ||
		!strings.HasPrefix(st.Delivery.TransactionalID, "outbox-relay-") || !strings.HasSuffix(st.Delivery.TransactionalID, "-"+f.slot) {
		t.Fatalf("status --json delivery = %+v, want exactly-once with a committed position and the default transactional id:\n%s", st.Delivery, out)
	}
	t.Logf("status: delivery %+v, position %+v", st.Delivery, *st.Delivery.Position)

	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 30 * time.Second}
	res, err := client.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatal(err)
	}
	code, out = relayproc.Run(t, relayproc.Options{Env: f.eosRunEnv("relay-p2", extra)}, 2*time.Minute)
	if code != 1 {
		t.Fatalf("exit status %d, want 1:\n%s", code, out)
	}
	last := lastLine(out)
	for _, want := range []string{topic, "holds no position", "cleanup.policy=compact", "kafka_transactional_id = NULL", f.slot} {
		if !strings.Contains(last, want) {
			t.Errorf("last line lacks %q: %s", want, last)
		}
	}
	t.Logf("fatal line: %s", last)
	if strings.Contains(out, `"msg":"streaming"`) {
		t.Errorf("the relay streamed before refusing:\n%s", out)
	}
	code, out = relayproc.Run(t, relayproc.Options{Subcommand: "status", Env: statusEnv}, 30*time.Second)
	if code != exitSlotProblem || !strings.Contains(out, "PROBLEM: exactly-once") {
		t.Errorf("status after the loss: exit %d, want %d and a PROBLEM line:\n%s", code, exitSlotProblem, out)
	}
}

func TestExactlyOnceAgainstABrokerThatRefusesItIsAClearErrorNeverAFallback(t *testing.T) {
	t.Parallel()
	// A broker of its own with SCRAM users and an authorizer: the relay's principal may do
	// everything no ACL mentions; the test denies it one transactional id and one topic, and a
	// second principal (rotorUser, unused here otherwise) the idempotent producer.
	k := testenv.Kafka(t, devenv.KafkaOptions{SCRAMUsers: map[string]string{scramUser: scramPassword, rotorUser: rotorPassword}, Settings: map[string]string{
		"authorizer.class.name":          "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
		"super.users":                    "User:ANONYMOUS",
		"allow.everyone.if.no.acl.found": "true",
	}})
	f := newHAFixture(t, testenv.SharedPostgres(t), k.Brokers(), 1)
	deniedID, unreadable := testenv.UniqueName(t, "denied"), testenv.UniqueName(t, "unreadable")
	if err := k.CreateTopic(context.Background(), unreadable, 1); err != nil {
		t.Fatal(err)
	}
	// Another relay's position in it, so reading the topic means fetching from it (an empty
	// partition is known to hold no position without a fetch, and a fetch is what READ guards).
	w := &kafka.Writer{Addr: kafka.TCP(k.Brokers()), Topic: unreadable, RequiredAcks: kafka.RequireAll}
	if err := w.WriteMessages(context.Background(), kafka.Message{Key: []byte("another-relay"), Value: []byte(`{"v":1,"commit_lsn":"0/1","events":1}`)}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	admin := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 30 * time.Second}
	aclFor := func(user string, perm kafka.ACLPermissionType, typ kafka.ResourceType, name string, op kafka.ACLOperationType) kafka.ACLEntry {
		return kafka.ACLEntry{ResourceType: typ, ResourceName: name, ResourcePatternType: kafka.PatternTypeLiteral,
			Principal: "User:" + user, Host: "*", Operation: op, PermissionType: perm}
	}
	acl := func(perm kafka.ACLPermissionType, typ kafka.ResourceType, name string, op kafka.ACLOperationType) kafka.ACLEntry {
		return aclFor(scramUser, perm, typ, name, op)
	}
	// The positions topic may be described and written, not read: once a resource has an ACL,
	// allow.everyone.if.no.acl.found no longer applies to it.
	res, err := admin.CreateACLs(context.Background(), &kafka.CreateACLsRequest{ACLs: []kafka.ACLEntry{
		acl(kafka.ACLPermissionTypeDeny, kafka.ResourceTypeTransactionalID, deniedID, kafka.ACLOperationTypeWrite),
		acl(kafka.ACLPermissionTypeAllow, kafka.ResourceTypeTopic, unreadable, kafka.ACLOperationTypeDescribe),
		acl(kafka.ACLPermissionTypeAllow, kafka.ResourceTypeTopic, unreadable, kafka.ACLOperationTypeWrite),
		acl(kafka.ACLPermissionTypeDeny, kafka.ResourceTypeTopic, unreadable, kafka.ACLOperationTypeRead),
		// The idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic
		// (KIP-679): the second principal has neither.
		aclFor(rotorUser, kafka.ACLPermissionTypeDeny, kafka.ResourceTypeCluster, "kafka-cluster", kafka.ACLOperationTypeIdempotentWrite),
		aclFor(rotorUser, kafka.ACLPermissionTypeDeny, kafka.ResourceTypeTopic, "*", kafka.ACLOperationTypeWrite),
	}})
	if err == nil {
		err = errors.Join(res.Errors...)
	}
	if err != nil {
		t.Fatal(err)
	}
	sasl := map[string]string{
		"OUTBOX_KAFKA_BROKERS": k.SASLBrokers(), "OUTBOX_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
		"OUTBOX_KAFKA_SASL_USERNAME": scramUser, "OUTBOX_KAFKA_SASL_PASSWORD": scramPassword,
	}
	tests := []struct {
		name        string
		atLeastOnce bool
		extra       map[string]string
		want        []string
	}{
		{"a transactional id the relay may not use", false, map[string]string{"OUTBOX_TRANSACTIONAL_ID": deniedID},
			[]string{deniedID, "TransactionalId"}},
		{"a positions topic the relay may not read", false, map[string]string{"OUTBOX_POSITIONS_TOPIC": unreadable},
			[]string{unreadable, "positions_topic", "Read"}},
		// At-least-once too: and a producer stopped for good is not said to be exactly-once's,
		// with an open transaction it never had.
		{"at least once, an idempotent producer the relay may not use", true,
			map[string]string{"OUTBOX_KAFKA_IDEMPOTENCE": "on", "OUTBOX_KAFKA_SASL_USERNAME": rotorUser, "OUTBOX_KAFKA_SASL_PASSWORD": rotorPassword},
			[]string{"kafka.idempotence", "IDEMPOTENT_WRITE"}},
	}
	for _, tt := range tests {
		t.Run(tt.name+" ends the relay with the fix", func(t *testing.T) {
			f.slot = testenv.UniqueName(t, "slot")
			env := f.eosRunEnv("relay-denied", sasl)
			if tt.atLeastOnce {
				env = f.env("relay-denied", sasl)
			}
			for k, v := range tt.extra {
				env[k] = v
			}
			code, out := relayproc.Run(t, relayproc.Options{Env: env}, 2*time.Minute)
			if code != 1 {
				t.Fatalf("exit status %d, want 1:\n%s", code, out)
			}
			last := lastLine(out)
			for _, want := range tt.want {
				if !strings.Contains(last, want) {
					t.Errorf("last line lacks %q: %s", want, last)
				}
			}
			if strings.Contains(out, `"msg":"streaming"`) {
				t.Errorf("the relay streamed before refusing:\n%s", out)
			}
			if tt.atLeastOnce && strings.Contains(out, "exactly-once") {
				t.Errorf("an at-least-once relay's output speaks of exactly-once:\n%s", out)
			}
			if strings.Contains(out, scramPassword) || strings.Contains(out, rotorPassword) {
				t.Error("output reveals a SASL password")
			}
			t.Logf("fatal line: %s", last)
		})
	}
}
