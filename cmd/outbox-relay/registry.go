package main

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/outbox-relay/outbox-relay/config"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/schemaregistry"
	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/schemas/protobuf"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/record"
)

// recordEncodings are the encodings package record builds: a registry encoding's key and value
// are built raw (the aggregate id, the payload) and framed by the sink's Serializer.
func recordEncodings(c *config.Config) (value, key record.Encoding) {
	value, key = record.Encoding(c.ValueEncoding), record.Encoding(c.KeyEncoding)
	if config.RegistryEncoding(c.ValueEncoding) {
		value = record.Raw
	}
	if config.RegistryEncoding(c.KeyEncoding) {
		key = record.Raw
	}
	return value, key
}

// newSerializer returns the sink's Serializer for the registry encodings, and the registry client
// to close once the relay has stopped; nil, nil without a registry encoding. m and log may be nil
// (a client that reports nothing: the start's configuration check, replay's probe).
func newSerializer(c *config.Config, m *metrics.Metrics, log *zap.Logger) (sink.Serializer, *schemaregistry.Client, error) {
	value, key := config.RegistryEncoding(c.ValueEncoding), config.RegistryEncoding(c.KeyEncoding)
	client, err := newRegistryClient(c, m, log)
	if err != nil || client == nil {
		return nil, nil, err
	}
	r := c.SchemaRegistry
	so := schemas.Options{
		AvroKey: key, Strategy: schemas.Strategy(r.SubjectStrategy), RecordName: r.RecordName, RecordNamespace: r.RecordNamespace,
		AutoRegister: r.AutoRegister, Version: r.Version, LatestRefresh: r.LatestRefresh,
		FrameOnly: schemas.FrameOnly(r.FrameOnly), FrameSubject: r.FrameSubject,
	}
	if value && r.FrameOnly == "" {
		// Every registry value encoding has its Format: one without would leave values unframed.
		f, err := schemas.ValueFormat(c.ValueEncoding)
		if err != nil {
			client.Close()
			return nil, nil, fmt.Errorf("config key value_encoding: %w", err)
		}
		if pf, ok := f.(*protobuf.Format); ok {
			pf.Message = r.ProtobufMessage
		}
		so.Value = f
	}
	s, err := schemas.New(client, so)
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("config key schema_registry: %w", err)
	}
	return &closingSerializer{Serializer: s, client: client}, client, nil
}

// newRegistryClient returns the registry client of c's schema_registry settings; nil without a
// registry encoding. m and log may be nil (a client that reports nothing).
func newRegistryClient(c *config.Config, m *metrics.Metrics, log *zap.Logger) (*schemaregistry.Client, error) {
	if !config.RegistryEncoding(c.ValueEncoding) && !config.RegistryEncoding(c.KeyEncoding) {
		return nil, nil
	}
	r := c.SchemaRegistry
	o := schemaregistry.Options{
		URLs: r.URLs, Username: r.Username, PasswordFile: r.PasswordFile, BearerTokenFile: r.BearerTokenFile,
		CAFile: r.CAFile, CertFile: r.CertFile, KeyFile: r.KeyFile, Timeout: r.Timeout,
		// The Serializer keeps a strict subject's latest schema for latest_refresh itself.
		LatestTTL: r.LatestRefresh,
		Logger:    log,
	}
	if m != nil {
		up, requests := m.SchemaRegistryMetrics()
		o.Metrics = &schemaregistry.Metrics{Up: up, Requests: requests}
	}
	client, err := schemaregistry.New(o)
	if err != nil {
		return nil, fmt.Errorf("config key schema_registry: %w", err)
	}
	return client, nil
}

// swapSerializer returns the Serializer run streams with: one whose registry client reports to m
// and log, in place of old (relayConfig's, which reports nothing). Close on the result (when it
// has one) closes the client. The registry is asked once now (not fatal): the client assumes it is
// up until a request says otherwise, and the first request may be long after the start (no event
// yet, or every schema cached), so without it the up gauge and status would say up for a
// registry that has never answered.
func swapSerializer(ctx context.Context, c *config.Config, m *metrics.Metrics, log *zap.Logger, old sink.Serializer) (sink.Serializer, error) {
	if old == nil {
		return nil, nil
	}
	if o, ok := old.(*closingSerializer); ok {
		o.Close()
	}
	s, client, err := newSerializer(c, m, log.Named("schema_registry"))
	if err != nil {
		return nil, err
	}
	if err := client.Check(ctx); err != nil {
		log.Warn("schema registry: the start-up check failed; the relay starts, and events that need a schema it has not cached wait until the registry answers",
			zap.Strings("urls", client.URLs()), zap.Error(err))
	}
	return &closingSerializer{Serializer: s, client: client}, nil
}

// closingSerializer is a Serializer with its registry client, closed together.
type closingSerializer struct {
	sink.Serializer
	client *schemaregistry.Client
}

func (s *closingSerializer) Close() { s.client.Close() }
