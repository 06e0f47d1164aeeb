package protobuf

import "testing"

// BenchmarkInferAndEncode is the relay's steady state per event with auto_register: infer the
// payload's schema (the Serializer then finds its id cached) and encode the payload in it.
func BenchmarkInferAndEncode(b *testing.B) {
	payload := []byte(`{"id":"o-1","customer":{"name":"Ada","email":"ada@example.com"},"lines":[{"sku":"a","qty":2,"price":12.5},{"sku":"b","qty":1,"price":3}],"total":28,"paid":true,"note":null}`)
	f := New()
	b.ReportAllocs()
	for b.Loop() {
		s, err := f.Infer("Order", "shop", payload)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := f.Encode(s, payload); err != nil {
			b.Fatal(err)
		}
	}
}
