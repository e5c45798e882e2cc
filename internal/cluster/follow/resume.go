package follow

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/settle"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
)

// A source whose kind resumes (nodes.Spec.Resumes: the same items in the
// same order on every start) restarts on a live worker after a loss and
// takes up where it was: its position, how many of its items are settled,
// is kept in the run's position bucket (settle.Position, package settle's
// resume.go says how), and a restart drops what its node emits before it.

// positionKey is replica i of s's key in the position bucket.
func positionKey(s *graph.Stage, i int) string { return wire.Token(s.Name) + "." + strconv.Itoa(i) }

// resume wraps a source's node so that its replicas resume after a loss.
func (f *Replicas) resume(s *graph.Stage, n nodes.Node) nodes.Node {
	return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
		pos, err := f.env.Ledger.Resume(ctx, positionKey(s, r.Index()))
		if err != nil {
			return fmt.Errorf("stage %q replica %d: %w", s.Name, r.Index(), err)
		}
		from := pos.At()
		if from > 0 {
			fmt.Fprintf(f.env.Share.Log(), "dflow worker %s: stage %s replica %d resumes after its item %d\n", f.env.Share.Worker(), s.Name, r.Index(), from)
		}
		src := &resumed{clocked: clocked{r}, f: f, from: from, pos: pos}
		return n.Run(ctx, src)
	})
}

// resumed is a resuming source replica's runtime.
type resumed struct {
	clocked
	f    *Replicas
	from int64 // items emitted before this are dropped: stored before
	pos  *settle.Position

	mu   sync.Mutex
	sent int64 // items its node has emitted
}

func (s *resumed) Out(port string) nodes.Output {
	return &resumedOut{Output: s.Replica.Out(port), s: s}
}

type resumedOut struct {
	nodes.Output
	s *resumed
}

func (o *resumedOut) Send(ctx context.Context, item any) error {
	s := o.s
	s.mu.Lock()
	k := s.sent
	s.sent++
	s.mu.Unlock()
	if k < s.from {
		return nil // stored before the restart
	}
	h, ok := s.Replica.(engine.Hands)
	if !ok {
		return fmt.Errorf("stage %q replica %d resumes only in dflow's engine", s.Stage(), s.Index())
	}
	// What it sends derives from its place: a delivery of its own, in
	// hand while it is sent, settled once what was sent is stored.
	h.Hand(s.pos.Item(k))
	if err := o.Output.Send(ctx, item); err != nil {
		return err
	}
	h.Hand(nil)
	s.f.env.Share.AfterSend(s.Stage())
	return nil
}
