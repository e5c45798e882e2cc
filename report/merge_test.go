package report

import (
	"reflect"
	"testing"
	"time"
)

// TestShares: the one utilization formula: each time over the lifetime
// the three add up to, zero for no lifetime, the same whether read from a
// report's replica or a snapshot's.
func TestShares(t *testing.T) {
	if got := SharesOf(3, 1, 0); got != (Shares{0.75, 0.25, 0}) {
		t.Errorf("SharesOf(3, 1, 0) = %+v", got)
	}
	if got := SharesOf(0, 0, 0); got != (Shares{}) {
		t.Errorf("no lifetime: %+v", got)
	}
	if u := Utilization(1, 2, 1); u != 0.25 {
		t.Errorf("Utilization(1, 2, 1) = %v", u)
	}
	if u := (Stage{Replicas: []Replica{{Utilization: 0.5}, {Utilization: 1}}}).Utilization(); u != 0.75 || (Stage{}).Utilization() != 0 {
		t.Errorf("stage mean %v", u)
	}
	r := Replica{BusySeconds: 2, IdleSeconds: 1, BlockedSeconds: 1}
	s := ReplicaSnapshot{Busy: 2 * time.Second, Idle: time.Second, Blocked: time.Second}
	if r.Shares() != s.Shares() || r.Shares().Blocked != 0.25 {
		t.Errorf("replica %+v, snapshot %+v", r.Shares(), s.Shares())
	}
}

// TestReplicaPlus: what another share counted of a replica adds to its
// items and times; the utilization is that of the sums; the rest stays.
func TestReplicaPlus(t *testing.T) {
	lost := ReplicaSnapshot{ItemsIn: 10, ItemsOut: 9, Busy: 3 * time.Second, Idle: time.Second, Worker: "a"}
	now := ReplicaSnapshot{ItemsIn: 5, ItemsOut: 5, Busy: time.Second, Blocked: 3 * time.Second, Worker: "b", Done: true}
	got := now.Plus(lost)
	if got.ItemsIn != 15 || got.ItemsOut != 14 || got.Busy != 4*time.Second || got.Idle != time.Second ||
		got.Blocked != 3*time.Second || got.Worker != "b" || !got.Done {
		t.Errorf("snapshot: %+v", got)
	}
	r := now.Replica(2)
	if r.Index != 2 || r.Worker != "b" || r.BusySeconds != 1 || r.Utilization != 0.25 {
		t.Errorf("Replica: %+v", r)
	}
	r.Device = "cuda:1"
	r = r.Plus(lost)
	if r.ItemsIn != 15 || r.BusySeconds != 4 || r.IdleSeconds != 1 || r.Utilization != 0.5 || r.Device != "cuda:1" || r.Worker != "b" {
		t.Errorf("Replica.Plus: %+v", r)
	}
}

// TestEdgePlus: counts add, a queue's depth is the largest reading, its
// open producers those of either; Empty keeps only the wiring.
func TestEdgePlus(t *testing.T) {
	a := EdgeSnapshot{Name: "e", Produced: 5, Consumed: 3, Queues: []QueueSnapshot{{Depth: 2, Producers: []int{0, 1}, Open: []int{1}}}}
	b := EdgeSnapshot{Name: "e", Produced: 4, Consumed: 4, Queues: []QueueSnapshot{{Depth: 1, Open: []int{0, 1}}, {Depth: 9}}}
	zero := a.Empty()
	if zero.Produced != 0 || zero.Queues[0].Depth != 0 || zero.Queues[0].Open != nil || !reflect.DeepEqual(zero.Queues[0].Producers, []int{0, 1}) || a.Queues[0].Depth != 2 {
		t.Errorf("Empty: %+v (of %+v)", zero, a)
	}
	got := zero.Plus(a).Plus(b)
	if got.Produced != 9 || got.Consumed != 7 || len(got.Queues) != 1 || got.Queues[0].Depth != 2 || !reflect.DeepEqual(got.Queues[0].Open, []int{0, 1}) {
		t.Errorf("Plus: %+v", got)
	}
	if !reflect.DeepEqual(a.Queues[0].Open, []int{1}) {
		t.Errorf("Plus changed its operand: %+v", a)
	}
	re := Edge{Produced: 1, Queues: []Queue{{MaxDepth: 3, MeanDepth: 1}}}.Plus(Edge{Produced: 2, Consumed: 3, Queues: []Queue{{MaxDepth: 2, MeanDepth: 1.5}}})
	if re.Produced != 3 || re.Consumed != 3 || re.Queues[0].MaxDepth != 3 || re.Queues[0].MeanDepth != 1.5 {
		t.Errorf("Edge.Plus: %+v", re)
	}
}

// TestMetricMerge: the counter-versus-gauge rule: counters add, a gauge
// keeps the reading set last; MergeMetrics and Latest both follow it.
func TestMetricMerge(t *testing.T) {
	t0 := time.Unix(100, 0)
	c := Metric{Value: 2, Counter: true}.Merge(Metric{Value: 3, Counter: true})
	if c.Value != 5 || !c.Counter {
		t.Errorf("counter: %+v", c)
	}
	old, late := Metric{Value: 1, Set: t0}, Metric{Value: 7, Set: t0.Add(time.Second)}
	if g := old.Merge(late); g != late {
		t.Errorf("gauge, later second: %+v", g)
	}
	if g := late.Merge(old); g != late {
		t.Errorf("gauge, later first: %+v", g)
	}
	got := Latest(map[string]Metric{"n": {Value: 2, Counter: true}, "loss": old}, map[string]Metric{"n": {Value: 1, Counter: true}, "loss": late})
	if got["n"].Value != 3 || got["loss"] != late {
		t.Errorf("Latest: %+v", got)
	}
	values, counters := MergeMetrics(nil, []map[string]Metric{{"n": {Value: 2, Counter: true}, "loss": late}, {"n": {Value: 1, Counter: true}, "loss": old}})
	if values["n"] != 3 || values["loss"] != 7 || !counters["n"] || counters["loss"] {
		t.Errorf("MergeMetrics: %v %v", values, counters)
	}
}

func TestWorst(t *testing.T) {
	for _, c := range [][3]string{{OK, OK, OK}, {OK, Interrupted, Interrupted}, {Failed, Aborted, Failed}, {Aborted, Interrupted, Aborted}} {
		if got := Worst(c[0], c[1]); got != c[2] {
			t.Errorf("Worst(%s, %s) = %s, want %s", c[0], c[1], got, c[2])
		}
	}
}

// TestSnapshotReport: the report so far, as the live diagnosis reads it.
func TestSnapshotReport(t *testing.T) {
	s := &Snapshot{Elapsed: 2 * time.Second,
		Stages: []StageSnapshot{{Name: "w", Node: "work", Metrics: map[string]float64{"m": 1},
			Replicas: []ReplicaSnapshot{{ItemsIn: 4, Busy: time.Second, Idle: time.Second}}}},
		Edges: []EdgeSnapshot{{Name: "e", Policy: "shared", Capacity: 8, From: "s", To: "w", Produced: 5, Consumed: 4,
			Queues: []QueueSnapshot{{Depth: 1, Producers: []int{0}, Consumers: []int{0}}}}}}
	rep := s.Report(map[string][]float64{"e": {0.5}})
	r := rep.Stages["w"].Replicas[0]
	e := rep.Edges["e"]
	if rep.Status != "running" || rep.WallSeconds != 2 || r.Utilization != 0.5 || r.ItemsIn != 4 || rep.Stages["w"].Metrics["m"] != 1 ||
		e.Policy != "shared" || e.Produced != 5 || e.Queues[0].MeanDepth != 0.5 || e.From != "s" {
		t.Errorf("report: %+v", rep)
	}
	if got := s.Report(nil).Edges["e"].Queues[0].MeanDepth; got != 0 {
		t.Errorf("no depths: %v", got)
	}
}
