package engine

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/report"
)

// metrics holds one replica's node metrics; the stage's figures merge
// its replicas' by each metric's rule (report.MergeMetrics). Nodes publish
// a few figures per step, not per item, so a lock-free map lookup plus an
// atomic or two is plenty.
type metrics struct {
	m sync.Map // name -> *metric
}

type metric struct {
	counter bool
	bits    atomic.Uint64 // float64 bits
	set     atomic.Int64  // a gauge's last Set, Unix nanoseconds
}

func newMetrics() *metrics { return &metrics{} }

func (m *metrics) get(name string, counter bool) *metric {
	if v, ok := m.m.Load(name); ok {
		return v.(*metric)
	}
	v, _ := m.m.LoadOrStore(name, &metric{counter: counter})
	return v.(*metric)
}

// Set implements nodes.Metrics: a gauge, the latest value wins.
func (m *metrics) Set(name string, v float64) {
	mt := m.get(name, false)
	mt.bits.Store(math.Float64bits(v))
	mt.set.Store(time.Now().UnixNano())
}

// Add implements nodes.Metrics: a counter, summed over replicas.
func (m *metrics) Add(name string, delta float64) {
	mt := m.get(name, true)
	for {
		old := mt.bits.Load()
		if mt.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+delta)) {
			return
		}
	}
}

// read returns every metric's current value; nil when there is none.
func (m *metrics) read() map[string]report.Metric {
	var out map[string]report.Metric
	m.m.Range(func(k, v any) bool {
		mt := v.(*metric)
		if out == nil {
			out = map[string]report.Metric{}
		}
		r := report.Metric{Value: math.Float64frombits(mt.bits.Load()), Counter: mt.counter}
		if ns := mt.set.Load(); ns != 0 {
			r.Set = time.Unix(0, ns)
		}
		out[k.(string)] = r
		return true
	})
	return out
}

// merged is the stage's node metrics: its replicas' merged.
func (s *stage) merged() (map[string]float64, map[string]bool) {
	reps := make([]map[string]report.Metric, len(s.replicas))
	for i, rp := range s.replicas {
		reps[i] = rp.metrics.read()
	}
	return report.MergeMetrics(s.kind, reps)
}
