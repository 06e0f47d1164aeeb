package schemaregistry

import (
	"strconv"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/sr"
)

// cache is a bounded map. When full, a new entry evicts an arbitrary one: entries are immutable
// facts (an id, a version) that cost one request to learn again, and a cache this full means
// payloads with ever new shapes, where no eviction order would help much.
type cache[K comparable, V any] struct {
	mu  sync.Mutex
	max int
	m   map[K]V
}

func newCache[K comparable, V any](max int) *cache[K, V] {
	return &cache[K, V]{max: max, m: make(map[K]V)}
}

func (c *cache[K, V]) get(k K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *cache[K, V]) put(k K, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		for old := range c.m {
			delete(c.m, old)
			break
		}
	}
	c.m[k] = v
}

func (c *cache[K, V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// registerKey identifies a schema under a subject: its type, its text and its references, exactly
// (the registry's own normalisation may call two texts one schema; then both keys hold its id).
func registerKey(subject string, s sr.Schema) string {
	var b strings.Builder
	b.WriteString(subject)
	b.WriteByte(0)
	b.WriteString(s.Type.String())
	b.WriteByte(0)
	b.WriteString(s.Schema)
	for _, r := range s.References {
		b.WriteByte(0)
		b.WriteString(r.Name)
		b.WriteByte(1)
		b.WriteString(r.Subject)
		b.WriteByte(1)
		b.WriteString(strconv.Itoa(r.Version))
	}
	return b.String()
}

func versionKey(subject string, version int) string {
	return subject + "\x00" + strconv.Itoa(version)
}
