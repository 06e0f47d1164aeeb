package testenv_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

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
