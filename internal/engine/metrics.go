package engine

import (
	"math"
	"sync"
	"sync/atomic"
)

// metrics holds one stage's node metrics. Nodes publish a few figures per
// step, not per item, so a lock-free map lookup plus an atomic is plenty.
type metrics struct {
	m sync.Map // name -> *metric
}

type metric struct {
	counter bool
	bits    atomic.Uint64 // float64 bits
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
	m.get(name, false).bits.Store(math.Float64bits(v))
}

// Add implements nodes.Metrics: a counter summed over replicas.
func (m *metrics) Add(name string, delta float64) {
	mt := m.get(name, true)
	for {
		old := mt.bits.Load()
		if mt.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+delta)) {
			return
		}
	}
}

// snapshot returns every metric's current value.
func (m *metrics) snapshot() map[string]float64 {
	out := map[string]float64{}
	m.m.Range(func(k, v any) bool {
		out[k.(string)] = math.Float64frombits(v.(*metric).bits.Load())
		return true
	})
	return out
}
