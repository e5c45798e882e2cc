package report

import (
	"testing"
	"time"
)

// TestShareReplicaStarted: a replica that started since the previous
// snapshot (a rebalance's) has its share counted from its start, and the
// others' from the previous snapshot.
func TestShareReplicaStarted(t *testing.T) {
	prev := &Snapshot{Elapsed: time.Second, Stages: []StageSnapshot{{Name: "s", Replicas: []ReplicaSnapshot{{Busy: 500 * time.Millisecond}}}}}
	now := &Snapshot{Elapsed: 2 * time.Second, Stages: []StageSnapshot{{Name: "s", Replicas: []ReplicaSnapshot{
		{Busy: time.Second}, {Busy: 250 * time.Millisecond}}}}}
	u := now.Utilization(prev, 0)
	if len(u) != 2 || u[0] != 0.5 || u[1] != 0.25 {
		t.Errorf("utilization %v, want [0.5 0.25]", u)
	}
	if p := now.Sample(prev); len(p.Utilization["s"]) != 2 {
		t.Errorf("sample %+v", p)
	}
}
