package wire

import (
	"context"
	"errors"
	"sync/atomic"
)

// Window is the credit accounting of the receiving end of one port: a
// plugin's input port, or, on dflow's side, a plugin's output port. The
// receiver holds at most Items items that it has been sent and not yet
// handed on, and, once it has seen an item's size, grants credit for more
// only while what it holds and what it has granted (counted at the size of
// the last item) fit in Bytes. An item larger than Bytes passes alone.
//
// The receiving goroutine calls Arrived, the goroutine that hands items on
// calls Taken, and whichever sends credit calls Grant: each may be a
// different goroutine.
type Window struct {
	Items int32
	Bytes int64

	owed atomic.Int32 // credit taken and not yet granted again
	lent atomic.Int32 // credit granted and not yet used by the sender
	held atomic.Int64 // payload bytes of the items arrived and not yet taken
	last atomic.Int64 // payload bytes of the last item arrived
}

// Open starts the window with first items of credit, the rest of Items
// owed; it returns first, the credit to send.
func (w *Window) Open(first int32) int32 {
	first = min(first, w.Items)
	w.lent.Store(first)
	w.owed.Store(w.Items - first)
	return first
}

// Arrived records an item of size payload bytes come in; it reports
// whether the item was within the credit granted.
func (w *Window) Arrived(size int64) bool {
	size = max(size, 1)
	w.last.Store(size)
	w.held.Add(size)
	return w.lent.Add(-1) >= 0
}

// Taken records an item of size payload bytes handed on: credit for one
// more is owed.
func (w *Window) Taken(size int64) {
	w.held.Add(-max(size, 1))
	w.owed.Add(1)
}

// Lend counts one item of credit granted on demand (a port whose node
// asks for its items one at a time: Asked), beside what Open and Grant
// lend.
func (w *Window) Lend() { w.lent.Add(1) }

// Lent is the credit granted and not yet used by the sender.
func (w *Window) Lent() int32 { return w.lent.Load() }

// TakenAsked records an item of size payload bytes handed on from a port
// whose credit goes on demand: nothing is owed (the next ask lends it).
func (w *Window) TakenAsked(size int64) { w.held.Add(-max(size, 1)) }

// Owed is the credit taken and not yet granted again.
func (w *Window) Owed() int32 { return w.owed.Load() }

// Grant returns the credit to send now, as much of what is owed as the
// byte budget allows, and counts it as lent; 0 means send nothing (it is
// granted as the items held are taken).
func (w *Window) Grant() int32 {
	n := w.owed.Load()
	if size := w.last.Load(); size > 0 {
		held, lent := w.held.Load(), w.lent.Load()
		room := int32(min((w.Bytes-held)/size, int64(w.Items))) - lent
		if held == 0 && lent == 0 {
			room = max(room, 1) // an item larger than the budget passes alone
		}
		n = min(n, room)
	}
	if n <= 0 {
		return 0
	}
	w.owed.Add(-n)
	w.lent.Add(n)
	return n
}

// Credit is the sending end of a port's credit (or of a pool of ports'):
// what the receiver has granted and the sender not used yet. Granting
// never blocks, however the receiver grants; any number of goroutines may
// wait for it.
type Credit struct {
	n    atomic.Int32
	more chan struct{} // a grant since a waiter last looked
}

// NewCredit returns credit of none.
func NewCredit() *Credit { return &Credit{more: make(chan struct{}, 1)} }

// Grant adds n.
func (c *Credit) Grant(n int32) {
	c.n.Add(n)
	c.signal()
}

func (c *Credit) signal() {
	select {
	case c.more <- struct{}{}:
	default:
	}
}

// TakeAll takes all there is, possibly none.
func (c *Credit) TakeAll() int32 { return c.n.Swap(0) }

// More is signalled after a grant: wait on it when TakeAll gave none.
func (c *Credit) More() <-chan struct{} { return c.more }

// Available is the credit granted and not taken yet.
func (c *Credit) Available() int32 { return c.n.Load() }

// TryTake takes one if there is one, without waiting.
func (c *Credit) TryTake() bool {
	for {
		n := c.n.Load()
		if n <= 0 {
			return false
		}
		if c.n.CompareAndSwap(n, n-1) {
			if n > 1 {
				c.signal()
			}
			return true
		}
	}
}

// Take takes one, waiting for a grant while there is none; it fails when
// ctx is done or gone is closed.
func (c *Credit) Take(ctx context.Context, gone <-chan struct{}) error {
	for {
		if n := c.n.Load(); n > 0 {
			if c.n.CompareAndSwap(n, n-1) {
				if n > 1 {
					c.signal() // more left: the next waiter need not wait
				}
				return nil
			}
			continue
		}
		select {
		case <-c.more:
		case <-gone:
			return ErrStreamGone
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ErrStreamGone is what Take returns once gone is closed.
var ErrStreamGone = errors.New("sdk: the stream to dflow is gone")
