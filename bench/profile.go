package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	rtmetrics "runtime/metrics"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// Profile is what the in-process relay measured besides its pprof files: once draining the
// backlog, once under the steady-state rate.
type Profile struct {
	Dir      string
	Drain    ProfileRun
	Messages *ProfileRun // the table-free outbox's drain (messages-*.pprof), when messages are measured
	Steady   *ProfileRun
	Err      error
}

// ProfileRun is one profiled phase. Allocation counts cover the whole process, so the harness's
// own polling (and, in steady state, its consumer) is included: a few percent at most.
type ProfileRun struct {
	Events         int64
	Wall           time.Duration
	AllocsPerEvent float64 // heap allocations per event
	BytesPerEvent  float64 // heap bytes allocated per event
	GCs            uint32
	PeakHeap       uint64 // live heap objects, sampled every 50ms
	PeakMapped     uint64 // all memory the Go runtime mapped (heap, stacks, metadata)
	P99            time.Duration
}

func (p ProfileRun) line() string {
	s := fmt.Sprintf("%d events in %s (%.0f events/s), %.1f allocs and %.0f bytes allocated per event, %d GCs, peak live heap %.0f MB, peak Go-mapped memory %.0f MB",
		p.Events, p.Wall.Round(time.Millisecond), float64(p.Events)/p.Wall.Seconds(), p.AllocsPerEvent, p.BytesPerEvent,
		p.GCs, mb(int64(p.PeakHeap)), mb(int64(p.PeakMapped)))
	if p.P99 > 0 {
		s += fmt.Sprintf(", p99 %s", ms(p.P99))
	}
	return s
}

func (p Profile) line() string {
	s := "drain: " + p.Drain.line()
	if p.Messages != nil {
		s += "; table-free drain: " + p.Messages.line()
	}
	if p.Steady != nil {
		s += "; steady state: " + p.Steady.line()
	}
	return s + "; profiles in " + p.Dir
}

// profileRelay runs the relay in this process with the binary's default settings, over its own
// slot of the backlog (steady false: drain-*.pprof) or under the steady-state rate (steady true:
// steady-*.pprof), with cpu, allocs, mutex and block profiles. Results go to b.profile.
func (b *bench) profileRelay(ctx context.Context, steady bool) (*Profile, error) {
	if err := os.MkdirAll(b.cfg.ProfileDir, 0o755); err != nil {
		return nil, err
	}
	if b.profile == nil {
		b.profile = &Profile{Dir: b.cfg.ProfileDir}
	}
	p := b.profile
	if !steady {
		b.logf("draining the backlog with an in-process relay under pprof")
		err := b.profiled("drain", int64(b.cfg.Events), &p.Drain, func() error {
			defer func() { _ = errors.Join(dropSlot(ctx, b.pool, b.slot("profile")), b.dropTopics(ctx, "profile")) }()
			r, err := startInProcess(b.relayConfig(b.slot("profile"), b.topicPrefix("profile")))
			if err != nil {
				return err
			}
			defer r.stop(time.Minute)
			res := b.waitDrained(ctx, r, "profile", b.topics("profile"), int64(b.cfg.Events), b.endLSN)
			p.Drain.Wall = res.Wall
			if res.Partial {
				return fmt.Errorf("in-process relay published only %d of %d events in %s", res.Events, b.cfg.Events, b.drainTimeout())
			}
			return res.Err
		})
		if err != nil {
			return p, fmt.Errorf("profiled drain: %w", err)
		}
		return p, nil
	}
	p.Steady = &ProfileRun{}
	err := b.profiled("steady", 0, p.Steady, func() error {
		res := b.steadyWith(ctx, "profile", "steady-profile", func(slot string) (runner, error) {
			return startInProcess(b.relayConfig(slot, b.topicPrefix("steady-profile")))
		})
		p.Steady.Events, p.Steady.Wall, p.Steady.P99 = int64(res.Written), res.Window, res.P99
		return res.Err
	})
	if err != nil {
		return p, fmt.Errorf("profiled steady state: %w", err)
	}
	return p, nil
}

// profileMessages drains the message backlog (up to end) with an in-process relay in the
// table-free mode, over slot, created before the backlog: messages-*.pprof.
func (b *bench) profileMessages(ctx context.Context, slot string, end uint64) error {
	if err := os.MkdirAll(b.cfg.ProfileDir, 0o755); err != nil {
		return err
	}
	if b.profile == nil {
		b.profile = &Profile{Dir: b.cfg.ProfileDir}
	}
	b.profile.Messages = &ProfileRun{}
	b.logf("draining the message backlog with an in-process relay under pprof")
	err := b.profiled("messages", int64(b.cfg.Events), b.profile.Messages, func() error {
		cfg := b.relayConfig(slot, b.topicPrefix(sideMsgProfile))
		cfg.Decoder.MessagePrefix, cfg.Decoder.NoTable = b.prefix, true
		r, err := startInProcess(cfg)
		if err != nil {
			return err
		}
		defer r.stop(time.Minute)
		res := b.waitDrained(ctx, r, sideMsgProfile, b.topics(sideMsgProfile), int64(b.cfg.Events), end)
		b.profile.Messages.Wall = res.Wall
		if res.Partial {
			return fmt.Errorf("in-process relay published only %d of %d messages in %s", res.Events, b.cfg.Events, b.drainTimeout())
		}
		return res.Err
	})
	if err != nil {
		return fmt.Errorf("profiled table-free drain: %w", err)
	}
	return nil
}

// profiled runs phase with CPU, mutex and block profiling on and records allocations and memory.
// events is the phase's event count when known up front; phase may set it otherwise.
func (b *bench) profiled(name string, events int64, out *ProfileRun, phase func() error) error {
	cpuFile, err := os.Create(filepath.Join(b.cfg.ProfileDir, name+"-cpu.pprof"))
	if err != nil {
		return err
	}
	defer cpuFile.Close()
	runtime.SetMutexProfileFraction(10)
	runtime.SetBlockProfileRate(int(10 * time.Microsecond))
	defer runtime.SetMutexProfileFraction(0)
	defer runtime.SetBlockProfileRate(0)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := pprof.StartCPUProfile(cpuFile); err != nil {
		return err
	}
	stopSampling := sampleMemory(&out.PeakHeap, &out.PeakMapped)
	out.Events = events
	err = phase()
	stopSampling()
	pprof.StopCPUProfile()
	runtime.ReadMemStats(&after)
	if out.Events > 0 {
		out.AllocsPerEvent = float64(after.Mallocs-before.Mallocs) / float64(out.Events)
		out.BytesPerEvent = float64(after.TotalAlloc-before.TotalAlloc) / float64(out.Events)
	}
	out.GCs = after.NumGC - before.NumGC
	for _, prof := range []string{"allocs", "mutex", "block"} {
		err = errors.Join(err, writeProfile(filepath.Join(b.cfg.ProfileDir, name+"-"+prof+".pprof"), prof))
	}
	return err
}

// sampleMemory records the peak live heap and the peak memory the runtime mapped, from
// runtime/metrics (no stop-the-world), until the returned function is called.
func sampleMemory(peakHeap, peakMapped *uint64) (stop func()) {
	samples := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/total:bytes"}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			rtmetrics.Read(samples)
			*peakHeap = max(*peakHeap, samples[0].Value.Uint64())
			*peakMapped = max(*peakMapped, samples[1].Value.Uint64())
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func writeProfile(path, name string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup(name).WriteTo(f, 0), f.Close())
}

// relayConfig is what cmd/outbox-relay builds from its defaults, for slot and the topics under
// prefix.
func (b *bench) relayConfig(slot, prefix string) relay.Config {
	cols := decoder.DefaultColumns()
	return relay.Config{
		Replication: replication.Config{
			DSN: b.svc.DSN, Slot: slot, Publication: b.pub, Table: "outbox_events",
			Columns: []string{cols.ID, cols.AggregateType, cols.AggregateID, cols.EventType, cols.Payload, cols.Headers},
		},
		Decoder: decoder.Config{Table: "outbox_events", Columns: cols},
		Sink:    sink.Config{Brokers: []string{b.svc.Kafka.Brokers()}, Record: record.Options{TopicTemplate: prefix + ".{aggregate_type}"}},
	}
}

// inProcess is the relay running in this process, for profiling. Its usage is the whole process's.
type inProcess struct {
	started time.Time
	cancel  context.CancelFunc
	done    chan struct{}
	err     error
}

func startInProcess(cfg relay.Config) (*inProcess, error) {
	r, err := relay.New(cfg, zap.NewNop(), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &inProcess{started: time.Now(), cancel: cancel, done: make(chan struct{})}
	go func() { p.err = r.Run(ctx); close(p.done) }()
	return p, nil
}

func (p *inProcess) startedAt() time.Time { return p.started }

func (p *inProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *inProcess) failure() error { return fmt.Errorf("in-process relay stopped early: %v", p.err) }

func (p *inProcess) logTail() string { return "in-process relay (logs discarded)" }

func (p *inProcess) usage() (time.Duration, int64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Maxrss * 1024, nil
}

func (p *inProcess) stop(grace time.Duration) {
	p.cancel()
	select {
	case <-p.done:
	case <-time.After(grace):
	}
}
