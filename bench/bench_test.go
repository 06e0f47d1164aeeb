package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/relayproc"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// runTopic matches the topics a run names (its prefix, Run's b.run, then its own names).
var runTopic = regexp.MustCompile(`^b[0-9a-f]{8}[._]`)

var summaryLine = regexp.MustCompile(`^bench: relay_vs_ceiling=(\d+\.\d\d) relay_vs_debezium=(n/a|\d+\.\d) p99_ms=(\d+) rss_mb=(\d+) big_tx_rss_mb=(\d+) ` +
	`exactly_once_vs_relay=(\d+\.\d\d) exactly_once_p99_ms=(\d+) first_record_s=(\d+\.\d\d) msg_write_x=(\d+\.\d) msg_wal_x=(\d+\.\d) msg_relay_vs_ceiling=(\d+\.\d\d) ` +
	`standby_primary_cpu_x=n/a shards_drain_x=n/a shards_walsender_cpu_x=n/a$`)

// The smoke run goes through the same code as `make bench` with a tiny backlog, one round: the
// ceiling and the relay drain it, the relay runs a short steady state and a large transaction, an
// in-process relay writes profiles, and the table-free outbox's backlog and producers are measured.
// Debezium is not run (a Connect JVM costs more than the rest of this test and its jars are fetched
// by `make bench`, not `make test`); its configuration is tested below. Nor is the Avro side (a
// schema registry's JVM for three relay flags: the encodings are tested in sink and
// cmd/outbox-relay), nor a second round (the rounds' table and slots are tested below on canned
// results). On PostgreSQL 17+ the poller drains once more with a standby listed in
// synchronized_standby_slots (a few seconds), and the poller's steady state after it shows that the
// setting was reset: its claims would otherwise wait for ever for the removed standby's slot. The
// relay's steady states are a sweep of the default setting alone (no steady state more than
// without it), whose table and chart come out; TestSweepTableAndChartMarkTheDefaults checks both
// on several canned settings.
func TestSmokeRunPrintsTheTableAndTheSummaryLine(t *testing.T) {
	pg := testenv.SharedPostgres(t)
	k := testenv.SharedKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dsn, err := pg.CreateDatabase(ctx, testenv.UniqueName(t, "bench"))
	if err != nil {
		t.Fatal(err)
	}
	sides, extraRows := []string{sideCeiling, sideRelay, sideRelayEOS, sidePoll, sideRecover}, []string(nil)
	if v, err := pg.Version(); err != nil {
		t.Fatal(err)
	} else if major, _ := strconv.Atoi(v); major >= 17 {
		sides = slices.Insert(sides, 4, sidePollStandby)
		extraRows = append(extraRows, "| outbox-relay, source poll, synchronized_standby_slots |")
	}
	profiles, charts := t.TempDir(), t.TempDir()
	cfg := Config{
		Events: 2000, Partitions: 2, Rate: 400, SteadyFor: 3 * time.Second, BigTx: 3000,
		Sides: sides, Steady: []string{sideRelay, sideRelayEOS, sidePoll},
		RelayBin: relayproc.PlainBinary(t), ProfileDir: profiles, WorkDir: t.TempDir(),
		Log: t.Output(), DrainTimeout: time.Minute, Messages: true, ProducerFor: time.Second, Rounds: 1,
		Sweep: []sweepPoint{{Linger: 15 * time.Millisecond}}, ChartDir: charts,
	}
	rep, err := Run(ctx, cfg, &Services{PG: pg, Kafka: k, DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	if failed := rep.Failed(); len(failed) > 0 {
		t.Fatalf("measurements failed:\n%s", strings.Join(failed, "\n"))
	}
	table, summary := rep.Table(), rep.Summary()
	t.Logf("\n%s\n%s", table, summary)

	for _, want := range append([]string{"| ceiling (pg_recvlogical) |", "| outbox-relay |", "| outbox-relay, exactly-once |", "| outbox-relay, source poll |",
		"| outbox-relay, lost-slot recovery from the table |", "Steady state: 400 events/s", "Large transaction: one transaction of 3000 events",
		"| messages |", "| ceiling (pg_recvlogical, messages) |", "| outbox-relay, messages |",
		"Against the targets (medians over the rounds):",
		"Sweep: the steady state", "| outbox-relay | linger 15 ms (default) |", "| outbox-relay, exactly-once | linger 15 ms, transaction_interval 100 ms (default) |",
		"| outbox-relay, source poll | its own |"}, extraRows...) {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	m := summaryLine.FindStringSubmatch(summary)
	if m == nil {
		t.Fatalf("summary line %q does not match %s", summary, summaryLine)
	}
	vsCeiling, _ := strconv.ParseFloat(m[1], 64)
	p99, _ := strconv.Atoi(m[3])
	rss, _ := strconv.Atoi(m[4])
	bigRSS, _ := strconv.Atoi(m[5])
	checks := []struct {
		what string
		ok   bool
	}{
		{fmt.Sprintf("relay_vs_ceiling %.2f is above 0 and below 10", vsCeiling), vsCeiling > 0 && vsCeiling < 10},
		{"relay_vs_debezium is n/a without Debezium", m[2] == "n/a"},
		{fmt.Sprintf("p99 %d ms is below 10 s", p99), p99 < 10_000},
		{fmt.Sprintf("steady RSS %d MB is between 5 MB and 1 GB", rss), rss >= 5 && rss < 1024},
		{fmt.Sprintf("large-transaction RSS %d MB is between 5 MB and 1 GB", bigRSS), bigRSS >= 5 && bigRSS < 1024},
		{fmt.Sprintf("exactly_once_vs_relay %s is above 0", m[6]), m[6] != "0.00"},
		{fmt.Sprintf("exactly-once p99 %s ms is below 10 s", m[7]), len(m[7]) < 5},
		{fmt.Sprintf("first_record_s %s is below 10 s", m[8]), len(m[8]) < 5},
		{"the message mode's numbers are there", m[9] != "" && m[10] != "" && m[11] != ""},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("want %s", c.what)
		}
	}

	for _, d := range rep.Drains {
		if d.Events != 2000 || d.Wall <= 0 || d.CPU <= 0 || d.PeakRSS <= 0 {
			t.Errorf("%s: implausible drain %+v", d.Side, d)
		}
		// The walsender's CPU for 2,000 events can round to zero clock ticks; procUsage is tested below.
	}
	relay := rep.drain(sideRelay)
	if relay == nil || relay.First <= 0 || relay.OnKafka < relay.First || relay.Wall < relay.OnKafka {
		t.Errorf("relay timings out of order: %+v", relay)
	}
	for _, side := range []string{sideRelay, sidePoll} {
		s := rep.steady(side)
		if s == nil || s.Received != s.Written || s.Written < 400 || s.P50 <= 0 || s.P50 > s.P99 || s.P99 > s.Max {
			t.Errorf("implausible steady state of %s: %+v", side, s)
		}
	}
	if p := rep.Profile; p == nil || p.Drain.AllocsPerEvent <= 0 || p.Steady == nil || p.Steady.AllocsPerEvent <= 0 || p.Drain.PeakHeap == 0 ||
		p.Messages == nil || p.Messages.AllocsPerEvent <= 0 || p.Messages.Wall <= 0 {
		t.Errorf("no profile stats: %+v", rep.Profile)
	}
	for _, name := range []string{"sweep.svg", "sweep.png", "drains.svg", "drains.png", "latency.svg", "latency.png"} {
		if fi, err := os.Stat(filepath.Join(charts, name)); err != nil || fi.Size() == 0 {
			t.Errorf("chart %s missing or empty (%v)", name, err)
		}
	}
	// Every measurement deleted its topics once measured: what is left of the run is the exactly-once
	// sides' positions topic.
	// A transport of its own: the default one answers Metadata from a cache up to 6 s old.
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers()), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, tp := range meta.Topics {
		if runTopic.MatchString(tp.Name) && !strings.HasSuffix(tp.Name, ".positions") {
			left = append(left, tp.Name)
		}
	}
	if len(left) > 0 {
		t.Errorf("the run left %d measured topics on the broker: %v", len(left), left)
	}
	for _, phase := range []string{"drain", "messages", "steady"} {
		for _, name := range []string{"cpu", "allocs", "mutex", "block"} {
			file := phase + "-" + name + ".pprof"
			if fi, err := os.Stat(filepath.Join(profiles, file)); err != nil || fi.Size() == 0 {
				t.Errorf("profile %s missing or empty (%v)", file, err)
			}
		}
	}
}

func TestProcUsageReadsCPUAndPeakRSSOfARunningProcess(t *testing.T) {
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) { // burn a few clock ticks
	}
	cpu, rss, err := procUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if cpu <= 0 || rss < 1<<20 {
		t.Errorf("procUsage = %s CPU, %d bytes peak RSS; want both positive, RSS above 1 MiB", cpu, rss)
	}
}

func TestDebeziumConfiguration(t *testing.T) {
	setup := debeziumSetup{
		DSN:     "postgres://postgres:s3cret@127.0.0.1:5433/bench?sslmode=disable",
		Brokers: "127.0.0.1:9092", Slot: "b1_debezium_tuned", Publication: "b1_pub",
		TopicPrefix: "b1.debezium-tuned", Name: "b1_debezium-tuned", OffsetsFile: "/tmp/offsets", RESTPort: 18083,
	}
	tests := []struct {
		name          string
		tuned         bool
		exactlyOnce   bool
		wantConnector map[string]string
		wantWorker    map[string]string
		absent        []string
		absentWorker  []string
	}{
		{
			name:  "the defaults route like the relay and leave Connect's producer and Debezium's queue alone",
			tuned: false,
			wantConnector: map[string]string{
				"plugin.name": "pgoutput", "slot.name": "b1_debezium_tuned", "publication.name": "b1_pub",
				"publication.autocreate.mode": "disabled", "snapshot.mode": "no_data",
				"database.hostname": "127.0.0.1", "database.port": "5433", "database.user": "postgres",
				"database.password": "s3cret", "database.dbname": "bench",
				"transforms.outbox.type":                    "io.debezium.transforms.outbox.EventRouter",
				"transforms.outbox.route.topic.replacement": "b1.debezium-tuned.${routedByValue}",
				"transforms.outbox.table.field.event.key":   "aggregate_id",
			},
			absent:       []string{"producer.override.linger.ms", "max.batch.size", "max.queue.size", "poll.interval.ms", "exactly.once.support"},
			wantWorker:   map[string]string{"offset.storage.file.filename": "/tmp/offsets"},
			absentWorker: []string{"exactly.once.source.support", "group.id"},
		},
		{
			name:  "exactly-once runs a distributed worker with exactly-once source support and requires it of the connector",
			tuned: true, exactlyOnce: true,
			wantConnector: map[string]string{
				"exactly.once.support": "required", "transaction.boundary": "poll",
				"producer.override.linger.ms": "10", "producer.override.enable.idempotence": "true",
				"transforms.outbox.route.topic.replacement": "b1.debezium-tuned.${routedByValue}",
			},
			wantWorker: map[string]string{
				"exactly.once.source.support": "enabled", "group.id": "b1_debezium-tuned",
				"config.storage.topic": "b1_debezium-tuned.connect-configs", "offset.storage.topic": "b1_debezium-tuned.connect-offsets",
				"status.storage.topic": "b1_debezium-tuned.connect-status", "config.storage.replication.factor": "1",
				"offset.storage.replication.factor": "1", "status.storage.replication.factor": "1",
			},
			absentWorker: []string{"offset.storage.file.filename"},
		},
		{
			name:  "the tuned setup batches, compresses and pipelines the producer and enlarges Debezium's queue",
			tuned: true,
			wantConnector: map[string]string{
				"producer.override.linger.ms": "10", "producer.override.batch.size": "262144",
				"producer.override.compression.type": "lz4", "producer.override.enable.idempotence": "true",
				"producer.override.max.in.flight.requests.per.connection": "5", "producer.override.acks": "all",
				"max.batch.size": "20480", "max.queue.size": "81920", "poll.interval.ms": "50",
				"transforms.outbox.route.topic.replacement": "b1.debezium-tuned.${routedByValue}",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := setup
			s.Tuned, s.ExactlyOnce = tt.tuned, tt.exactlyOnce
			worker, connector, err := s.properties()
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.wantWorker {
				if worker[k] != v {
					t.Errorf("worker %s = %q, want %q", k, worker[k], v)
				}
			}
			for _, k := range tt.absentWorker {
				if v, ok := worker[k]; ok {
					t.Errorf("worker sets %s = %q; it must not", k, v)
				}
			}
			for k, v := range tt.wantConnector {
				if connector[k] != v {
					t.Errorf("connector %s = %q, want %q", k, connector[k], v)
				}
			}
			for _, k := range tt.absent {
				if v, ok := connector[k]; ok {
					t.Errorf("connector sets %s = %q; the defaults row must not", k, v)
				}
			}
			if worker["connector.client.config.override.policy"] != "All" || worker["listeners"] != "http://127.0.0.1:18083" ||
				worker["value.converter"] != "org.apache.kafka.connect.storage.StringConverter" {
				t.Errorf("worker configuration: %v", worker)
			}
			props := renderProperties(connector)
			if !strings.Contains(props, "transforms.outbox.route.topic.replacement=b1.debezium-tuned.${routedByValue}\n") {
				t.Errorf("rendered properties lack the topic replacement:\n%s", props)
			}
		})
	}
}

func TestPercentilesUseNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(101-i)*time.Millisecond)
	}
	got := percentiles(d, 50, 95, 99, 100)
	want := []time.Duration{50 * time.Millisecond, 95 * time.Millisecond, 99 * time.Millisecond, 100 * time.Millisecond}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("p%d = %s, want %s", []int{50, 95, 99, 100}[i], got[i], want[i])
		}
	}
	if got := percentiles(nil, 99); got[0] != 0 {
		t.Errorf("p99 of nothing = %s, want 0", got[0])
	}
}

func TestParseSentReadsThePayloadAsPostgresPrintsIt(t *testing.T) {
	tests := []struct {
		name     string
		payload  string
		sent     int64
		warm, ok bool
	}{
		{"a measured event", `{"n": 7, "warm": false, "sent_ns": 1764489000123456789, "currency": "EUR"}`, 1764489000123456789, false, true},
		{"a warm-up event", `{"n": 0, "warm": true, "sent_ns": 42}`, 42, true, true},
		{"a payload without a send time", `{"n": 1}`, 0, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sent, warm, ok := parseSent([]byte(tt.payload))
			if sent != tt.sent || warm != tt.warm || ok != tt.ok {
				t.Errorf("parseSent = %d, %v, %v; want %d, %v, %v", sent, warm, ok, tt.sent, tt.warm, tt.ok)
			}
		})
	}
}

func TestSummaryMarksWhatWasNotMeasured(t *testing.T) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	rep := &Report{
		Drains: []Result{
			{Side: sideCeiling, Events: 1000, Wall: sec(1)},
			{Side: sideRelay, Events: 1000, Wall: sec(1.25)},
			{Side: sideDbzTuned, Err: errors.New("timeout")},
		},
		Steady: []SteadyResult{{Side: sideRelay, P99: 12400 * time.Microsecond, PeakRSS: 30 << 20}},
	}
	want := "bench: relay_vs_ceiling=0.80 relay_vs_debezium=n/a p99_ms=12 rss_mb=30 big_tx_rss_mb=n/a exactly_once_vs_relay=n/a exactly_once_p99_ms=n/a first_record_s=n/a msg_write_x=n/a msg_wal_x=n/a msg_relay_vs_ceiling=n/a standby_primary_cpu_x=n/a shards_drain_x=n/a shards_walsender_cpu_x=n/a"
	if got := rep.Summary(); got != want {
		t.Errorf("summary\n got %s\nwant %s", got, want)
	}
}

func TestSummaryReportsTheMessageMode(t *testing.T) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	rep := &Report{
		BacklogWrite: sec(10), BacklogWAL: 900,
		Messages: &MessagesResult{BacklogWrite: sec(4), BacklogWAL: 300, Drains: []Result{
			{Side: sideMsgCeiling, Events: 1000, Wall: sec(1)},
			{Side: sideMsgRelay, Events: 1000, Wall: sec(1.25)},
		}},
	}
	want := "msg_write_x=2.5 msg_wal_x=3.0 msg_relay_vs_ceiling=0.80 "
	if got := rep.Summary(); !strings.Contains(got, want) {
		t.Errorf("summary\n got %s\nwant it to hold %s", got, want)
	}
}

// Rounds compare each side with the sides of its own round; the summary gives the median of those
// ratios, not the ratio of medians, and a failed round leaves only its own ratios out.
func TestRoundsReportTheMedianOfEachRoundsRatio(t *testing.T) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	steady := func(side string, round int, p99ms, brokerSeconds float64) SteadyResult {
		return SteadyResult{Side: side, Round: round, Written: 1000, Rate: 10000, P99: time.Duration(p99ms * 1e6), BrokerCPU: sec(brokerSeconds), Window: sec(1)}
	}
	drain := func(side string, round int, wall, first float64) Result {
		return Result{Side: side, Round: round, Events: 1000, Wall: sec(wall), First: sec(first), OnKafka: sec(wall)}
	}
	rep := &Report{
		Config: Config{Rounds: 4},
		Drains: []Result{
			drain(sideCeiling, 0, 1, 0), drain(sideRelay, 0, 1.25, 0.3), drain(sideRelayEOS, 0, 2.5, 0.4), // 0.80, 0.50
			drain(sideCeiling, 1, 2, 0), drain(sideRelay, 1, 2, 0.1), drain(sideRelayEOS, 1, 2.5, 0.2), // 1.00, 0.80
			drain(sideCeiling, 2, 1, 0), drain(sideRelay, 2, 2, 0.2), drain(sideRelayEOS, 2, 2.5, 0.3), // 0.50, 0.80
			{Side: sideCeiling, Round: 3, Err: errors.New("pg_recvlogical failed")}, drain(sideRelay, 3, 1, 0.2), drain(sideRelayEOS, 3, 1.1, 0.2), // -, 0.91
		},
		Steady: []SteadyResult{
			steady(sideRelay, 0, 20, 1), steady(sideRelayEOS, 0, 35, 3), steady(sideDbzTuned, 0, 900, 1),
			steady(sideRelay, 1, 30, 2), steady(sideRelayEOS, 1, 45, 3), steady(sideDbzTuned, 1, 800, 1),
			steady(sideRelay, 2, 25, 1), steady(sideRelayEOS, 2, 38, 1.5), {Side: sideDbzTuned, Round: 2, Err: errors.New("connect")},
			steady(sideRelay, 3, 22, 1), steady(sideRelayEOS, 3, 33, 2),
		},
	}
	summary, table := rep.Summary(), rep.Table()
	for _, want := range []string{"relay_vs_ceiling=0.80 ", "exactly_once_vs_relay=0.80 ", "first_record_s=0.20 ", "p99_ms=22 ", "exactly_once_p99_ms=35 "} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary %q lacks %q", summary, want)
		}
	}
	for _, want := range []string{
		"| relay drain / ceiling (start-up included) | 0.80 (0.50-1.00) | 0.80, 1.00, 0.50 |",
		"| exactly-once drain / at-least-once | 0.80 (0.50-0.91) | 0.50, 0.80, 0.80, 0.91 |",
		"| outbox-relay (round 2) | 500 | 0.0 | 1.00 | 1.00 |",
		"| outbox-relay, exactly-once (round 4) | 909 | 0.0 | - | 0.91 |",
		"| steady: at-least-once broker CPU per event / tuned Debezium | 1.50 (1.00-2.00) | 1.00, 2.00 |",
		"| steady: exactly-once broker CPU per event / at-least-once | 1.75 (1.50-3.00) | 3.00, 1.50, 1.50, 2.00 |",
		"| steady: at-least-once p99, ms | 23.5 (20.0-30.0) | 20.0, 30.0, 25.0, 22.0 |",
		"| outbox-relay (round 3) | 1000 | 10000 |",
		"| exactly-once drain vs at-least-once | 0.80 (0.50-0.91) | >= 0.92 | no |",
		"| steady p99, at-least-once, ms | 23.5 (20.0-30.0) | <= 30.0 | yes |",
		"| time to the first record on Kafka when a backlog waits, s | 0.20 (0.10-0.30) | <= 0.10 | no |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// Each round drains on its own slot, into its own topics, logs to its own file and gives Debezium
// its own Connect directory: a later round that shared the first one's offsets file resumed from
// them and never streamed its slot. The first round keeps the names of a run without rounds.
func TestEachRoundHasItsOwnSlotTopicsLogAndConnectDirectory(t *testing.T) {
	b := &bench{run: "b1", work: "/w", cfg: Config{Rounds: 3}}
	type names struct{ slot, topics, log, connect string }
	at := func(round int) names {
		b.round = round
		return names{b.slot(sideDbzTuned), b.topicPrefix(sideDbzTuned), b.logPath(sideDbzTuned), b.connectDir(sideDbzTuned)}
	}
	if got, want := at(0), (names{"b1_debezium_tuned", "b1.debezium-tuned", "/w/debezium-tuned.log", "/w/debezium-tuned"}); got != want {
		t.Errorf("round 1: %+v, want %+v", got, want)
	}
	first, second, third := at(0), at(1), at(2)
	for _, pair := range [][2]names{{first, second}, {second, third}, {first, third}} {
		a, c := pair[0], pair[1]
		if a.slot == c.slot || a.topics == c.topics || a.log == c.log || a.connect == c.connect {
			t.Errorf("two rounds share a name: %+v and %+v", a, c)
		}
	}
	var ran []string
	if err := b.eachRound(context.Background(), []string{sideCeiling, sideDbzTuned}, interleaved, func(s string) {
		ran = append(ran, fmt.Sprintf("%s@%d", s, b.round))
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"ceiling@0", "debezium-tuned@0", "ceiling@1", "ceiling@2"}; !slices.Equal(ran, want) || b.round != 0 {
		t.Errorf("ran %v (round left at %d), want %v and round 0", ran, b.round, want)
	}
}

// poll-standby and relay-standby start a standby and need PostgreSQL 17+ and 16+, while the bench's
// cluster is by default the PATH's PostgreSQL: a run measures them only when they are named, on
// the version it is given.
func TestPollStandbyRunsOnlyWhenNamed(t *testing.T) {
	for _, key := range []string{"BENCH_SIDES", "BENCH_STEADY_SIDES", "BENCH_PG_VERSION", "BENCH_SWEEP", "BENCH_RELAY_ARGS"} {
		t.Setenv(key, "")
		os.Unsetenv(key)
	}
	tests := []struct {
		name              string
		args              []string
		wantSides         []string
		wantSteady        []string
		wantPGVersion     string
		wantConfigIsValid bool
	}{
		{
			name:       "the defaults leave it out",
			args:       nil,
			wantSides:  []string{sideCeiling, sideRelay, sideRelayEOS, sideRelayAvro, sideDbzDefault, sideDbzTuned, sideDbzEOS, sidePoll, sideRecover},
			wantSteady: []string{sideRelay, sideRelayEOS, sideDbzTuned, sideDbzEOS, sidePoll},
		},
		{
			name:              "named, it runs in the drain and the steady state on the PostgreSQL asked for",
			args:              []string{"--sides", "poll,poll-standby,relay-standby", "--steady-sides", "poll-standby", "--pg-version", "18", "--relay-bin", "/bin/true"},
			wantSides:         []string{sidePoll, sidePollStandby, sideRelayStandby},
			wantSteady:        []string{sidePollStandby},
			wantPGVersion:     "18",
			wantConfigIsValid: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, svc, err := parseFlags(tt.args, io.Discard)
			if tt.wantConfigIsValid && err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.Sides, tt.wantSides) || !slices.Equal(cfg.Steady, tt.wantSteady) || svc.PGVersion != tt.wantPGVersion {
				t.Errorf("sides %v, steady %v, PostgreSQL %q; want %v, %v, %q", cfg.Sides, cfg.Steady, svc.PGVersion, tt.wantSides, tt.wantSteady, tt.wantPGVersion)
			}
		})
	}
}
