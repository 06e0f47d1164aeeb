package schemas_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/schemas"
	"github.com/outbox-relay/outbox-relay/schemas/avro"
)

// inferring is the Avro format as any other Format: a Serializer over it infers, widens and looks
// up every payload's schema, as it did before it cached by shape.
type inferring struct{ *avro.Format }

// refusing answers 409 for a schema refuse names, as a registry whose compatibility rule the
// schema breaks.
type refusing struct {
	fakeRegistry
	refuse func(subject, schema string) bool
	asked  []string // every Register, in order
}

func (r *refusing) Register(ctx context.Context, subject string, s sr.Schema) (int, error) {
	r.asked = append(r.asked, subject+" "+s.Schema)
	if r.refuse != nil && r.refuse(subject, s.Schema) {
		return 0, &sr.ResponseError{StatusCode: http.StatusConflict, Message: "incompatible"}
	}
	return r.fakeRegistry.Register(ctx, subject, s)
}

// shapeCorpus is payloads of every kind inference and encoding tell apart.
var shapeCorpus = []string{
	`{"id":1,"name":"a"}`,
	`{"name":"b","id":2}`, // member order changes
	`{"id":3}`,            // a member left out
	`{"id":null,"name":null}`,
	`{"id":5000000000,"name":"c"}`, // int widens to long
	`{"id":1.5,"name":"d"}`,        // and to double
	`{"id":7,"name":"e"}`,
	`{"id":"x","name":"f"}`, // a string where a number was: cannot widen
	`{"id":8,"name":"g","extra":true}`,
	`{}`,
	`{"empty":{}}`,
	`{"empty":{"a":1}}`,
	`{"nested":{"a":1,"b":{"c":"d"}},"arr":[1,2,3]}`,
	`{"nested":{"b":{"c":"e","z":null},"a":2},"arr":[]}`,
	`{"nested":{"a":1,"b":{"c":"d"}},"arr":[1,2.5,3]}`,
	`{"nested":{"a":1,"b":{"c":"d"}},"arr":[null,null]}`,
	`{"lines":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}`,
	`{"lines":[{"sku":"a","qty":1},{"qty":2,"price":9.5}]}`,
	`{"lines":[{"sku":"a","qty":1},{"sku":"b","qty":2},{"sku":"c","qty":3}]}`,
	`{"lines":[{"sku":"a","qty":1},{"sku":3}]}`, // an array mixing kinds: cannot be inferred
	`{"lines":[[1,2],[3]],"m":[[],[1]]}`,
	`{"grüße":"ünïcödé","note":"\u00e9\ud83d\ude00","x-y":1}`,
	`{"x_y":2,"x-y":1}`, // two members that make one field
	`{"1st":true,"a b":false}`,
	`{"dup":1,"dup":"two"}`, // a repeated member: the last wins
	`{"dup":1,"dup":2}`,
	`{"big":123456789012345678901234567890,"neg":-2147483649,"min":-2147483648}`,
	`{"big":1e400}`, // a double out of range: inferred, but does not fit
	`{"f":1.0,"e":1e3,"z":0}`,
	`[1,2]`,
	`"text"`,
	`null`,
	`{"bad":`,
	`{"a":1} trailing`,
	`  {"spaced" : [ 1 , { "k" : "v" } ] }  `,
	`{"k":"v\"q\\\/\b\f\n\r\t"}`,
	`{"invalid":"` + "\xff" + `"}`,
	"{\"k\xff\":1,\"k\xff\":\"s\"}", // a name of invalid UTF-8, repeated
	`{"ok":1,"grüße":2}`,
}

// TestAvroShapeCacheWritesWhatInferringWrites holds the Serializer's shape cache to what inferring
// every payload gives: the same bytes, the same errors, the same registrations, over payloads of
// every kind in several orders, repeated so that shapes come back after their subject's schema
// has moved, with a registry that refuses some versions.
func TestAvroShapeCacheWritesWhatInferringWrites(t *testing.T) {
	strategies := []schemas.Strategy{schemas.StrategyTopic, schemas.StrategyRecord, schemas.StrategyTopicRecord}
	for seed := range uint64(6) {
		strategy := strategies[seed%3]
		t.Run(fmt.Sprintf("seed %d, %s strategy", seed, strategy), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 43))
			var payloads []string
			for range 4 {
				for _, i := range rng.Perm(len(shapeCorpus)) {
					payloads = append(payloads, shapeCorpus[i])
				}
			}
			// A registry whose compatibility rule refuses a string id once the subject has numbers.
			refuse := func(subject, schema string) bool {
				return seed%2 == 1 && strings.Contains(schema, `{"name":"id","type":["null","string"]`)
			}
			cached, viaInfer := &refusing{refuse: refuse}, &refusing{refuse: refuse}
			o := schemas.Options{AvroKey: true, AutoRegister: true, Strategy: strategy, RecordNamespace: "shop"}
			o.Value = avro.New()
			a, err := schemas.New(cached, o)
			if err != nil {
				t.Fatal(err)
			}
			o.Value = inferring{avro.New()}
			b, err := schemas.New(viaInfer, o)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			topics, types := []string{"orders", "parcels"}, []string{"Placed", "order.shipped"}
			for i, p := range payloads {
				topic, typ := topics[i%2], types[i/2%2]
				ka, va, erra := a.Serialize(ctx, topic, typ, []byte("agg-1"), []byte(p))
				kb, vb, errb := b.Serialize(ctx, topic, typ, []byte("agg-1"), []byte(p))
				if !bytes.Equal(ka, kb) || !bytes.Equal(va, vb) || fmt.Sprint(erra) != fmt.Sprint(errb) {
					t.Fatalf("payload %d %s to %s: cached %x %x %v; inferred %x %x %v", i, p, topic, ka, va, erra, kb, vb, errb)
				}
				var ea, eb *schemas.Error
				if errors.As(erra, &ea) != errors.As(errb, &eb) || ea != nil && (ea.Reason != eb.Reason || ea.Field != eb.Field || ea.Subject != eb.Subject) {
					t.Fatalf("payload %d %s: cached error %#v; inferred %#v", i, p, ea, eb)
				}
			}
			if strings.Join(cached.asked, "\n") != strings.Join(viaInfer.asked, "\n") || cached.calls != viaInfer.calls {
				t.Fatalf("registrations differ: cached %d calls\n%s\ninferred %d calls\n%s", cached.calls, strings.Join(cached.asked, "\n"),
					viaInfer.calls, strings.Join(viaInfer.asked, "\n"))
			}
		})
	}
}

// TestAvroShapeCacheAsksTheRegistryAgainWhenTheIDCacheStartsAgain: past 4096 subjects' schemas
// the ids cache starts again, and a shape seen before asks the registry for its id again, as
// inferring does.
func TestAvroShapeCacheAsksTheRegistryAgainWhenTheIDCacheStartsAgain(t *testing.T) {
	cached, viaInfer := &refusing{}, &refusing{}
	a, _ := schemas.New(cached, schemas.Options{Value: avro.New(), AvroKey: true, AutoRegister: true})
	b, _ := schemas.New(viaInfer, schemas.Options{Value: inferring{avro.New()}, AvroKey: true, AutoRegister: true})
	ctx := context.Background()
	for i := range 6300 {
		// Topics of their own (4200): a subject and a schema each, so the ids cache fills, and
		// starts again at 4096 while the first topic still sends.
		topic := fmt.Sprintf("t%d", i)
		if i%3 == 0 {
			topic = "t0"
		}
		p := []byte(`{"a":1}`)
		ka, va, erra := a.Serialize(ctx, topic, "", []byte("k"), p)
		kb, vb, errb := b.Serialize(ctx, topic, "", []byte("k"), p)
		if !bytes.Equal(ka, kb) || !bytes.Equal(va, vb) || fmt.Sprint(erra) != fmt.Sprint(errb) {
			t.Fatalf("payload %d to %s: cached %x %x %v; inferred %x %x %v", i, topic, ka, va, erra, kb, vb, errb)
		}
	}
	if cached.calls != viaInfer.calls || len(cached.asked) != len(viaInfer.asked) {
		t.Fatalf("registry calls: cached %d (%d registrations), inferred %d (%d)", cached.calls, len(cached.asked), viaInfer.calls, len(viaInfer.asked))
	}
	// Keys are framed alike either way: their subject asks again with its value's.
	keys, values := 0, 0
	for _, r := range cached.asked {
		keys += bool2int(strings.HasPrefix(r, "t0-key "))
		values += bool2int(strings.HasPrefix(r, "t0-value "))
	}
	if keys != values || keys < 2 {
		t.Fatalf("subject t0-key registered %d times, t0-value %d; want as many, and again after the ids cache started again", keys, values)
	}
}

// TestAvroShapeCacheServesBenchPayloadsWithoutTheRegistry: the steady state of make bench's
// payloads makes no registry call and writes what inferring writes.
func TestAvroShapeCacheServesBenchPayloadsWithoutTheRegistry(t *testing.T) {
	cached, viaInfer := &refusing{}, &refusing{}
	a, _ := schemas.New(cached, schemas.Options{Value: avro.New(), AvroKey: true, AutoRegister: true})
	b, _ := schemas.New(viaInfer, schemas.Options{Value: inferring{avro.New()}, AvroKey: true, AutoRegister: true})
	ctx := context.Background()
	payloads := benchPayloads()
	for round := range 2 {
		before := cached.calls
		for i, p := range payloads {
			ka, va, erra := a.Serialize(ctx, "outbox.event.order", "Happened", []byte("agg-7"), p)
			kb, vb, errb := b.Serialize(ctx, "outbox.event.order", "Happened", []byte("agg-7"), p)
			if erra != nil || errb != nil || !bytes.Equal(ka, kb) || !bytes.Equal(va, vb) {
				t.Fatalf("round %d payload %d: cached %x %x %v; inferred %x %x %v", round, i, ka, va, erra, kb, vb, errb)
			}
		}
		if round == 1 && cached.calls != before {
			t.Fatalf("the second round asked the registry %d times; want none", cached.calls-before)
		}
	}
	if cached.calls != viaInfer.calls {
		t.Fatalf("registry calls: cached %d, inferred %d", cached.calls, viaInfer.calls)
	}
}

func bool2int(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestAvroShapeCacheServesConcurrentCallers: callers at once (as the sink's streams) get what
// one caller alone gets, each from parsers of their own (go test -race).
func TestAvroShapeCacheServesConcurrentCallers(t *testing.T) {
	ctx := context.Background()
	payloads := benchPayloads()
	alone, _ := schemas.New(&refusing{}, schemas.Options{Value: inferring{avro.New()}, AvroKey: true, AutoRegister: true})
	want := make([][]byte, len(payloads))
	for i, p := range payloads {
		_, want[i], _ = alone.Serialize(ctx, "orders", "", []byte("k"), p)
	}
	for i, p := range payloads { // the widest schema now: every payload again in it
		_, want[i], _ = alone.Serialize(ctx, "orders", "", []byte("k"), p)
	}
	s, _ := schemas.New(&lockedRegistry{r: &refusing{}}, schemas.Options{Value: avro.New(), AvroKey: true, AutoRegister: true})
	for _, p := range payloads {
		if _, _, err := s.Serialize(ctx, "orders", "", []byte("k"), p); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for round := range 20 {
				for i := range payloads {
					j := (i + g*7 + round) % len(payloads)
					p := append([]byte(nil), payloads[j]...)
					_, v, err := s.Serialize(ctx, "orders", "", []byte("k"), p)
					clear(p) // the caller's buffer changes once the call is over
					if err != nil || !bytes.Equal(v, want[j]) {
						errs <- fmt.Errorf("payload %d: %x, %v; want %x", j, v, err, want[j])
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// lockedRegistry serializes calls to a fake registry for concurrent callers.
type lockedRegistry struct {
	mu sync.Mutex
	r  *refusing
}

func (l *lockedRegistry) Register(ctx context.Context, subject string, s sr.Schema) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Register(ctx, subject, s)
}

func (l *lockedRegistry) Latest(ctx context.Context, subject string) (sr.SubjectSchema, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Latest(ctx, subject)
}

func (l *lockedRegistry) Version(ctx context.Context, subject string, v int) (sr.SubjectSchema, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Version(ctx, subject, v)
}

func (l *lockedRegistry) SchemaByID(ctx context.Context, id int) (sr.Schema, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.SchemaByID(ctx, id)
}
