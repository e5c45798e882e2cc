package wire

import (
	"context"
	"errors"
	"testing"
)

// TestWindow: credit within the item count, then within the byte budget
// at the last item's size, and an item larger than the budget alone.
func TestWindow(t *testing.T) {
	t.Parallel()
	w := Window{Items: 8, Bytes: 100}
	if n := w.Open(3); n != 3 {
		t.Fatalf("Open(3) = %d", n)
	}
	if n := w.Grant(); n != 5 {
		t.Fatalf("before any item: Grant = %d, want the 5 owed", n)
	}
	// 8 lent. Items of 30 bytes arrive: only 3 fit in 100 bytes.
	for range 8 {
		w.Arrived(30)
	}
	for range 8 {
		w.Taken(30)
	}
	if n := w.Grant(); n != 3 {
		t.Fatalf("items of 30 B in 100 B: Grant = %d, want 3", n)
	}
	if n := w.Grant(); n != 0 {
		t.Fatalf("nothing more fits: Grant = %d", n)
	}
	// The 3 arrive, held: nothing more fits until they are taken.
	for range 3 {
		w.Arrived(30)
	}
	if n := w.Grant(); n != 0 {
		t.Fatalf("90 B held: Grant = %d", n)
	}
	w.Taken(30)
	if n := w.Grant(); n != 1 {
		t.Fatalf("60 B held: Grant = %d, want 1", n)
	}
	// An item larger than the budget passes alone once nothing is held.
	w.Arrived(500)
	w.Taken(30)
	w.Taken(30)
	if n := w.Grant(); n != 0 {
		t.Fatalf("500 B held: Grant = %d", n)
	}
	w.Taken(500)
	if n := w.Grant(); n != 1 {
		t.Fatalf("nothing held, last item 500 B: Grant = %d, want 1", n)
	}
}

// TestCreditTake: Take takes granted credit, takes a later grant, and
// fails when the stream is gone or the context is done.
func TestCreditTake(t *testing.T) {
	t.Parallel()
	c := NewCredit()
	gone := make(chan struct{})
	c.Grant(2)
	for range 2 {
		if err := c.Take(context.Background(), gone); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan error, 1)
	go func() { got <- c.Take(context.Background(), gone) }()
	c.Grant(1) // before or after the wait began: either way it takes it
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	go func() { got <- c.Take(context.Background(), gone) }()
	close(gone)
	if err := <-got; !errors.Is(err, ErrStreamGone) {
		t.Fatalf("stream gone: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Take(ctx, make(chan struct{})); !errors.Is(err, context.Canceled) {
		t.Fatalf("context done: %v", err)
	}
}
