package avro

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"reflect"
	"testing"
)

// viaEncodingJSON is what encoding/json makes of b: its value with numbers as json.Number, or an
// error.
func viaEncodingJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("content after the value")
	}
	return v, nil
}

func (n *node) value() any {
	switch n.kind {
	case 'o':
		m := make(map[string]any, len(n.keys))
		for i, k := range n.keys {
			m[k] = n.vals[i].value()
		}
		return m
	case 'a':
		a := make([]any, len(n.vals))
		for i, v := range n.vals {
			a[i] = v.value()
		}
		return a
	case 's':
		return n.str
	case 'n':
		return n.num
	case 'b':
		return n.boolean
	}
	return nil
}

func TestParseAgreesWithEncodingJSON(t *testing.T) {
	cases := []string{
		`{}`, `[]`, `{"a":1}`, ` {"a" : [1, -2.5e3, 0, -0, 1E+2, true, false, null, "x"]} `,
		`"\u00e9\ud83d\ude00\n\t\\\"\/"`, `"\ud83d"`, `"\ude00x"`, `"\ud83d\u0041"`, `"\ud83d\ud83d"`,
		"\"bad \xff\xfe utf8\"", "\"tab\tinside\"", `01`, `-`, `1.`, `.5`, `1e`, `+1`, `[1,]`, `{"a":1,}`,
		`{"a"}`, `{a:1}`, `tru`, `nul`, `"\x"`, `"\u12"`, `[1 2]`, `{"a":1}x`, ``, `   `, `[`, `"abc`,
		`{"a":{"b":{"c":[[[]]]}}}`, `12345678901234567890123`, `-0.0e-0`, `{"a":1,"a":2}`,
		// Names a parser used again keeps, or must not: escaped, invalid UTF-8, a prefix of another.
		`{"a":1,"b":{"a":2,"ab":3}}`, `{"é":1,"\u00e9":2}`, `{"a\"":1,"a":2}`, "{\"\xff\":1,\"\xff\":2}", `{"":1,"a":{"":2}}`,
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte(`{}[],:"\ u0123456789abcdefEtrunlsx-+.` + "\xff\t\n")
	for range 20000 {
		b := make([]byte, rng.IntN(24))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	// Valid documents, and each with one byte changed.
	var gen func(depth int) any
	gen = func(depth int) any {
		switch k := rng.IntN(8); {
		case k == 0 && depth < 4:
			m := map[string]any{}
			for range rng.IntN(4) {
				m[string(rune('a'+rng.IntN(26)))+"\u00e9\"q"] = gen(depth + 1)
			}
			return m
		case k == 1 && depth < 4:
			a := make([]any, rng.IntN(4))
			for i := range a {
				a[i] = gen(depth + 1)
			}
			return a
		case k == 2:
			return rng.NormFloat64() * 1e6
		case k == 3:
			return rng.Int64() - rng.Int64()
		case k == 4:
			return "s\t\u2028<&>\U0001F600"
		case k == 5:
			return rng.IntN(2) == 0
		case k == 6:
			return nil
		}
		return "x"
	}
	for range 5000 {
		doc, _ := json.MarshalIndent(gen(0), "", " ")
		cases = append(cases, string(doc))
		if len(doc) > 0 {
			doc[rng.IntN(len(doc))] = alphabet[rng.IntN(len(alphabet))]
			cases = append(cases, string(doc))
		}
	}
	again := &parser{names: map[string]string{}, views: true} // as Format.Parse uses one: again, keeping names, viewing strings
	for _, c := range cases {
		want, wantErr := viaEncodingJSON([]byte(c))
		got, err := parse([]byte(c))
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: parse error %v, encoding/json error %v", c, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got.value(), want) {
			t.Fatalf("%q: parsed %#v, encoding/json %#v", c, got.value(), want)
		}
		for range 2 {
			got, err = again.parse([]byte(c))
			if (err != nil) != (wantErr != nil) || err == nil && !reflect.DeepEqual(got.value(), want) {
				t.Fatalf("%q: a parser used again made %#v, %v; encoding/json %#v, %v", c, got, err, want, wantErr)
			}
		}
	}
}
