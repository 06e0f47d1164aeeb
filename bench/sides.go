package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/dbz"
	"github.com/outbox-relay/outbox-relay/internal/devenv"
)

// Result is one side's drain of a backlog.
type Result struct {
	Side      string
	Events    int64
	Bytes     int64         // payload bytes drained
	Wall      time.Duration // process start until done (see the table's notes)
	First     time.Duration // process start until the first record was on Kafka (0: not applicable)
	OnKafka   time.Duration // process start until every record was on Kafka (0: not applicable)
	CPU       time.Duration // user+sys of the side's process
	CPUFirst  time.Duration // user+sys when the first record was on Kafka (start-up and warm-up)
	PeakRSS   int64         // bytes
	SenderCPU time.Duration // user+sys of the walsender(s) that served the side
	BrokerCPU time.Duration // user+sys of the Kafka broker meanwhile
	// PrimaryCPU is user+sys of the bench cluster's processes meanwhile (postmaster, walsenders,
	// backends, background processes; clusterCPU); StandbyCPU the decoding standby's, for
	// relay-standby. On the primary side the primary's figure includes the bench's own polls of
	// the slot (one query every 25 ms); relay-standby's go to the standby.
	PrimaryCPU time.Duration
	StandbyCPU time.Duration
	// Partial is set when the side ran out of time: Events is what it had published by then, so
	// its rate is what it achieved, start-up included.
	Partial bool
	Target  int64 // events it had to publish
	Round   int   // the drain round (Config.Rounds), from 0
	Err     error
}

func (r Result) rate() float64 {
	if r.Err != nil || r.Wall <= 0 {
		return 0
	}
	return float64(r.Events) / r.Wall.Seconds()
}

// streamRate excludes start-up: events per second from the first record to the last.
func (r Result) streamRate() float64 {
	end := r.OnKafka
	if r.Err != nil || r.First <= 0 || end <= r.First {
		return 0
	}
	return float64(r.Events) / (end - r.First).Seconds()
}

// cpuPerEventAfterFirst is CPU per event from the first record on, leaving out start-up (for the
// JVM: class loading and most of the JIT compilation).
func (r Result) cpuPerEventAfterFirst() time.Duration {
	if r.CPUFirst <= 0 || r.Events == 0 {
		return 0
	}
	return (r.CPU - r.CPUFirst) / time.Duration(r.Events)
}

func (r Result) line() string {
	if r.Err != nil {
		return fmt.Sprintf("%s: FAILED: %v", r.Side, r.Err)
	}
	partial := ""
	if r.Partial {
		partial = fmt.Sprintf(" (stopped: only %d of %d in time)", r.Events, r.Target)
	}
	return fmt.Sprintf("%s: %d events%s in %s (%.0f events/s), CPU %s, peak RSS %.0f MB, walsender CPU %s",
		r.Side, r.Events, partial, r.Wall.Round(time.Millisecond), r.rate(), r.CPU.Round(10*time.Millisecond),
		mb(r.PeakRSS), r.SenderCPU.Round(10*time.Millisecond))
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// drain runs one side over the backlog and stops it.
func (b *bench) drain(ctx context.Context, side string) Result {
	return b.drainWith(ctx, side, func() Result {
		switch side {
		case sideCeiling:
			return b.drainCeiling(ctx)
		case sideRelay, sideRelayEOS:
			return b.drainProc(ctx, side, func() (*child, error) {
				return b.startRelay(side, b.slot(side), b.topicPrefix(side), b.deliveryArgs(side, b.slot(side))...)
			}, b.endLSN)
		case sideRelayStandby:
			if err := b.decoding.waitReplayed(ctx, b.endLSN); err != nil {
				return Result{Err: err}
			}
			return b.drainProc(ctx, side, func() (*child, error) {
				return b.startRelayOn(relayTarget{dsn: b.decoding.dsn, primaryDSN: b.svc.DSN, pub: b.pub}, side, b.slot(side), b.topicPrefix(side))
			}, b.endLSN)
		case sideRelayAvro:
			return b.drainProc(ctx, side, func() (*child, error) {
				args, err := b.avroArgs()
				if err != nil {
					return nil, err
				}
				return b.startRelay(side, b.slot(side), b.topicPrefix(side), args...)
			}, b.endLSN)
		case sideRecover:
			// The gap is the whole backlog (created after the recorded commit time, less a margin
			// of 1s); all on Kafka is the end: the new slot has nothing to confirm before it.
			return b.drainProc(ctx, side, func() (*child, error) {
				return b.startRelay(side, b.slot(side), b.topicPrefix(side), "--on-slot-lost=recover", "--slot-recovery-margin=1s")
			}, 0)
		case sidePoll, sidePollStandby:
			stopStandby := func() error { return nil }
			r := b.drainProc(ctx, side, func() (*child, error) {
				if err := b.pollReady(ctx, false); err != nil {
					return nil, err
				}
				stop, err := b.standbyFor(ctx, side)
				if err != nil {
					return nil, err
				}
				stopStandby = stop
				return b.startRelay(side, "", b.topicPrefix(side), "--source=poll")
			}, 0)
			if err := errors.Join(stopStandby(), b.pollTrigger(ctx, false)); err != nil && r.Err == nil {
				r.Err = err
			}
			return r
		}
		return b.drainProc(ctx, side, func() (*child, error) {
			return b.startDebezium(ctx, side, side, b.slot(side), b.topicPrefix(side))
		}, 0)
	})
}

// drainWith runs one side's drain of a backlog of Events events on topics created for it, fills in
// what every side's result carries (the broker's CPU meanwhile, the events and bytes) and drops
// the side's slot and topics.
func (b *bench) drainWith(ctx context.Context, side string, run func() Result) Result {
	b.logf("draining the backlog with %s", side)
	if hasTopics(side) {
		if err := b.createTopics(ctx, side); err != nil {
			return Result{Side: side, Target: int64(b.cfg.Events), Err: err}
		}
	}
	broker0, primary0, standby0 := b.brokerCPU(), b.primaryCPU(), b.standbyCPU(side)
	r := run()
	r.BrokerCPU = b.brokerCPU() - broker0
	r.PrimaryCPU, r.StandbyCPU = b.primaryCPU()-primary0, b.standbyCPU(side)-standby0
	if hasTopics(side) {
		if err := errors.Join(b.dropTopics(ctx, side), b.dropConnectTopics(ctx, side, side)); err != nil && r.Err == nil {
			r.Err = err
		}
	}
	r.Side, r.Target = side, int64(b.cfg.Events)
	if !r.Partial {
		r.Events = r.Target
	}
	r.Bytes = int64(float64(b.payload) * float64(r.Events) / float64(r.Target))
	if err := dropSlot(ctx, b.slotPool(side), b.slot(side)); err != nil && r.Err == nil {
		r.Err = err
	}
	return r
}

// primaryCPU is the bench cluster's CPU so far (0 when it cannot be read).
func (b *bench) primaryCPU() time.Duration {
	cpu, _ := clusterCPU(b.postmaster)
	return cpu
}

// standbyCPU is the decoding standby's CPU so far for side relay-standby, 0 for the others.
func (b *bench) standbyCPU(side string) time.Duration {
	if side != sideRelayStandby || b.decoding == nil {
		return 0
	}
	cpu, _ := clusterCPU(b.decoding.postmaster)
	return cpu
}

// hasTopics says whether a drain side publishes (pg_recvlogical writes to /dev/null).
func hasTopics(side string) bool { return side != sideCeiling && side != sideMsgCeiling }

// drainCeiling runs pg_recvlogical over the slot to the backlog's end, output to /dev/null: how
// fast PostgreSQL decodes and sends this WAL with nothing else to do.
func (b *bench) drainCeiling(ctx context.Context) Result {
	return b.recvlogical(ctx, sideCeiling, b.endLSN)
}

// recvlogical runs pg_recvlogical on side's slot up to endLSN, with extra pgoutput options.
func (b *bench) recvlogical(ctx context.Context, side string, endLSN uint64, options ...string) Result {
	bin, err := pgRecvLogical()
	if err != nil {
		return Result{Err: err}
	}
	args := []string{"--dbname", b.svc.DSN, "--slot", b.slot(side), "--start", "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=" + b.pub,
		"--endpos", pglogrepl.LSN(endLSN).String(), "--file", "/dev/null"}
	for _, o := range options {
		args = append(args, "-o", o)
	}
	c, err := startChild("pg_recvlogical", b.logPath(side), nil, bin, args...)
	if err != nil {
		return Result{Err: err}
	}
	defer c.stop(5 * time.Second)
	senders := newSenderCPU()
	timeout := time.After(b.drainTimeout())
	for !c.exited() {
		b.sampleSender(ctx, senders, side)
		select {
		case <-c.done:
		case <-time.After(50 * time.Millisecond):
		case <-timeout:
			return Result{Err: fmt.Errorf("pg_recvlogical did not reach %s within %s", pglogrepl.LSN(endLSN), b.drainTimeout())}
		case <-ctx.Done():
			return Result{Err: ctx.Err()}
		}
	}
	wall := time.Since(c.started)
	if c.err != nil {
		return Result{Err: c.failure()}
	}
	cpu, rss, err := c.usage()
	return Result{Wall: wall, CPU: cpu, PeakRSS: rss, SenderCPU: senders.total(), Err: err}
}

// drainProc starts a side and waits until every event is on its topics and, when endLSN is set,
// the slot's confirmed position has passed endLSN.
func (b *bench) drainProc(ctx context.Context, side string, start func() (*child, error), endLSN uint64) Result {
	c, err := start()
	if err != nil {
		return Result{Err: err}
	}
	defer c.stop(30 * time.Second)
	return b.waitDrained(ctx, c, side, b.topics(side), int64(b.cfg.Events), endLSN)
}

// waitDrained polls the topics' end offsets (and the slot) until the side is done, sampling the
// walsender's CPU on the way, and reads the side's CPU and peak RSS at that moment. A side that
// runs out of time gets a partial result: what it published until then.
func (b *bench) waitDrained(ctx context.Context, c runner, side string, topics []string, events int64, endLSN uint64) Result {
	senders := newSenderCPU()
	deadline := time.Now().Add(b.drainTimeout())
	count := func() (int64, error) { return b.onKafka(ctx, topics) }
	if transactional(side) {
		// End offsets count each transaction's commit markers too, which would end the drain
		// before its last records: count what read_committed consumers get instead.
		committed := newLatencyReader(b.svc.Kafka.Brokers(), topics, b.cfg.Partitions)
		defer committed.close()
		count = func() (int64, error) { return committed.total(), nil }
	}
	var r Result
	for {
		n, err := count()
		if err != nil {
			n = 0
		}
		now := time.Since(c.startedAt())
		if n > 0 && r.First == 0 {
			r.First = now
			r.CPUFirst, _, _ = c.usage()
		}
		if n >= events && r.OnKafka == 0 {
			r.OnKafka = now
		}
		var confirmed uint64
		if r.First > 0 {
			// The walsender's CPU is cumulative: samples from the first record on miss none of
			// it, and until then the polls stay light (one ListOffsets request).
			confirmed, _ = b.sampleSender(ctx, senders, side)
		}
		if r.OnKafka > 0 && confirmed >= endLSN {
			r.Wall = now
			break
		}
		if c.exited() {
			r.Err = c.failure()
			return r
		}
		if time.Now().After(deadline) {
			if n == 0 {
				r.Err = fmt.Errorf("nothing on Kafka after %s; %s", b.drainTimeout(), c.logTail())
				return r
			}
			if n >= events {
				r.Err = fmt.Errorf("every event on Kafka but the slot confirmed only %s of %s after %s",
					pglogrepl.LSN(confirmed), pglogrepl.LSN(endLSN), b.drainTimeout())
				return r
			}
			r.Partial, r.Events, r.Wall, r.OnKafka = true, n, now, now
			break
		}
		// Until the first record, poll every 5 ms: the time to it is a few tenths of a second,
		// and 25 ms polls overstated it by 12 ms on average.
		poll := 25 * time.Millisecond
		if r.First == 0 {
			poll = 5 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			r.Err = ctx.Err()
			return r
		case <-time.After(poll):
		}
	}
	r.CPU, r.PeakRSS, r.Err = c.usage()
	r.SenderCPU = senders.total()
	return r
}

// onKafka sums the end offsets of every partition of the topics: the records Kafka has
// acknowledged (every side writes with acks=all to a broker of one).
func (b *bench) onKafka(ctx context.Context, topics []string) (int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, t := range topics {
		for p := range b.cfg.Partitions {
			req.Topics[t] = append(req.Topics[t], kafka.LastOffsetOf(p))
		}
	}
	resp, err := b.kafka.ListOffsets(ctx, req)
	if err != nil {
		return 0, err
	}
	var sum int64
	for t, parts := range resp.Topics {
		for _, p := range parts {
			if p.Error != nil {
				return 0, fmt.Errorf("end offset of %s/%d: %w", t, p.Partition, p.Error)
			}
			sum += p.LastOffset
		}
	}
	return sum, nil
}

// brokerCPU is the Kafka broker's CPU time so far (0 when it cannot be read).
func (b *bench) brokerCPU() time.Duration {
	pid, err := os.ReadFile(filepath.Join(b.svc.Kafka.Dir(), "kafka.pid"))
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(pid)))
	if err != nil {
		return 0
	}
	cpu, _ := procCPU(n)
	return cpu
}

// senderCPU remembers the CPU time of every walsender that served a slot (a side may reconnect).
type senderCPU map[int]time.Duration

func newSenderCPU() senderCPU { return senderCPU{} }

func (s senderCPU) total() time.Duration {
	var t time.Duration
	for _, v := range s {
		t += v
	}
	return t
}

// sampleSender reads the slot's confirmed position and its walsender's CPU.
func (b *bench) sampleSender(ctx context.Context, s senderCPU, side string) (confirmed uint64, err error) {
	confirmed, pid, err := slotState(ctx, b.slotPool(side), b.slot(side))
	if err != nil || pid == 0 {
		return confirmed, err
	}
	if cpu, err := procCPU(pid); err == nil {
		s[pid] = cpu
	}
	return confirmed, nil
}

// deliveryArgs are the relay's flags for side's delivery mode: exactly-once gets a transactional
// id and a positions topic of its own, so no run fences or reads another's.
func (b *bench) deliveryArgs(side, slot string) []string {
	if side != sideRelayEOS {
		return nil
	}
	return []string{"--delivery=exactly-once", "--transactional-id=" + slot, "--positions-topic=" + b.run + ".positions"}
}

// startRelay runs the relay binary with its defaults, on slot (none for source poll) and the topics
// under prefix; extra flags go before the configured ones.
func (b *bench) startRelay(name, slot, prefix string, extra ...string) (*child, error) {
	return b.startRelayOn(relayTarget{dsn: b.svc.DSN, pub: b.pub}, name, slot, prefix, extra...)
}

// relayTarget is where a relay reads: pg_dsn, primary_dsn (decoding on a standby), its
// publication and its outbox table (empty: the relay's default, the bench's table).
type relayTarget struct {
	dsn, primaryDSN, pub, table string
}

// startRelayOn is startRelay reading from t.
func (b *bench) startRelayOn(t relayTarget, name, slot, prefix string, extra ...string) (*child, error) {
	args := []string{"run", "--topic-template", prefix + ".{aggregate_type}", "--log-level", "warn"}
	if slot != "" {
		args = append(args, "--slot", slot, "--publication", t.pub, "--create-slot=false", "--create-publication=false")
	}
	if t.table != "" {
		args = append(args, "--table", t.table)
	}
	args = append(append(args, extra...), b.cfg.RelayArgs...)
	env := []string{
		"OUTBOX_PG_DSN=" + t.dsn,
		"OUTBOX_KAFKA_BROKERS=" + b.svc.Kafka.Brokers(),
		"OUTBOX_KAFKA_AUTO_CREATE_TOPICS=true", // the benchmark's topics are created as they are used
	}
	if t.primaryDSN != "" {
		env = append(env, "OUTBOX_PRIMARY_DSN="+t.primaryDSN)
	}
	return startChild("outbox-relay", b.logPath(name), env, b.cfg.RelayBin, args...)
}

// connectDir holds a Debezium side's Connect configuration and offsets file, one per round: a
// round that found the one before's offsets resumed from them and never streamed its own slot.
func (b *bench) connectDir(name string) string { return filepath.Join(b.work, name+b.roundSuffix("-")) }

// connectName is the connector's name and topic.prefix of the Connect worker configured in dir
// (its internal topics, when it is distributed, are named after it).
func connectName(run, dir string) string { return run + "_" + filepath.Base(dir) }

// transactional says whether side writes in Kafka transactions and is done by no slot position of
// its own (the relay's exactly-once is: it confirms only what committed).
func transactional(side string) bool { return side == sideDbzEOS }

// startDebezium writes a Connect worker and connector configuration and starts the worker for
// side (debezium-default: Debezium's defaults; the others tuned) as name.
func (b *bench) startDebezium(ctx context.Context, side, name, slot, prefix string) (*child, error) {
	tuned := side != sideDbzDefault
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := b.connectDir(name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	setup := debeziumSetup{
		Tuned: tuned, ExactlyOnce: side == sideDbzEOS, DSN: b.svc.DSN, Brokers: b.svc.Kafka.Brokers(), Slot: slot, Publication: b.pub,
		TopicPrefix: prefix, Name: connectName(b.run, dir), OffsetsFile: filepath.Join(dir, "offsets"), RESTPort: port,
	}
	worker, connector, err := setup.properties()
	if err != nil {
		return nil, err
	}
	workerFile, connectorFile := filepath.Join(dir, "worker.properties"), filepath.Join(dir, "connector.properties")
	if err := os.WriteFile(workerFile, []byte(renderProperties(worker)), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(connectorFile, []byte(renderProperties(connector)), 0o600); err != nil {
		return nil, err
	}
	if !setup.ExactlyOnce {
		args := append(connectJVM(b.cfg.DebeziumLib, false), workerFile, connectorFile)
		return startChild("kafka-connect", filepath.Join(dir, "connect.log"), nil, "java", args...)
	}
	// A distributed worker takes its connectors through its REST API.
	c, err := startChild("kafka-connect", filepath.Join(dir, "connect.log"), nil, "java", append(connectJVM(b.cfg.DebeziumLib, true), workerFile)...)
	if err != nil {
		return nil, err
	}
	if err := b.createExactlyOnceConnector(ctx, c, fmt.Sprintf("http://127.0.0.1:%d", port), setup.Name, connector); err != nil {
		c.stop(10 * time.Second)
		return nil, err
	}
	return c, nil
}

// createExactlyOnceConnector creates the connector on the distributed worker and waits for its
// task to run. When Connect refuses exactly.once.support=required, its message goes in the
// report's notes and the connector is created with exactlyOnceFallback instead.
func (b *bench) createExactlyOnceConnector(ctx context.Context, c *child, url, name string, connector map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute) // a JVM start and a group join, on a loaded machine
	defer cancel()
	w := dbz.Worker{URL: url}
	if err := w.WaitReady(ctx, func() bool { return !c.exited() }); err != nil {
		return fmt.Errorf("%w; %s", err, c.logTail())
	}
	err := w.CreateConnector(ctx, name, connector)
	if refused, ok := errors.AsType[*dbz.RefusedError](err); ok && strings.Contains(refused.Message, "exactly.once") {
		b.note(fmt.Sprintf("Kafka Connect refused Debezium's connector with exactly.once.support=required (%q); %s ran with exactly.once.support=%s, the closest configuration it accepts (the worker's exactly.once.source.support stays enabled).",
			refused.Message, label(sideDbzEOS), exactlyOnceFallback))
		connector["exactly.once.support"] = exactlyOnceFallback
		err = w.CreateConnector(ctx, name, connector)
	}
	if err != nil {
		return err
	}
	for {
		state, trace, err := w.TaskState(ctx, name)
		switch {
		case err != nil:
			return err
		case state == "RUNNING":
			return nil
		case state == "FAILED":
			line, _, _ := strings.Cut(trace, "\n")
			return fmt.Errorf("Debezium's exactly-once task failed: %s", line)
		case c.exited():
			return c.failure()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("Debezium's exactly-once task did not start: %w; %s", ctx.Err(), c.logTail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// note records, once, something the report must say about how a side ran.
func (b *bench) note(s string) {
	if !slices.Contains(b.notes, s) {
		b.notes = append(b.notes, s)
		b.logf("note: %s", s)
	}
}

func freePort() (int, error) {
	ports, err := devenv.FreePorts(1)
	if err != nil {
		return 0, fmt.Errorf("reserve a port: %w", err)
	}
	return ports[0], nil
}

// SteadyResult is one side under a constant write rate.
type SteadyResult struct {
	Side          string
	Rate          float64 // achieved by the writer, events/s
	Written       int
	Received      int
	P50, P95, P99 time.Duration
	Max           time.Duration
	CPU           time.Duration // during the measured window
	BrokerCPU     time.Duration // the Kafka broker's, during the measured window
	Window        time.Duration
	PeakRSS       int64 // over the side's whole life (start-up, warm-up, window)
	Round         int   // the round (Config.Rounds), from 0
	// Point is the sweep's setting the relay ran with (Config.Sweep); nil for a side that is not
	// swept, or a run without a sweep.
	Point *sweepPoint
	// Curve is the latency at each percentile of latencyCurve (the latency chart).
	Curve []time.Duration
	Err   error
}

func (r SteadyResult) brokerPerEvent() float64 {
	return r.BrokerCPU.Seconds() / float64(max(r.Written, 1))
}

func (r SteadyResult) line() string {
	side := r.Side
	if r.Point != nil {
		side += " at " + r.Point.name()
	}
	if r.Err != nil {
		return fmt.Sprintf("steady %s: FAILED: %v", side, r.Err)
	}
	return fmt.Sprintf("steady %s: %d events at %.0f/s, p50 %s p95 %s p99 %s max %s, CPU %s, peak RSS %.0f MB",
		side, r.Written, r.Rate, ms(r.P50), ms(r.P95), ms(r.P99), ms(r.Max), r.CPU.Round(10*time.Millisecond), mb(r.PeakRSS))
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) + "ms" }

// steady measures a side under a constant write rate; a relay side at point's setting when
// point is set (a sweep).
func (b *bench) steady(ctx context.Context, side string, point *sweepPoint) SteadyResult {
	name := "steady-" + side
	var sweepArgs []string
	if point != nil {
		name += "-" + point.name()
		sweepArgs = b.defaults.args(side, *point)
	}
	if isPoll(side) {
		if err := b.pollReady(ctx, true); err != nil {
			return SteadyResult{Side: side, Err: err}
		}
		defer b.pollTrigger(ctx, false)
		stopStandby, err := b.standbyFor(ctx, side)
		if err != nil {
			return SteadyResult{Side: side, Err: err}
		}
		r := b.steadyWith(ctx, side, name, func(string) (runner, error) {
			return b.startRelay(name, "", b.topicPrefix(name), "--source=poll")
		})
		if err := stopStandby(); err != nil && r.Err == nil {
			r.Err = err
		}
		return r
	}
	r := b.steadyWith(ctx, side, name, func(slot string) (runner, error) {
		if isRelay(side) {
			return b.startRelay(name, slot, b.topicPrefix(name), append(b.deliveryArgs(side, slot), sweepArgs...)...)
		}
		return b.startDebezium(ctx, side, name, slot, b.topicPrefix(name))
	})
	r.Point = point
	return r
}

// steadyWith starts a side on a fresh slot (so it has no backlog), warms it up, writes at the
// configured rate and measures commit-to-consumer latency.
func (b *bench) steadyWith(ctx context.Context, side, name string, start func(slot string) (runner, error)) (res SteadyResult) {
	res = SteadyResult{Side: side}
	slot := b.slot(name)
	if !isPoll(side) {
		if err := createSlot(ctx, b.pool, slot); err != nil {
			res.Err = err
			return res
		}
		defer func() {
			if err := dropSlot(ctx, b.pool, slot); err != nil && res.Err == nil {
				res.Err = err
			}
		}()
	}
	if err := b.createTopics(ctx, name); err != nil {
		res.Err = err
		return res
	}
	// Deferred first, so it runs last: after the side has stopped and the reader has closed.
	defer func() {
		if err := errors.Join(b.dropTopics(ctx, name), b.dropConnectTopics(ctx, side, name)); err != nil && res.Err == nil {
			res.Err = err
		}
	}()
	b.logf("steady state with %s: %d events/s for %s", strings.TrimPrefix(name, "steady-"), b.cfg.Rate, b.cfg.SteadyFor)
	c, err := start(slot)
	if err != nil {
		res.Err = err
		return res
	}
	defer c.stop(30 * time.Second)
	if !isPoll(side) { // a poller is ready when the warm-up below arrives
		if err := waitSlotActive(ctx, b.pool, slot, c, 2*time.Minute); err != nil {
			res.Err = err
			return res
		}
	}
	lat := newLatencyReader(b.svc.Kafka.Brokers(), b.topics(name), b.cfg.Partitions)
	defer lat.close()

	// Warm-up: the first records pay for connections, metadata and (for the JVM) class loading.
	const warmTx, warmPerTx = 20, 10
	if err := writeWarmup(ctx, b.pool, warmTx, warmPerTx); err != nil {
		res.Err = err
		return res
	}
	if !lat.waitFor(ctx, time.Minute, func(warm, _ int) bool { return warm >= warmTx*warmPerTx }) {
		w, _, bad := lat.counts()
		res.Err = fmt.Errorf("warm-up: %d of %d records arrived within a minute (%d unparsable); %s",
			w, warmTx*warmPerTx, bad, c.logTail())
		return res
	}

	cpu0, _, err := c.usage()
	if err != nil {
		res.Err = err
		return res
	}
	start0, broker0 := time.Now(), b.brokerCPU()
	res.Written, res.Rate, err = steadyWriter{pool: b.pool, rate: b.cfg.Rate, duration: b.cfg.SteadyFor}.run(ctx)
	if err != nil {
		res.Err = err
		return res
	}
	if !lat.waitFor(ctx, 30*time.Second, func(_, measured int) bool { return measured >= res.Written }) {
		_, got, _ := lat.counts()
		res.Err = fmt.Errorf("%d of %d records arrived within 30s of the writer's end", got, res.Written)
	}
	cpu1, rss, uerr := c.usage()
	res.BrokerCPU = b.brokerCPU() - broker0
	res.Window = time.Since(start0)
	res.CPU, res.PeakRSS = cpu1-cpu0, rss
	if res.Err == nil {
		res.Err = uerr
	}
	_, res.Received, _ = lat.counts()
	p := lat.percentiles(append([]float64{50, 95, 99, 100}, latencyCurve...)...)
	res.P50, res.P95, res.P99, res.Max = p[0], p[1], p[2], p[3]
	res.Curve = p[4:]
	return res
}

// bigTx writes one transaction of BigTx events and measures the relay draining it.
func (b *bench) bigTx(ctx context.Context) (res Result) {
	name := "bigtx"
	res = Result{Side: "relay, one transaction", Events: int64(b.cfg.BigTx)}
	slot := b.slot(name)
	if err := createSlot(ctx, b.pool, slot); err != nil {
		res.Err = err
		return res
	}
	defer func() {
		if err := dropSlot(ctx, b.pool, slot); err != nil && res.Err == nil {
			res.Err = err
		}
	}()
	if err := b.createTopics(ctx, name); err != nil {
		res.Err = err
		return res
	}
	defer func() {
		if err := b.dropTopics(ctx, name); err != nil && res.Err == nil {
			res.Err = err
		}
	}()
	b.logf("writing one transaction of %d events", b.cfg.BigTx)
	if err := writeOneTx(ctx, b.pool, b.cfg.BigTx); err != nil {
		res.Err = err
		return res
	}
	end, err := currentLSN(ctx, b.pool)
	if err != nil {
		res.Err = err
		return res
	}
	// Same payload generator as the backlog: its average size holds (only used for MB/s).
	res.Bytes = int64(float64(b.payload) / float64(b.cfg.Events) * float64(b.cfg.BigTx))
	b.logf("draining it with the relay")
	c, err := b.startRelay(name, slot, b.topicPrefix(name))
	if err != nil {
		res.Err = err
		return res
	}
	defer c.stop(30 * time.Second)
	broker0 := b.brokerCPU()
	r := b.waitDrained(ctx, c, name, b.topics(name), int64(b.cfg.BigTx), end)
	r.BrokerCPU = b.brokerCPU() - broker0
	r.Side, r.Events, r.Bytes = res.Side, res.Events, res.Bytes
	return r
}
