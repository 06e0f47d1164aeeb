package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Record encodings framed through a schema registry (value_encoding, key_encoding).
const (
	EncodingAvro       = "avro"
	EncodingProtobuf   = "protobuf"    // values only
	EncodingJSONSchema = "json-schema" // values only
)

// RegistryEncoding reports whether a value or key encoding is framed through the schema registry.
func RegistryEncoding(enc string) bool {
	return enc == EncodingAvro || enc == EncodingProtobuf || enc == EncodingJSONSchema
}

// SchemaRegistry configures the schema registry that registry encodings (value_encoding avro,
// protobuf or json-schema; key_encoding avro) frame records with, and how subjects and schemas are chosen (package schemas).
type SchemaRegistry struct {
	URLs            []string
	Username        string
	PasswordFile    string
	BearerTokenFile string
	CAFile          string
	CertFile        string
	KeyFile         string
	Timeout         time.Duration

	AutoRegister    bool
	Version         int // strict: the pinned version; 0 the latest
	LatestRefresh   time.Duration
	SubjectStrategy string
	RecordName      string
	RecordNamespace string
	FrameOnly       string // "", bytes or base64
	FrameSubject    string
	ProtobufMessage string // strict protobuf: the message payloads are; "" the schema's first
}

// registrySettings are the schema_registry.* keys.
var registrySettings = []setting{
	{key: "schema_registry.urls", see: []string{"registry-encodings.md"}, group: GroupRouting, kind: kindList, help: "base URLs of the schema registry's Confluent-compatible API (Confluent: http://host:8081; Apicurio 2.x: http://host:8080/apis/ccompat/v7), comma-separated, tried in order; required by value_encoding avro, protobuf or json-schema, or key_encoding avro",
		apply: list(func(c *Config) *[]string { return &c.SchemaRegistry.URLs })},
	{key: "schema_registry.username", group: GroupRouting, kind: kindString, help: "basic auth user name for the registry",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.Username })},
	{key: "schema_registry.password_file", group: GroupRouting, kind: kindString, help: "file holding the registry's basic auth password (a mounted Secret), read for every request",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.PasswordFile })},
	{key: "schema_registry.bearer_token_file", group: GroupRouting, kind: kindString, help: "file holding a bearer token for the registry, read for every request; instead of basic auth",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.BearerTokenFile })},
	{key: "schema_registry.ca_file", group: GroupRouting, kind: kindString, help: "PEM CA bundle to verify an https registry (default: system roots)",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.CAFile })},
	{key: "schema_registry.cert_file", group: GroupRouting, kind: kindString, help: "PEM client certificate for mutual TLS with the registry",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.CertFile })},
	{key: "schema_registry.key_file", group: GroupRouting, kind: kindString, help: "PEM client key for mutual TLS with the registry",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.KeyFile })},
	{key: "schema_registry.timeout", group: GroupRouting, kind: kindDuration, def: "10s", help: "bound on one registry request; a registry slower than this counts as unavailable (events wait, retried)",
		apply: minDuration(100*time.Millisecond, func(c *Config) *time.Duration { return &c.SchemaRegistry.Timeout })},
	{key: "schema_registry.auto_register", see: []string{"registry-encodings.md"}, group: GroupRouting, kind: kindBool, def: "true", help: "infer each payload's schema and register it (Debezium's auto.register.schemas; a schema the subject's compatibility rule refuses goes to the failure policy, reason schema_incompatible); false: strict, the payload converted to the subject's latest (or schema_registry.version) schema, and a payload that does not fit goes to the failure policy (reason schema_mismatch, naming the field)",
		apply: boolean(func(c *Config) *bool { return &c.SchemaRegistry.AutoRegister })},
	{key: "schema_registry.version", group: GroupRouting, kind: kindInt, def: "0", help: "strict and frame-only: the subject's version to use; 0 the latest",
		apply: func(c *Config, v string) error {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 0 {
				return fmt.Errorf("want a version number (0 for the latest), got %q", v)
			}
			c.SchemaRegistry.Version = n
			return nil
		}},
	{key: "schema_registry.latest_refresh", group: GroupRouting, kind: kindDuration, def: "1m", help: "strict and frame-only with the latest version: how long a subject's latest schema is used before it is looked up again (a new version is picked up within this; in strict mode, a payload that does not fit the schema in hand has the latest read from the registry at once, before it is called a schema_mismatch)",
		apply: minDuration(time.Second, func(c *Config) *time.Duration { return &c.SchemaRegistry.LatestRefresh })},
	{key: "schema_registry.subject_strategy", group: GroupRouting, kind: choices("topic", "record", "topic-record"), def: "topic", help: "subject names: topic (<topic>-value, <topic>-key), record (the record's full name; the key's is string) or topic-record (<topic>-<record full name>), as Confluent's TopicNameStrategy, RecordNameStrategy, TopicRecordNameStrategy",
		apply: oneOf(func(c *Config) *string { return &c.SchemaRegistry.SubjectStrategy }, "topic", "record", "topic-record")},
	{key: "schema_registry.record_name", group: GroupRouting, kind: kindString, help: "name of the value's record; empty: payload with the topic strategy (as Debezium names the expanded payload), the event type made an Avro name (order.created is order_created) with the record strategies",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.RecordName })},
	{key: "schema_registry.record_namespace", group: GroupRouting, kind: kindString, help: "namespace of the value's record (dot-separated Avro names); empty for none",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.RecordNamespace })},
	{key: "schema_registry.frame_only", see: []string{"registry-encodings.md"}, group: GroupRouting, kind: kind("bytes|base64"), help: "the payload is already serialized by the application: frame it, without re-encoding, with the id of the subject's latest (or schema_registry.version) schema; bytes (a bytea payload) or base64 (text, or a JSON string); needs auto_register false; empty: encode the JSON payload",
		apply: func(c *Config, v string) error {
			if v == "" {
				c.SchemaRegistry.FrameOnly = ""
				return nil
			}
			return oneOf(func(c *Config) *string { return &c.SchemaRegistry.FrameOnly }, "bytes", "base64")(c, v)
		}},
	{key: "schema_registry.frame_subject", group: GroupRouting, kind: kindString, help: "frame-only: the subject whose schema id frames the payloads; empty: the subject strategy's",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.FrameSubject })},
	{key: "schema_registry.protobuf_message", group: GroupRouting, kind: kind("package.Message"), help: "value_encoding protobuf with auto_register false: the full name of the message the payloads are, in the subject's schema; empty: the schema's first message",
		apply: str(func(c *Config) *string { return &c.SchemaRegistry.ProtobufMessage })},
}

// checkRegistry checks the registry encodings against the rest of the configuration.
func (c *Config) checkRegistry(p *problems) {
	bad := p.bad
	value, key := RegistryEncoding(c.ValueEncoding), RegistryEncoding(c.KeyEncoding)
	r := c.SchemaRegistry
	if (value || key) && len(r.URLs) == 0 {
		enc := "value_encoding " + c.ValueEncoding
		if !value {
			enc = "key_encoding " + c.KeyEncoding
		}
		bad("schema_registry.urls", "is required by %s: name the registry's Confluent-compatible API", enc)
	}
	if value {
		for _, f := range c.ExtraFields {
			if strings.Contains(f, ":envelope") {
				bad("value_encoding", "%s cannot carry envelope fields (extra_fields %q): place them as headers", c.ValueEncoding, f)
				break
			}
		}
	}
	if r.FrameOnly != "" {
		if !value {
			bad("schema_registry.frame_only", "needs a registry value_encoding (avro, protobuf or json-schema): the subject's schema says what the application wrote")
		}
		if r.AutoRegister {
			bad("schema_registry.frame_only", "frames payloads with the registry's schema: set schema_registry.auto_register to false")
		}
		if r.FrameSubject == "" && r.SubjectStrategy == "record" && r.RecordName == "" {
			bad("schema_registry.frame_subject", "is needed with frame_only and the record strategy (or set schema_registry.record_name)")
		}
	}
	if r.ProtobufMessage != "" && (c.ValueEncoding != EncodingProtobuf || r.AutoRegister || r.FrameOnly != "") {
		bad("schema_registry.protobuf_message", "names the message of a strict protobuf subject: it needs value_encoding protobuf, auto_register false and no frame_only")
	}
	if r.PasswordFile != "" && r.BearerTokenFile != "" {
		bad("schema_registry.bearer_token_file", "and schema_registry.password_file are both set: use one")
	}
}

// RegistryKeys lists the schema_registry.* keys, for the commands that frame records too.
func RegistryKeys() []string {
	keys := make([]string, len(registrySettings))
	for i, s := range registrySettings {
		keys[i] = s.key
	}
	return keys
}
