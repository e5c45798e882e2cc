package engine

import (
	"sync"
	"time"
)

// The sampler's clock.
//
// While any Go timer is pending, the Go scheduler reads the system clock
// at every goroutine switch (to see whether the timer is due), and a
// replica moving small items switches every few items, so a pending
// timer adds a clock read to every few items, a share of a small item's
// cost that shows (docs/performance.md, "What limits each figure"). So where the system allows, the sampler sleeps on
// a kernel timer the netpoller watches (a timerfd on Linux), which the
// scheduler looks at only when it has nothing else to run; elsewhere it
// falls back to a time.Ticker.

// ticker wakes its one reader every period until stopped.
type ticker interface {
	// wait blocks until the next tick; false once the ticker is stopped.
	wait() bool
	// stop ends the ticker and releases a wait in progress; idempotent.
	stop()
}

// newTicker returns the cheapest ticker the system has.
func newTicker(period time.Duration) ticker {
	if t, err := newKernelTicker(period); err == nil {
		return t
	}
	return newGoTicker(period)
}

// goTicker is a ticker on a time.Ticker.
type goTicker struct {
	t    *time.Ticker
	quit chan struct{}
	once sync.Once
}

func newGoTicker(period time.Duration) *goTicker {
	return &goTicker{t: time.NewTicker(period), quit: make(chan struct{})}
}

func (g *goTicker) wait() bool {
	select {
	case <-g.t.C:
		return true
	case <-g.quit:
		return false
	}
}

func (g *goTicker) stop() {
	g.once.Do(func() {
		g.t.Stop()
		close(g.quit)
	})
}
