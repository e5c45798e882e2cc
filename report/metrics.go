package report

import (
	"slices"
	"time"

	"github.com/dflow-dev/dflow/graph"
)

// Metric is one replica's value of a node metric: a gauge's latest value
// and when it was set, or a counter's total.
type Metric struct {
	Value   float64   `json:"value"`
	Set     time.Time `json:"set,omitzero"` // a gauge's last Set (wall clock, to order hosts)
	Counter bool      `json:"counter,omitempty"`
}

// MergeMetrics forms a stage's node metrics from its replicas' (one map
// per replica; nil for a replica that published none), each by its rule
// in kind (graph.Kind.MetricMerge): the one place where replicas' metrics
// become the stage's, whether the replicas ran in one process or on
// several hosts. Only replicas that published a metric count in it.
// counters names the metrics published as counters.
func MergeMetrics(kind *graph.Kind, replicas []map[string]Metric) (values map[string]float64, counters map[string]bool) {
	type acc struct {
		sum, max float64
		merged   Metric // the replicas' readings by Metric.Merge: a counter's sum, a gauge's latest
		n        int
	}
	accs := map[string]*acc{}
	for _, ms := range replicas {
		for name, m := range ms {
			a := accs[name]
			if a == nil {
				a = &acc{max: m.Value, merged: m}
				accs[name] = a
			} else {
				a.merged = a.merged.Merge(m)
			}
			a.sum += m.Value
			a.max = max(a.max, m.Value)
			a.n++
		}
	}
	values = make(map[string]float64, len(accs))
	for name, a := range accs {
		counter := a.merged.Counter
		if counter {
			if counters == nil {
				counters = map[string]bool{}
			}
			counters[name] = true
		}
		switch kind.MetricMerge(name, counter) {
		case graph.MergeSum:
			values[name] = a.sum
		case graph.MergeMean:
			values[name] = a.sum / float64(a.n)
		case graph.MergeMax:
			values[name] = a.max
		default:
			values[name] = a.merged.Value
		}
	}
	return values, counters
}

// Latest merges what several shares saw of one replica (a lost worker's
// last snapshot and the share that took over), each metric by
// Metric.Merge: each gauge as set last, counters added.
func Latest(seen ...map[string]Metric) map[string]Metric {
	seen = slices.DeleteFunc(seen, func(m map[string]Metric) bool { return len(m) == 0 })
	if len(seen) <= 1 {
		if len(seen) == 0 {
			return nil
		}
		return seen[0]
	}
	out := map[string]Metric{}
	for _, ms := range seen {
		for name, m := range ms {
			if o, ok := out[name]; ok {
				m = o.Merge(m)
			}
			out[name] = m
		}
	}
	return out
}

// The split of a group member's steps into waiting for data and
// computing: node metrics, counters in seconds, that a member adds to as
// it takes its input in steps (the SDKs' steps, drafter_train's loop).
// DataWait is the member's wait for its items, Compute the time from
// having them to asking for the next; the SDKs' steps share the wait in
// the all-reduce that settles each step between the two, in the
// proportion of the group's waits for items to its compute. Summed over a
// stage's replicas, they say what share of each step its members waited
// for data (Stage.DataWaitShare).
const (
	DataWait = "data_wait_seconds"
	Compute  = "compute_seconds"
)

// DataWaitShare is the share of its members' steps that the stage spent
// waiting for data, DataWait over DataWait plus Compute (summed over the
// replicas), and whether the stage reported them.
func (st Stage) DataWaitShare() (float64, bool) {
	wait, ok1 := st.Metrics[DataWait]
	compute, ok2 := st.Metrics[Compute]
	if !ok1 || !ok2 || wait+compute <= 0 {
		return 0, false
	}
	return wait / (wait + compute), true
}
