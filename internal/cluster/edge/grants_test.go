package edge

import (
	"testing"

	"github.com/dflow-dev/dflow/graph"
)

// TestGrants: a consumer side's grant is shared out over the producer
// shares by their producer replicas, rounded down with the fractions kept,
// so that the credits of all shares never add up to more than the room
// granted; a word carries its sender, and a malformed one grants nothing.
func TestGrants(t *testing.T) {
	e := &graph.Edge{Capacity: 8, Queues: []graph.Queue{{Producers: []int{0, 1, 2}, Consumers: []int{0}}}}
	newQ := func(local int) *Queue {
		q := &Queue{edge: e, producers: e.Queues[0].Producers, local: make([]int, local), fetched: make(chan struct{})}
		q.pcond.L = &q.pmu
		return q
	}
	one, two := newQ(1), newQ(2) // a third and two thirds of the queue's producers
	for range 7 {
		one.granted(1)
		two.granted(1)
	}
	if one.credit+two.credit > 7 {
		t.Errorf("credits %d + %d for 7 granted", one.credit, two.credit)
	}
	if one.credit != 2 || two.credit != 4 {
		t.Errorf("credits %d and %d for 7 granted to a third and two thirds; want 2 and 4 (fractions kept)", one.credit, two.credit)
	}
	two.granted(2) // 4.67 + 1.33 = 6.0
	if two.credit != 6 {
		t.Errorf("credit %d after the fraction came whole, want 6", two.credit)
	}
	from, n, ok := parseGrant(grantWord("w2", 3))
	if !ok || from != "w2" || n != 3 {
		t.Errorf("parseGrant(grantWord(w2, 3)) = %q %d %v", from, n, ok)
	}
	for _, bad := range []string{"", "3", "x w2", "-1 w2", "0 w2"} {
		if _, _, ok := parseGrant([]byte(bad)); ok {
			t.Errorf("parseGrant(%q) granted", bad)
		}
	}
}
