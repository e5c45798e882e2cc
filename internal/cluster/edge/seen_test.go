package edge

import (
	"strconv"
	"testing"
	"time"
)

// TestSeenIDs: an id handed on is seen until two windows have begun
// after it, and no other is, among many.
func TestSeenIDs(t *testing.T) {
	s := seenIDs{window: time.Hour}
	for i := range 100000 {
		s.add("in-" + strconv.Itoa(2*i))
	}
	for i := range 100000 {
		if !s.has("in-" + strconv.Itoa(2*i)) {
			t.Fatalf("in-%d handed on, not seen", 2*i)
		}
		if s.has("in-" + strconv.Itoa(2*i+1)) {
			t.Fatalf("in-%d seen, never handed on", 2*i+1)
		}
	}
	pass := func() { s.since = s.since.Add(-2 * s.window) } // a window goes by
	pass()
	s.add("later") // a new generation begins
	if !s.has("in-0") || !s.has("later") {
		t.Errorf("one window later: in-0 seen %v, later seen %v; want both", s.has("in-0"), s.has("later"))
	}
	pass()
	s.add("later still")
	if s.has("in-0") || !s.has("later") {
		t.Errorf("two windows later: in-0 seen %v (want false), later seen %v (want true)", s.has("in-0"), s.has("later"))
	}
}
