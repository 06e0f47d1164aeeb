package config_test

import (
	"bytes"
	"flag"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/config"
)

func TestABooleanFlagAloneMeansTrue(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--failover"}, true},
		{[]string{"-failover"}, true},
		{[]string{"--failover=true"}, true},
		{[]string{"--failover=false"}, false},
		{nil, false},
	} {
		c, _, err := load(t, "", required(), tc.args...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.Failover != tc.want {
			t.Errorf("%v: failover = %v, want %v", tc.args, c.Failover, tc.want)
		}
	}
	// A default true is turned off with =false, and --flag alone leaves it on.
	for _, tc := range []struct {
		args []string
		want bool
	}{{[]string{"--create-slot=false"}, false}, {[]string{"--create-slot"}, true}} {
		c, _, err := load(t, "", required(), tc.args...)
		if err != nil || c.CreateSlot != tc.want {
			t.Errorf("%v: create_slot = %v (err %v), want %v", tc.args, c.CreateSlot, err, tc.want)
		}
	}
}

// TestAFlagValueIsCheckedWithItsKeyAndSource: the flag takes any text; the key's parser refuses it
// at Load, naming the key and the flag it came from.
func TestAFlagValueIsCheckedWithItsKeyAndSource(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"--failover=perhaps", `config key failover (from --failover): want true or false, got "perhaps"`},
		{"--kafka.linger=soon", `config key kafka.linger (from --kafka.linger): want a non-negative duration`},
		{"--max-in-flight-bytes=lots", `config key max_in_flight_bytes (from --max-in-flight-bytes): want a positive size`},
		{"--delivery=twice", `config key delivery (from --delivery): want one of at-least-once, exactly-once`},
	} {
		_, _, err := load(t, "", required(), tc.arg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.arg, err, tc.want)
		}
	}
}

// TestACommandsHelpListsItsKeysAlone: a command given its keys lists those only, while flags, the
// file and the environment still set any key (one configuration serves every command).
func TestACommandsHelpListsItsKeysAlone(t *testing.T) {
	fs := flag.NewFlagSet("outbox-relay prune", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	env := with(required(), "OUTBOX_DELIVERY", "exactly-once")
	l := config.NewLoader(fs, func(name string) string { return env[name] }, "pg_dsn", "slot", "prune_older_than")
	if err := fs.Parse([]string{"--slot=s1", "--prune-older-than=1h", "--kafka.linger=5ms"}); err != nil {
		t.Fatal(err)
	}
	c, err := l.Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.Slot != "s1" || c.PruneOlderThan.String() != "1h0m0s" || c.Delivery != "exactly-once" || c.Kafka.Linger.String() != "5ms" {
		t.Errorf("slot %q, prune_older_than %s, delivery %q, kafka.linger %s: want s1, 1h, exactly-once from the environment and 5ms from a flag help does not list",
			c.Slot, c.PruneOlderThan, c.Delivery, c.Kafka.Linger)
	}
	var help bytes.Buffer
	l.Usage(&help, "Deletes rows.")
	for _, want := range []string{"Usage: outbox-relay prune [flags]", "Deletes rows.", "PostgreSQL:\n  --pg-dsn string\n", "  --slot string\n", "Operations:\n  --prune-older-than duration\n", "(default 24h) [OUTBOX_PRUNE_OLDER_THAN]", "  --config file\n", "the flags of the others are accepted"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, help.String())
		}
	}
	for _, unwanted := range []string{"Kafka:", "--kafka-brokers", "--delivery"} {
		if strings.Contains(help.String(), unwanted) {
			t.Errorf("help shows %q, a key the command does not use:\n%s", unwanted, help.String())
		}
	}
}

// TestHelpShowsEachKeyWithItsType: booleans as switches (no value, no "(default false)"),
// durations, sizes, lists and choices as such.
func TestHelpShowsEachKeyWithItsType(t *testing.T) {
	fs := flag.NewFlagSet("outbox-relay run", flag.ContinueOnError)
	l := config.NewLoader(fs, nil)
	var help bytes.Buffer
	l.Usage(&help, "")
	for _, want := range []string{
		"\n  --failover\n", "\n  --kafka.tls.enabled\n", "\n  --create-slot\n",
		"\n  --kafka.linger duration\n", "\n  --max-in-flight-bytes size\n", "\n  --kafka-brokers list\n",
		"\n  --delivery at-least-once|exactly-once\n", "\n  --max-in-flight-events int|auto\n", "\n  --poll-workers int\n", "\n  --table [schema.]table\n",
		"(default true) [OUTBOX_CREATE_SLOT]",
	} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
	if strings.Contains(help.String(), "(default false)") || strings.Contains(help.String(), "--failover string") {
		t.Errorf("help shows a boolean as a string or with (default false):\n%s", help.String())
	}
	groups := 0
	for _, g := range []config.Group{config.GroupPostgres, config.GroupOutbox, config.GroupKafka, config.GroupRouting, config.GroupDelivery, config.GroupOperations} {
		if strings.Contains(help.String(), "\n"+string(g)+":\n") {
			groups++
		}
	}
	if groups != 6 {
		t.Errorf("run's help shows %d of the 6 groups:\n%s", groups, help.String())
	}
}

// TestEveryKeyHasAGroupAndATypeItsDefaultFits keeps the settings table honest: a key's type is the
// one its default and its parser have.
func TestEveryKeyHasAGroupAndATypeItsDefaultFits(t *testing.T) {
	for _, k := range config.Keys() {
		if k.Group == "" || k.Type == "" {
			t.Errorf("%s: group %q, type %q", k.Name, k.Group, k.Type)
		}
		if k.Default == "" {
			continue
		}
		switch {
		case k.Type == "bool":
			if _, err := strconv.ParseBool(k.Default); err != nil {
				t.Errorf("%s: a bool with default %q", k.Name, k.Default)
			}
		case k.Type == "int":
			if _, err := strconv.Atoi(k.Default); err != nil {
				t.Errorf("%s: an int with default %q", k.Name, k.Default)
			}
		case strings.Contains(k.Type, "|") && !strings.Contains(k.Type, "duration"):
			if !slices.Contains(strings.Split(k.Type, "|"), k.Default) {
				t.Errorf("%s: default %q is not one of %s", k.Name, k.Default, k.Type)
			}
		}
	}
}
