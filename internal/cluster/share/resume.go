package share

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go/jetstream"
)

// Sources that resume.
//
// A source whose kind resumes (nodes.Spec.Resumes: the same items in the
// same order on every start) restarts on a live worker after a loss, as a
// stateless stage does, and takes up where it was:
//
//   - its k-th item's id follows from the replica and k (an origin, as an
//     item a stateless replica sends), so one it sends again is a
//     duplicate its edge's stream drops;
//   - its position is how many of its items are settled, every one before
//     stored (and, for a large item, its bytes released by a consumer):
//     kept per replica in the run's position bucket after each settle;
//   - a restarted replica reads its position and drops what its node
//     emits before it (those were stored); what it emits after is sent,
//     and what of it had been stored already is dropped as a duplicate.
//     The position lags the settles by at most a batch, far within the
//     duplicate window.

// sourcePos is a source replica's position in this share: every item
// before next is settled.
type sourcePos struct {
	key  string // its key in the position bucket
	mu   sync.Mutex
	next int64
	done map[int64]*taken // settled past next
}

// settled notes item t (its t.k-th) settled, and returns the items the
// position passed with it (none where it did not move).
func (p *sourcePos) settled(t *taken) []*taken {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.k != p.next {
		if t.k > p.next {
			p.done[t.k] = t
		}
		return nil
	}
	passed := []*taken{t}
	for p.next++; p.done[p.next] != nil; p.next++ {
		passed = append(passed, p.done[p.next])
		delete(p.done, p.next)
	}
	return passed
}

func (p *sourcePos) at() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

func positionKey(s *graph.Stage, i int) string { return wire.Token(s.Name) + "." + strconv.Itoa(i) }

// sourceItemID is the id of item k of the resuming source replica whose
// position key is key.
func sourceItemID(key string, k int64) string { return "s" + key + "." + strconv.FormatInt(k, 10) }

// record writes the positions that moved.
func (lg *ledger) record(moved []*sourcePos) error {
	seen := map[*sourcePos]bool{}
	for _, p := range moved {
		if seen[p] {
			continue
		}
		seen[p] = true
		ctx, cancel := context.WithTimeout(lg.l.stopCtx, 5*time.Second)
		_, err := lg.l.positions.Put(ctx, p.key, []byte(strconv.FormatInt(p.at(), 10)))
		cancel()
		if err != nil && lg.l.stopCtx.Err() == nil {
			return fmt.Errorf("recording source position %s on worker %s: %w", p.key, lg.l.worker, err)
		}
	}
	return nil
}

// resume wraps a source's node so that its replicas resume after a loss.
func (l *links) resume(s *graph.Stage, n nodes.Node) nodes.Node {
	return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
		key := positionKey(s, r.Index())
		from := int64(0)
		if e, err := l.positions.Get(ctx, key); err == nil {
			if from, err = strconv.ParseInt(string(e.Value()), 10, 64); err != nil {
				return fmt.Errorf("stage %q replica %d: position %q: %w", s.Name, r.Index(), e.Value(), err)
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("stage %q replica %d: reading where it was: %w", s.Name, r.Index(), err)
		}
		if from > 0 {
			fmt.Fprintf(l.log(), "dflow worker %s: stage %s replica %d resumes after its item %d\n", l.worker, s.Name, r.Index(), from)
		}
		src := &resumed{clocked: clocked{r}, l: l, from: from,
			pos: &sourcePos{key: key, next: from, done: map[int64]*taken{}}}
		return n.Run(ctx, src)
	})
}

// resumed is a resuming source replica's runtime.
type resumed struct {
	clocked
	l    *links
	from int64 // items emitted before this are dropped: stored before
	pos  *sourcePos

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
	h.Hand(&taken{pos: s.pos, k: k, lg: s.l.ledger}) // its id from its place (ident)
	if err := o.Output.Send(ctx, item); err != nil {
		return err
	}
	h.Hand(nil)
	if f := s.l.afterSend; f != nil {
		f(s.Stage())
	}
	return nil
}
