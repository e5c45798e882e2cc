package cluster

import (
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
)

// TestLeaseWatch: silence past the lease is asked about before it counts,
// and time the judging process itself was paused does not count.
func TestLeaseWatch(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	now, heard := t0, t0
	probes, answer := 0, false
	w := leaseWatch{lease: 2 * time.Second,
		clock: func() time.Time { return now },
		heard: func() time.Time { return heard },
		probe: func() bool { probes++; return answer }}
	step := func(d time.Duration) bool { now = now.Add(d); return w.gone() }

	// Ticks on time, beats stopped: gone after the lease, once asked.
	for range 8 {
		if step(hbEvery) {
			t.Fatalf("gone at %v, within the lease", now.Sub(heard))
		}
	}
	if probes != 0 {
		t.Fatalf("%d probes within the lease", probes)
	}
	if !step(hbEvery) {
		t.Fatalf("not gone at %v of silence, the probe unanswered", now.Sub(heard))
	}
	if probes != 1 {
		t.Fatalf("%d probes, want 1", probes)
	}

	// The probe answered: not gone.
	answer = true
	if step(hbEvery) {
		t.Fatal("gone, though the probe was answered")
	}

	// The process paused for 10s: the beats it has not read yet are not
	// missed, however long the pause; a lease after it, they are.
	answer, probes = false, 0
	heard = now
	if step(10 * time.Second) {
		t.Fatal("gone on waking from a pause")
	}
	for range 8 {
		if step(hbEvery) {
			t.Fatalf("gone %v after the pause, within the lease", 8*hbEvery)
		}
	}
	if probes != 0 || !step(hbEvery) {
		t.Fatalf("not gone a lease after the pause (%d probes)", probes)
	}

	// A late tick shorter than pauseAfter is no pause.
	heard = now
	if step(pauseAfter) || step(pauseAfter) || !step(pauseAfter) {
		t.Fatal("ticks late by pauseAfter or less were counted pauses")
	}
}

// TestGrants: a consumer side's grant is shared out over the producer
// shares by their producer replicas, rounded down with the fractions kept,
// so that the credits of all shares never add up to more than the room
// granted; a word carries its sender, and a malformed one grants nothing.
func TestGrants(t *testing.T) {
	e := &graph.Edge{Capacity: 8, Queues: []graph.Queue{{Producers: []int{0, 1, 2}, Consumers: []int{0}}}}
	newQ := func(local int) *jsQueue {
		q := &jsQueue{edge: e, producers: e.Queues[0].Producers, local: make([]int, local), fetched: make(chan struct{})}
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
