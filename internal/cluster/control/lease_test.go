package control

import (
	"testing"
	"time"
)

// TestLeaseWatch: silence past the lease is asked about before it counts,
// and time the judging process itself was paused does not count.
func TestLeaseWatch(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	now, heard := t0, t0
	probes, answer := 0, false
	w := LeaseWatch{Lease: 2 * time.Second,
		Clock: func() time.Time { return now },
		Heard: func() time.Time { return heard },
		Probe: func() bool { probes++; return answer }}
	step := func(d time.Duration) bool { now = now.Add(d); return w.Gone() }

	// Ticks on time, beats stopped: gone after the lease, once asked.
	for range 8 {
		if step(Beat) {
			t.Fatalf("gone at %v, within the lease", now.Sub(heard))
		}
	}
	if probes != 0 {
		t.Fatalf("%d probes within the lease", probes)
	}
	if !step(Beat) {
		t.Fatalf("not gone at %v of silence, the probe unanswered", now.Sub(heard))
	}
	if probes != 1 {
		t.Fatalf("%d probes, want 1", probes)
	}

	// The probe answered: not gone.
	answer = true
	if step(Beat) {
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
		if step(Beat) {
			t.Fatalf("gone %v after the pause, within the lease", 8*Beat)
		}
	}
	if probes != 0 || !step(Beat) {
		t.Fatalf("not gone a lease after the pause (%d probes)", probes)
	}

	// A late tick shorter than pauseAfter is no pause.
	heard = now
	if step(pauseAfter) || step(pauseAfter) || !step(pauseAfter) {
		t.Fatal("ticks late by pauseAfter or less were counted pauses")
	}
}
