package metrics

import (
	"reflect"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// recorder is a Registerer that keeps the description of every collector registered with it.
type recorder struct{ descs []string }

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 1)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		r.descs = append(r.descs, d.String())
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

func TestNewCreatesAndRegistersEveryCollectorOnce(t *testing.T) {
	rec := &recorder{}
	m := New(rec)
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).IsNil() {
			t.Errorf("New leaves Metrics.%s nil", v.Type().Field(i).Name)
		}
	}
	if len(rec.descs) != v.NumField() {
		t.Errorf("New registered %d collectors, Metrics has %d", len(rec.descs), v.NumField())
	}
	sort.Strings(rec.descs)
	for i := 1; i < len(rec.descs); i++ {
		if rec.descs[i] == rec.descs[i-1] {
			t.Errorf("registered twice: %s", rec.descs[i])
		}
	}
	if testing.Verbose() {
		for _, d := range rec.descs {
			t.Log(d)
		}
	}
}

func TestNewWithoutARegistryStillCreatesEveryCollector(t *testing.T) {
	m := New(nil)
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).IsNil() {
			t.Errorf("New(nil) leaves Metrics.%s nil", v.Type().Field(i).Name)
		}
	}
}
