package host

import (
	"sync/atomic"

	"github.com/dflow-dev/dflow/plugins/proto"
)

// quiet is what a plugin replica's stream knows of whether the replica
// can move by itself, for the engine's deadlock detector
// (nodes.Quiescer; the argument is in internal/engine/deadlock.go's doc
// comment): the plugin's latest Waiting, the messages dflow has sent it,
// and the items dflow's side holds that the plugin or the engine has not
// yet seen.
type quiet struct {
	sent    atomic.Uint64 // messages dflow sent on the stream, Start included, counted before each goes
	seen    atomic.Uint64 // of those, the plugin's count in its latest Waiting
	waiting atomic.Bool   // the plugin's latest Waiting said its node waits
	feeding atomic.Int64  // feeders holding an item or end of input from a port, not yet on the stream
	outlets []*outlet     // set before the replica is watched
}

// said takes a Waiting from the plugin (nil: the node is done).
func (q *quiet) said(w *proto.Waiting) {
	if w == nil || !w.Waiting {
		q.waiting.Store(false)
		return
	}
	q.seen.Store(w.Seen)
	q.waiting.Store(true)
}

// quiescent: the plugin's node waits for dflow, has everything dflow sent
// it, no feeder holds what it took from its port, and each outlet is in a
// Send (its wait the detector's to read; the items behind it in its
// buffer wait for that Send) or has nothing to hand on. An outlet sets
// sending before its item leaves pending, so that one taking an item from
// its buffer is never seen with neither.
func (q *quiet) quiescent() bool {
	if !q.waiting.Load() || q.seen.Load() != q.sent.Load() || q.feeding.Load() != 0 {
		return false
	}
	for _, p := range q.outlets {
		if !p.sending.Load() && p.pending.Load() != 0 {
			return false
		}
	}
	return true
}

// countedStream counts the messages dflow sends on a replica's stream.
type countedStream struct {
	proto.Node_RunClient
	q *quiet
}

func (s countedStream) Send(m *proto.Message) error {
	s.q.sent.Add(1) // before: the plugin may answer it at once
	return s.Node_RunClient.Send(m)
}

// watch records the running replica i's state (nil once it is done).
func (n *remoteNode) watch(i int, q *quiet) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if q == nil {
		delete(n.quiet, i)
	} else {
		n.quiet[i] = q
	}
}

// Quiescent implements nodes.Quiescer: true while replica i's plugin
// says its node waits, with nothing from dflow unseen and nothing held in
// between (see quiet). A plugin that does not say Waiting is never
// quiescent.
func (n *remoteNode) Quiescent(i int) bool {
	n.mu.Lock()
	q := n.quiet[i]
	n.mu.Unlock()
	return q != nil && q.quiescent()
}
