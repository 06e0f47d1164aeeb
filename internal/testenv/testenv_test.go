package testenv_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestUniqueName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z][a-z0-9_]{0,59}$`)
	t.Run("Sub Test/With-Odd.Chars"+strings.Repeat("x", 80), func(t *testing.T) {
		a, b := testenv.UniqueName(t, "Slot"), testenv.UniqueName(t, "slot")
		if a == b || !valid.MatchString(a) || !strings.HasPrefix(a, "slot_testuniquename_sub_test_with_odd_chars") {
			t.Fatalf("UniqueName = %q, %q", a, b)
		}
	})
	if n := testenv.UniqueName(t, "9"); !valid.MatchString(n) {
		t.Fatalf("UniqueName = %q", n)
	}
}

func TestShared(t *testing.T) {
	pg := testenv.SharedPostgres(t)
	if pg != testenv.SharedPostgres(t) {
		t.Fatal("SharedPostgres started twice")
	}
	db := testenv.UniqueName(t, "db")
	if _, err := pg.CreateDatabase(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	k := testenv.SharedKafka(t)
	if err := k.CreateTopic(context.Background(), testenv.UniqueName(t, "topic"), 2); err != nil {
		t.Fatal(err)
	}
}

func TestDedicated(t *testing.T) {
	pg := testenv.Postgres(t)
	if pg == testenv.SharedPostgres(t) {
		t.Fatal("dedicated instance is the shared one")
	}
	if err := pg.Exec(context.Background(), "outbox", "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

func TestSharedRegistry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := testenv.SharedRegistry(t)
	if reg != testenv.SharedRegistry(t) {
		t.Fatal("SharedRegistry started twice")
	}
	subject := testenv.UniqueName(t, "subject") + "-value"
	if err := reg.SetCompatibility(ctx, subject, "BACKWARD"); err != nil {
		t.Fatal(err)
	}
	schema := sr.Schema{Type: sr.TypeAvro, Schema: `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"}]}`}
	// sr's own client gives up after 5 s: a cold registry on a loaded machine can take longer.
	plain, err := sr.NewClient(sr.URLs(reg.ConfluentURL()), sr.HTTPClient(&http.Client{Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	registered, err := plain.CreateSchema(ctx, subject, schema)
	if err != nil {
		t.Fatalf("register over HTTP: %v", err)
	}

	// The HTTPS port serves the same registry, with a certificate of the CA in TLSCAFile.
	caPEM, err := os.ReadFile(reg.TLSCAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	httpsClient := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	secure, err := sr.NewClient(sr.URLs(reg.TLSURL()), sr.HTTPClient(httpsClient))
	if err != nil {
		t.Fatal(err)
	}
	again, err := secure.CreateSchema(ctx, subject, schema)
	if err != nil {
		t.Fatalf("register over HTTPS: %v", err)
	}
	if again.ID != registered.ID || again.Version != 1 {
		t.Fatalf("the same schema registered again: id %d version %d, want id %d version 1", again.ID, again.Version, registered.ID)
	}

	// The rule set above holds: a new required field without a default is not backward compatible.
	_, err = plain.CreateSchema(ctx, subject, sr.Schema{Type: sr.TypeAvro,
		Schema: `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"total","type":"long"}]}`})
	var rerr *sr.ResponseError
	if !errors.As(err, &rerr) || rerr.StatusCode != http.StatusConflict {
		t.Fatalf("incompatible schema: err %v, want a 409", err)
	}
}
