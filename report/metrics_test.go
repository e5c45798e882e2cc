package report

import (
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
)

// TestMergeMetrics: each metric merged by its declared rule, over the
// replicas that published it only; undeclared gauges by the latest set,
// counters added.
func TestMergeMetrics(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	kind := &graph.Kind{Metrics: []graph.Metric{
		{Name: "loss", Merge: graph.MergeMean},
		{Name: "step", Merge: graph.MergeMax},
		{Name: "tau", Merge: graph.MergeLast},
	}}
	reps := []map[string]Metric{
		{"loss": {Value: 2, Set: at(1)}, "step": {Value: 20, Set: at(1)}, "tau": {Value: 1.0, Set: at(1)}, "items": {Value: 3, Counter: true}},
		{"loss": {Value: 4, Set: at(2)}, "step": {Value: 21, Set: at(2)}, "gauge": {Value: 7, Set: at(3)}, "items": {Value: 4, Counter: true}},
		nil, // published nothing: counts in no metric
		{"tau": {Value: 1.5, Set: at(9)}, "gauge": {Value: 5, Set: at(2)}},
	}
	values, counters := MergeMetrics(kind, reps)
	want := map[string]float64{"loss": 3, "step": 21, "tau": 1.5, "gauge": 7, "items": 7}
	for k, v := range want {
		if values[k] != v {
			t.Errorf("%s = %v, want %v", k, values[k], v)
		}
	}
	if len(values) != len(want) || len(counters) != 1 || !counters["items"] {
		t.Errorf("values %v, counters %v", values, counters)
	}
	// One replica seen by a lost share and then by the share that took
	// over: gauges as set last, counters added.
	got := Latest(map[string]Metric{"loss": {Value: 1, Set: at(5)}, "n": {Value: 2, Counter: true}},
		map[string]Metric{"loss": {Value: 9, Set: at(4)}, "n": {Value: 3, Counter: true}}, nil)
	if got["loss"].Value != 1 || got["n"].Value != 5 {
		t.Errorf("Latest: %v", got)
	}
}
