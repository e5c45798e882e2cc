package sdk

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/plugins/proto"
)

// Waiting (Start.waiting): the plugin tells dflow when its node is
// blocked in exactly one SDK call with nothing it can do by itself, so
// that dflow's deadlock detector can judge the stage (docs/runtime.md,
// "Deadlock"). A call that blocks registers a waiter with the condition
// that keeps it blocked; sendItems, which puts everything the node sends
// on the stream in order, says Waiting{seen} once that is all on the
// stream, seen being how many of dflow's messages had been received when
// it found the call still blocked. The receiver counts a message only
// after applying it (an item in its port, an end of input, a grant of
// credit), and the count is read before the condition: so if the
// condition held, nothing counted in seen can release the call, and
// whatever can has not been counted, which dflow sees as its own count
// differing from seen. Only blocking calls register: an item that finds
// its item or its credit waiting costs nothing more.
type waits struct {
	watch    bool          // dflow takes Waiting (and the plugin is not Concurrent)
	after    time.Duration // Options.WaitingAfter
	recvd    atomic.Uint64 // dflow's messages received and applied, Start included
	nblocked atomic.Int32  // len(waiters)
	mu       sync.Mutex
	waiters  []*waiter // the node's calls in progress that block
	// the last Waiting sent (sendItems' own)
	saidWaiting bool
	saidSeen    uint64
	timer       atomic.Bool // a look again at a blocked call is scheduled
}

type waiter struct {
	blocked func() bool // the call is still blocked
	since   time.Time   // when it began to block
}

func (ws *waits) init(watch bool, after time.Duration) {
	ws.watch, ws.after = watch, after
	ws.recvd.Store(1) // Start
}

// received1 counts one message from dflow applied, and has sendItems
// look again at a blocked call (its seen is now old).
func (s *session) received1() {
	s.recvd.Add(1)
	if s.watch && s.nblocked.Load() > 0 {
		s.lookAgain()
	}
}

// block registers a call that is about to block; the returned func
// unregisters it once it no longer waits.
func (s *session) block(blocked func() bool) func() {
	if !s.watch {
		return func() {}
	}
	w := &waiter{blocked: blocked, since: time.Now()}
	s.waits.mu.Lock()
	s.waiters = append(s.waiters, w)
	s.nblocked.Store(int32(len(s.waiters)))
	s.waits.mu.Unlock()
	s.lookAgain()
	return func() {
		s.waits.mu.Lock()
		s.waiters = slices.DeleteFunc(s.waiters, func(o *waiter) bool { return o == w })
		s.nblocked.Store(int32(len(s.waiters)))
		s.waits.mu.Unlock()
		s.lookAgain()
	}
}

// sayWaiting sends Waiting when the node's state has changed since the
// last one sent; called by sendItems with everything before on the stream.
func (s *session) sayWaiting() error {
	if !s.watch {
		return nil
	}
	seen := s.recvd.Load() // before the condition: see waits
	s.waits.mu.Lock()
	waiting := len(s.waiters) == 1 && s.waiters[0].blocked() && len(s.outq) == 0
	var since time.Time
	if waiting {
		since = s.waiters[0].since
	}
	s.waits.mu.Unlock()
	if !waiting {
		seen = 0
	}
	if waiting && !s.saidWaiting {
		if wait := s.after - time.Since(since); wait > 0 {
			// Not yet: look again once the call has been blocked long
			// enough (a call that ends before then says nothing). The
			// timer only signals look, buffered: it may fire after the
			// session has ended.
			if !s.timer.Swap(true) {
				time.AfterFunc(wait, func() { s.timer.Store(false); s.lookAgain() })
			}
			return nil
		}
	}
	if waiting == s.saidWaiting && seen == s.saidSeen {
		return nil
	}
	s.saidWaiting, s.saidSeen = waiting, seen
	return s.send(&proto.Message{Msg: &proto.Message_Waiting{Waiting: &proto.Waiting{Waiting: waiting, Seen: seen}}})
}
