package settle

import "testing"

// TestTakenSettledOnce: an input is handed to the ledger once, even where
// a node sends from another goroutine after asking for its next item (a
// publish derived from the input after it was finished): counted twice, its
// replica's open count went below nothing, and the replica was never
// recorded settled.
func TestTakenSettledOnce(t *testing.T) {
	t.Parallel()
	lg := &Ledger{wake: make(chan struct{}, 1)}
	tk := &Taken{id: "in-1", lg: lg}
	tk.Finish() // nothing under way: to the ledger
	tk.derive() // a late send
	tk.answered()
	if n := len(lg.finished); n != 1 {
		t.Errorf("the input went to the ledger %d times, want once", n)
	}
}
