package decoder_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
)

const sampleContent = `{"id": "0b4e5c8e-1d2f-4a3b-9c8d-7e6f5a4b3c2d", "aggregate_type": "order", "aggregate_id": "order-42",
	"event_type": "OrderPlaced", "payload": {"total":12.5,"items":[1,2]}, "headers": {"trace":"abc"}}`

func messagesConfig() decoder.Config {
	c := defaultConfig()
	c.MessagePrefix = "outbox"
	return c
}

func outboxMsg(content string) []byte { return logicalMsg(true, 0x16B3720, "outbox", content) }

func TestDecodeOutboxMessagesBecomeEvents(t *testing.T) {
	tests := []struct {
		name    string
		cfg     func(*decoder.Config)
		content string
		want    decoder.Event
	}{
		{"the configured member names map like columns, the payload is its JSON text as written", nil, sampleContent, sampleEvent()},
		{"members in any order, unknown members ignored",
			nil, `{"payload":[1, 2],"extra":{"x":1},"aggregate_id":"a-1","event_type":"E","aggregate_type":"t","id":"i-1"}`,
			decoder.Event{ID: bs("i-1"), AggregateType: bs("t"), AggregateID: bs("a-1"), EventType: bs("E"), Payload: bs("[1, 2]")}},
		{"a payload of any JSON type: a string stays a JSON string",
			nil, `{"id":"i","aggregate_type":"t","aggregate_id":"a","payload":"plain \"text\""}`,
			decoder.Event{ID: bs("i"), AggregateType: bs("t"), AggregateID: bs("a"), Payload: bs(`"plain \"text\""`)}},
		{"a null or absent payload and event type are NULL",
			nil, `{"id":"i","aggregate_type":"t","aggregate_id":"a","payload":null,"event_type":null,"headers":null}`,
			decoder.Event{ID: bs("i"), AggregateType: bs("t"), AggregateID: bs("a")}},
		{"escaped strings are decoded",
			nil, `{"id":"i\u00e9","aggregate_type":"t\/x","aggregate_id":"k\"ü","payload":1}`,
			decoder.Event{ID: bs("ié"), AggregateType: bs("t/x"), AggregateID: bs(`k"ü`), Payload: bs("1")}},
		{"an escaped member name is decoded",
			nil, `{"\u0069d":"i","aggregate_type":"t","aggregate_id":"a"}`,
			decoder.Event{ID: bs("i"), AggregateType: bs("t"), AggregateID: bs("a")}},
		{"the Debezium profile's names work unchanged",
			func(c *decoder.Config) {
				c.Columns = decoder.Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type", Payload: "payload"}
			},
			`{"id":"i","aggregatetype":"order","aggregateid":"o-1","type":"Created","payload":{"a":1},"headers":"ignored: no headers column"}`,
			decoder.Event{ID: bs("i"), AggregateType: bs("order"), AggregateID: bs("o-1"), EventType: bs("Created"), Payload: bs(`{"a":1}`)}},
		{"extra members: strings as their text, other values as JSON, absent as NULL",
			func(c *decoder.Config) { c.Extra = []string{"tenant", "version", "missing", "nested"} },
			`{"id":"i","aggregate_type":"t","aggregate_id":"a","tenant":"acme","version":3,"nested":{"a":[1]}}`,
			decoder.Event{ID: bs("i"), AggregateType: bs("t"), AggregateID: bs("a"), Extra: [][]byte{bs("acme"), bs("3"), nil, bs(`{"a":[1]}`)}}},
		{"the aggregate version member, a number or a string holding one",
			func(c *decoder.Config) { c.Columns.AggregateVersion = "aggregate_version" },
			`{"id":"i","aggregate_type":"t","aggregate_id":"a","aggregate_version":7}`,
			decoder.Event{ID: bs("i"), AggregateType: bs("t"), AggregateID: bs("a"), AggregateVersion: bs("7")}},
		{"the aggregate version as a string",
			func(c *decoder.Config) { c.Columns.AggregateVersion = "aggregate_version" },
			`{"id":"i","aggregate_type":"t","aggregate_id":"a","aggregate_version":"12"}`,
			decoder.Event{ID: bs("i"), AggregateType: bs("t"), AggregateID: bs("a"), AggregateVersion: bs("12")}},
		{"an aggregate version string with a sign or leading zeros is its decimal, as a bigint column prints it (the sink sends only that)",
			func(c *decoder.Config) { c.Columns.AggregateVersion = "aggregate_version" },
			`{"id":"i","aggregate_type":"t","aggregate_id":"a","aggregate_version":"+007"}`,
			decoder.Event{ID: bs("i"), AggregateType: bs("t"), AggregateID: bs("a"), AggregateVersion: bs("7")}},
		{"a base64 payload is decoded to bytes (line breaks as encode() writes them ignored)",
			func(c *decoder.Config) { c.PayloadBase64 = true },
			`{"id":"i","aggregate_type":"t","aggregate_id":"a","payload":"AAH/\nZm9v"}`,
			decoder.Event{ID: bs("i"), AggregateType: bs("t"), AggregateID: bs("a"), Payload: bs("\x00\x01\xfffoo")}},
		{"whitespace around everything",
			nil, " \n{ \"id\" : \"i\" ,\t\"aggregate_type\" :\"t\", \"aggregate_id\": \"a\" , \"payload\" : { \"x\" : [ 1 , \"]\" ] } }\n",
			decoder.Event{ID: bs("i"), AggregateType: bs("t"), AggregateID: bs("a"), Payload: bs(`{ "x" : [ 1 , "]" ] }`)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := messagesConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			d := decoder.New(cfg)
			mustDecode(t, d, txBegin())
			msg := outboxMsg(tt.content)
			ch, err := d.Decode(insertAt, msg)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if ch.Kind != decoder.Insert || ch.Event == nil {
				t.Fatalf("kind %s, want an insert with an event", ch.Kind)
			}
			if ch.Unusable != nil {
				t.Fatalf("Unusable: %v", ch.Unusable)
			}
			checkEventFields(t, ch.Event, tt.want)
			checkTx(t, "Event.Tx", ch.Event.Tx, decoder.TxInfo{Xid: txXid, CommitLSN: txCommitLSN, CommitTime: txTime})
			if ch.Event.LSN != 0x16B3720 {
				t.Errorf("LSN %s, want the message's own 0/16B3720", ch.Event.LSN)
			}
			if ch.Event.RawSize < int64(len(msg)) {
				t.Errorf("RawSize %d, want at least the message's %d bytes", ch.Event.RawSize, len(msg))
			}
		})
	}
}

func TestDecodeOutboxMessageValuesAliasTheMessageOrCountTheirCopies(t *testing.T) {
	d := decoder.New(messagesConfig())
	mustDecode(t, d, txBegin())
	msg := outboxMsg(sampleContent)
	ch, err := d.Decode(insertAt, msg)
	if err != nil {
		t.Fatal(err)
	}
	e := ch.Event
	for i, v := range [][]byte{e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload, e.Headers} {
		if !within(msg, v) {
			t.Errorf("value %d is a copy, want a slice of the message", i)
		}
	}
	if e.RawSize != int64(len(msg)) {
		t.Errorf("RawSize %d, want exactly the message's %d bytes (nothing copied)", e.RawSize, len(msg))
	}

	cfg := messagesConfig()
	cfg.PayloadBase64 = true
	d = decoder.New(cfg)
	mustDecode(t, d, txBegin())
	payload := strings.Repeat("QUJD", 1000) // "ABC" x 1000
	msg = outboxMsg(`{"id":"\u0069","aggregate_type":"t","aggregate_id":"a","payload":"` + payload + `"}`)
	ch, err = d.Decode(insertAt, msg)
	if err != nil || ch.Unusable != nil {
		t.Fatal(err, ch.Unusable)
	}
	if want := int64(len(msg) + 3000 + 1); ch.Event.RawSize != want {
		t.Errorf("RawSize %d, want %d: the message, the decoded payload and the unescaped id", ch.Event.RawSize, want)
	}
}

func TestDecodeInvalidOutboxMessagesGoToTheFailurePolicy(t *testing.T) {
	tests := []struct {
		name    string
		cfg     func(*decoder.Config)
		content string
		want    string // in the error
		id, key string // what could still be read
	}{
		{"not JSON", nil, `{"id": "i", oops`, "not valid JSON", "", ""},
		{"empty content", nil, ``, "not valid JSON", "", ""},
		{"JSON but not an object", nil, `["id", "i"]`, "must be a JSON object", "", ""},
		{"a JSON string", nil, `"hello"`, "must be a JSON object", "", ""},
		{"no id", nil, `{"aggregate_type":"t","aggregate_id":"a"}`, `"id" is missing`, "", "a"},
		{"a null id", nil, `{"id":null,"aggregate_type":"t","aggregate_id":"a"}`, `"id" is missing`, "", "a"},
		{"an empty id", nil, `{"id":"","aggregate_type":"t","aggregate_id":"a"}`, `"id" is empty`, "", "a"},
		{"no aggregate type", nil, `{"id":"i","aggregate_id":"a"}`, `"aggregate_type" is missing`, "i", "a"},
		{"no aggregate id", nil, `{"id":"i","aggregate_type":"t"}`, `"aggregate_id" is missing`, "i", ""},
		{"a numeric aggregate id", nil, `{"id":"i","aggregate_type":"t","aggregate_id":42}`, `"aggregate_id" must be a JSON string`, "i", ""},
		{"an object as event type", nil, `{"id":"i","aggregate_type":"t","aggregate_id":"a","event_type":{}}`, `"event_type" must be a JSON string`, "i", "a"},
		{"headers that are not an object", nil, `{"id":"i","aggregate_type":"t","aggregate_id":"a","headers":"x=1"}`, `"headers" must be a JSON object`, "i", "a"},
		{"a base64 payload that is not a string", func(c *decoder.Config) { c.PayloadBase64 = true },
			`{"id":"i","aggregate_type":"t","aggregate_id":"a","payload":{"a":1}}`, "must be a JSON string", "i", "a"},
		{"a base64 payload that is not base64", func(c *decoder.Config) { c.PayloadBase64 = true },
			`{"id":"i","aggregate_type":"t","aggregate_id":"a","payload":"not base64!"}`, "not valid base64", "i", "a"},
		{"an aggregate version that is not an integer", func(c *decoder.Config) { c.Columns.AggregateVersion = "aggregate_version" },
			`{"id":"i","aggregate_type":"t","aggregate_id":"a","aggregate_version":1.5}`, `"aggregate_version" (columns.aggregate_version) must be an integer`, "i", "a"},
		{"several problems are all named", nil, `{"id":1,"aggregate_type":[]}`, `"id" must be a JSON string, got 1; member "aggregate_type" must be a JSON string, got []; member "aggregate_id" is missing`, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := messagesConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			d := decoder.New(cfg)
			mustDecode(t, d, txBegin(), outboxMsg(sampleContent))
			ch, err := d.Decode(insertAt, outboxMsg(tt.content))
			if err != nil {
				t.Fatalf("Decode returned an error (%v); bad content must reach the failure policy, not stop the stream", err)
			}
			if ch.Kind != decoder.Insert || ch.Event == nil {
				t.Fatalf("kind %s, want an insert with an event: never a silent skip", ch.Kind)
			}
			if !errors.Is(ch.Unusable, decoder.ErrInvalidMessage) {
				t.Fatalf("Unusable = %v, want ErrInvalidMessage", ch.Unusable)
			}
			if !strings.Contains(ch.Unusable.Error(), tt.want) {
				t.Errorf("Unusable = %q, want it to mention %q", ch.Unusable, tt.want)
			}
			if string(ch.Event.ID) != tt.id || string(ch.Event.AggregateID) != tt.key {
				t.Errorf("id %s key %s, want what could be read: %q %q", show(ch.Event.ID), show(ch.Event.AggregateID), tt.id, tt.key)
			}
			if string(ch.Event.Payload) != tt.content {
				t.Errorf("payload %s, want the content as written for the dead-letter record", show(ch.Event.Payload))
			}
			if ch.Event.Index != 1 {
				t.Errorf("Index %d, want 1: an invalid message is still an event of its transaction", ch.Event.Index)
			}
			// The stream goes on.
			ch, err = d.Decode(insertAt, outboxMsg(`{"id":"i","aggregate_type":"t","aggregate_id":"a","payload":"eA=="}`))
			if err != nil || ch.Unusable != nil || ch.Event.Index != 2 {
				t.Fatalf("the next message: %v, %v, index %d", err, ch.Unusable, ch.Event.Index)
			}
		})
	}
}

func TestDecodeWhichMessagesAreEvents(t *testing.T) {
	tests := []struct {
		name          string
		prefix        string // Config.MessagePrefix
		transactional bool
		msgPrefix     string
		want          decoder.Kind
	}{
		{"a transactional message with the prefix is an event", "outbox", true, "outbox", decoder.Insert},
		{"another prefix is skipped", "outbox", true, "audit", decoder.Skip},
		{"a prefix that only starts like the outbox's is skipped", "outbox", true, "outbox.v2", decoder.Skip},
		{"the prefix is compared exactly (case)", "outbox", true, "Outbox", decoder.Skip},
		{"without a configured prefix, no message is an event", "", true, "outbox", decoder.Skip},
		{"a non-transactional message with the prefix stays a Message (the relay warns)", "outbox", false, "outbox", decoder.Message},
		{"the heartbeat stays a Message", "outbox", false, "outbox-relay-heartbeat", decoder.Message},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.MessagePrefix = tt.prefix
			d := decoder.New(cfg)
			if tt.transactional {
				mustDecode(t, d, txBegin())
			}
			ch, err := d.Decode(insertAt, logicalMsg(tt.transactional, 0x16B3720, tt.msgPrefix, sampleContent))
			if err != nil {
				t.Fatal(err)
			}
			if ch.Kind != tt.want {
				t.Errorf("kind %s, want %s", ch.Kind, tt.want)
			}
		})
	}
}

func TestDecodeRowsAndMessagesShareTheTransactionsIndex(t *testing.T) {
	d := decoder.New(messagesConfig())
	mustDecode(t, d, outboxRelation(), otherRelation(), txBegin())
	var got []string
	for _, m := range [][]byte{
		sampleInsert(), outboxMsg(sampleContent), insertMsg(otherOID, []val{text("1"), text("x")}),
		outboxMsg(`not json`), logicalMsg(true, 0x16B3720, "audit", "x"), sampleInsert(), outboxMsg(sampleContent),
	} {
		ch, err := d.Decode(insertAt, m)
		if err != nil {
			t.Fatal(err)
		}
		if ch.Kind == decoder.Insert {
			kind := "row"
			if m[0] == 'M' {
				kind = "message"
			}
			got = append(got, kind+":"+string(rune('0'+ch.Event.Index)))
		}
	}
	want := "row:0 message:1 message:2 row:3 message:4"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("events %q, want %q", g, want)
	}
	mustDecode(t, d, txCommit(), beginMsg(txCommitLSN+0x100, txTime, txXid+1))
	ch, err := d.Decode(insertAt, outboxMsg(sampleContent))
	if err != nil || ch.Event.Index != 0 {
		t.Errorf("first message of the next transaction: index %d (%v), want 0", ch.Event.Index, err)
	}
}

func TestDecodeWithoutATableSkipsEveryRelationsRows(t *testing.T) {
	cfg := messagesConfig()
	cfg.NoTable = true
	d := decoder.New(cfg)
	for _, m := range [][]byte{outboxRelation(), otherRelation()} {
		ch, err := d.Decode(insertAt, m)
		if err != nil || ch.Kind != decoder.Skip {
			t.Fatalf("relation: kind %s (%v), want skip: nothing for the caller to classify", ch.Kind, err)
		}
	}
	mustDecode(t, d, txBegin())
	for _, m := range [][]byte{sampleInsert(), insertMsg(otherOID, []val{text("1"), text("x")})} {
		ch, err := d.Decode(insertAt, m)
		if err != nil || ch.Kind != decoder.Skip {
			t.Fatalf("row: kind %s (%v), want skip", ch.Kind, err)
		}
	}
	ch, err := d.Decode(insertAt, outboxMsg(sampleContent))
	if err != nil || ch.Kind != decoder.Insert || ch.Event.Index != 0 {
		t.Fatalf("message: kind %s (%v), want the transaction's first event", ch.Kind, err)
	}
}

func TestDecodeOutboxMessageOutsideATransactionIsAnError(t *testing.T) {
	d := decoder.New(messagesConfig())
	if _, err := d.Decode(insertAt, outboxMsg(sampleContent)); err == nil || !strings.Contains(err.Error(), "outside a transaction") {
		t.Fatalf("error %v, want one about a message outside a transaction", err)
	}
}

func FuzzDecodeOutboxMessageContent(f *testing.F) {
	for _, s := range []string{sampleContent, `{}`, `{"id":"i","aggregate_type":"t","aggregate_id":"a","payload":"\u00e9"}`, `[`, `{"a":{"b":[1,{"c":"]}"}]}}`} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, content string, b64 bool) {
		cfg := messagesConfig()
		cfg.PayloadBase64 = b64
		cfg.Extra = []string{"tenant"}
		d := decoder.New(cfg)
		mustDecode(t, d, txBegin())
		ch, err := d.Decode(pglogrepl.LSN(1), outboxMsg(content))
		if err != nil {
			t.Fatalf("bad content stopped the stream: %v", err)
		}
		if ch.Kind != decoder.Insert || ch.Event == nil {
			t.Fatalf("kind %s: a message with the prefix must always be an event", ch.Kind)
		}
		if ch.Unusable == nil && (ch.Event.ID == nil || ch.Event.AggregateType == nil || ch.Event.AggregateID == nil) {
			t.Fatalf("an event without id or aggregate passed as usable: %q", content)
		}
	})
}

func BenchmarkDecodeOutboxMessage(b *testing.B) {
	payload := `{"orderId":"6f1c2a8e-3b7d-4c5e-9f0a-1b2c3d4e5f60","customerId":"c-1029384756","currency":"EUR",` +
		`"items":[{"sku":"SKU-000123","qty":2,"price":19.99},{"sku":"SKU-000456","qty":1,"price":5.49}],` +
		`"shipping":{"method":"express","city":"Berlin","zip":"10115"},"total":45.47,"placedAt":"2024-05-06T07:08:09Z"}`
	d := decoder.New(messagesConfig())
	mustDecode(b, d, txBegin())
	msg := outboxMsg(`{"id":"0b4e5c8e-1d2f-4a3b-9c8d-7e6f5a4b3c2d","aggregate_type":"order","aggregate_id":"order-42",` +
		`"event_type":"OrderPlaced","payload":` + payload + `,"headers":{"trace":"abc"}}`)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		ch, err := d.Decode(insertAt, msg)
		if err != nil || ch.Kind != decoder.Insert || ch.Unusable != nil {
			b.Fatalf("Decode = %s, %v, %v", ch.Kind, err, ch.Unusable)
		}
	}
	b.ReportMetric(float64(len(payload)), "payload-bytes")
}
