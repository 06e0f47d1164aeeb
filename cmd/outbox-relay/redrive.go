package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/outbox-relay/outbox-relay/redrive"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// errStillFailing is the exit status 3 of a redrive that left dead letters behind.
var errStillFailing = errors.New("some dead letters still fail")

// runRedrive publishes the dead-letter topic's records (or a range of them) to their original
// topics again, once each across runs, and lists those that still fail.
func runRedrive(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, loader := newFlags("redrive", stderr)
	partition := fs.Int("partition", -1, "redrive only this partition of the dead-letter topic (default: all)")
	fromOffset := fs.Int64("from-offset", -1, "redrive records at or after this offset (of each partition read)")
	toOffset := fs.Int64("to-offset", -1, "redrive records up to this offset, inclusive")
	var ids listFlag
	fs.Var(&ids, "event-id", "redrive only the event with this `id` (repeat the flag, or separate ids with commas)")
	ledger := fs.String("ledger-topic", "", "compacted topic recording what went back (default: the dead-letter topic + "+redrive.LedgerSuffix+")")
	dryRun := fs.Bool("dry-run", false, "report what would go back, publish nothing")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *fromOffset >= 0 && *toOffset >= 0 && *toOffset < *fromOffset {
		fmt.Fprintln(stderr, "outbox-relay redrive: --to-offset is before --from-offset")
		return errUsage
	}
	cfg, err := loader.Load()
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintf(stderr, "outbox-relay: warning: %s\n", w)
	}
	kc, err := kafkaConnection(cfg)
	if err != nil {
		return err
	}
	_, transport := sink.NewClient(kc, kc.WriteTimeout)
	defer transport.CloseIdleConnections()
	// Registry encodings: the key goes back raw from record, framed by the serializer.
	_, keyEnc := recordEncodings(cfg)
	serializer, client, err := newSerializer(cfg, nil, nil)
	if err != nil {
		return err
	}
	if client != nil {
		defer client.Close()
	}
	started := time.Now()
	res, err := redrive.Run(ctx, redrive.Config{
		Brokers:         cfg.KafkaBrokers,
		Transport:       transport,
		Dialer:          sink.NewDialer(kc),
		DeadLetterTopic: cfg.DeadLetterTopic,
		LedgerTopic:     *ledger,
		Partition:       *partition,
		FromOffset:      *fromOffset,
		ToOffset:        *toOffset,
		EventIDs:        ids,
		KeyEncoding:     keyEnc,
		Serializer:      serializer,
		BuiltinHeaders:  cfg.BuiltinHeaders,
		Route: &record.Options{TopicTemplate: cfg.TopicTemplate, TopicRegex: cfg.TopicRegex, TopicReplacement: cfg.TopicReplacement,
			TopicRegexPassthrough: cfg.TopicRegexPassthrough, TopicAllow: cfg.TopicAllow, TopicDeny: cfg.TopicDeny},
		PositionsTopic: cfg.PositionsTopic,
		WriteTimeout:   cfg.Kafka.WriteTimeout,
		DryRun:         *dryRun,
	})
	if *dryRun {
		fmt.Fprintf(stdout, "dry run: %d dead letters read from %s: %d would go back, %d were redriven by an earlier run, %d would fail\n",
			res.Read, cfg.DeadLetterTopic, res.Read-res.Already-len(res.Failed), res.Already, len(res.Failed))
	} else {
		fmt.Fprintf(stdout, "%d dead letters read from %s: %d redriven to their original topics, %d redriven by an earlier run, %d still failing (%s)\n",
			res.Read, cfg.DeadLetterTopic, res.Redriven, res.Already, len(res.Failed), time.Since(started).Round(time.Millisecond))
	}
	for _, f := range res.Failed {
		fmt.Fprintf(stdout, "still failing: %s\n", f)
	}
	if err != nil {
		return err
	}
	if len(res.Failed) > 0 {
		return errStillFailing
	}
	return nil
}
