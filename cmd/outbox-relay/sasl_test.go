package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/devenv"
	"github.com/outbox-relay/outbox-relay/internal/harness"
	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// SCRAM credentials of the dedicated broker; neither password may appear in any output.
const (
	scramUser          = "relay"
	scramPassword      = "scram-relay-secret-4f2a"
	scramWrongPassword = "scram-wrong-secret-9d3b"
)

func TestSCRAMSHA512AuthenticatesTheRelayAndAWrongPasswordIsAClearFatalError(t *testing.T) {
	// A broker of its own with a SASL_PLAINTEXT listener (SCRAM users created at format time) next
	// to the PLAINTEXT one the test's consumer uses.
	k := testenv.Kafka(t, devenv.KafkaOptions{SCRAMUsers: map[string]string{scramUser: scramPassword}})
	f := newHAFixture(t, testenv.SharedPostgres(t), k.Brokers(), 2)
	ctx := context.Background()
	sasl := func(password string) map[string]string {
		return map[string]string{
			"OUTBOX_KAFKA_BROKERS":        k.SASLBrokers(),
			"OUTBOX_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
			"OUTBOX_KAFKA_SASL_USERNAME":  scramUser,
			"OUTBOX_KAFKA_SASL_PASSWORD":  password,
		}
	}

	t.Run("the right password streams end to end", func(t *testing.T) {
		r := f.start("relay-scram", sasl(scramPassword))
		f.waitStreamer(t, r, haStartTimeout)
		for i := range 20 {
			spec := harness.Spec{AggregateType: f.types[i%2], AggregateID: "a", Headers: map[string]string{"n": string(rune('a' + i))}}
			if err := f.outbox.WriteTx(ctx, spec); err != nil {
				t.Fatal(err)
			}
		}
		rep := f.verify(t, k.Brokers())
		t.Logf("through SCRAM-SHA-512: %s", rep)
		r.stop(t)
		if out := r.Output(); strings.Contains(out, scramPassword) {
			t.Errorf("output reveals the SASL password:\n%s", out)
		}
	})

	t.Run("a wrong password ends the relay with one clear line", func(t *testing.T) {
		f.slot = testenv.UniqueName(t, "slot") // a fresh slot: nothing to stream, only to refuse
		code, out := relayproc.Run(t, relayproc.Options{Env: f.env("relay-wrong", sasl(scramWrongPassword))}, 60*time.Second)
		if code != 1 {
			t.Fatalf("exit status %d, want 1:\n%s", code, out)
		}
		last := out[strings.LastIndex(strings.TrimRight(out, "\n"), "\n")+1:]
		for _, want := range []string{"refused the relay's credentials", "kafka.sasl"} {
			if !strings.Contains(last, want) {
				t.Errorf("last line lacks %q: %s", want, last)
			}
		}
		for _, secret := range []string{scramWrongPassword, scramPassword} {
			if strings.Contains(out, secret) {
				t.Errorf("output reveals a SASL password:\n%s", out)
			}
		}
		t.Logf("fatal line: %s", last)
	})
}
