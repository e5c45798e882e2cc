package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// fifo is a Transport of the tests' own: a bounded FIFO behind a mutex,
// not a Go channel, as a broker client would be. It counts what it
// carried.
type fifo struct {
	mu      sync.Mutex
	items   []any
	cap     int
	closed  bool
	changed chan struct{} // closed and replaced at every change: a broadcast
	carried int
}

func newFIFO(capacity int) *fifo { return &fifo{cap: capacity, changed: make(chan struct{})} }

// signal wakes every waiter; called with mu held.
func (f *fifo) signal() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fifo) Send(ctx context.Context, item any) error {
	for {
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			return errors.New("fifo: send after close")
		}
		if len(f.items) < f.cap {
			f.items = append(f.items, item)
			f.carried++
			f.signal()
			f.mu.Unlock()
			return nil
		}
		wait := f.changed
		f.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (f *fifo) Recv(ctx context.Context) (any, bool, error) {
	for {
		f.mu.Lock()
		if len(f.items) > 0 {
			item := f.items[0]
			f.items = f.items[1:]
			f.signal()
			f.mu.Unlock()
			return item, true, nil
		}
		if f.closed {
			f.mu.Unlock()
			return nil, false, nil
		}
		wait := f.changed
		f.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

func (f *fifo) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.signal()
}

func (f *fifo) Depth() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.items)
}

// fifos carries the named edges (every edge when none is named) on fifo
// transports of the edge's capacity, and remembers them.
type fifos struct {
	mu    sync.Mutex
	byKey map[string][]*fifo
	only  []string
}

func (fs *fifos) transport(e *graph.Edge, i int) Transport {
	if len(fs.only) > 0 && !strings.Contains(strings.Join(fs.only, ","), e.Name) {
		return nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.byKey == nil {
		fs.byKey = map[string][]*fifo{}
	}
	f := newFIFO(e.Capacity)
	fs.byKey[e.Name] = append(fs.byKey[e.Name], f)
	return f
}

func (fs *fifos) carried(edge string) int {
	n := 0
	for _, f := range fs.byKey[edge] {
		f.mu.Lock()
		n += f.carried
		f.mu.Unlock()
	}
	return n
}

// TestTransportCarriesEdges: edges carried by a transport deliver every
// item exactly once, end by the topology (no sentinel), and count as in
// process, for both policies; node code does not change.
func TestTransportCarriesEdges(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"round_robin", "shared"} {
		t.Run(policy, func(t *testing.T) {
			h := newHarness(t)
			var fs fifos
			rep, err := h.run(h.load(seedLike, "edge.hs.policy="+policy), Options{Transport: fs.transport})
			if err != nil || rep.Status != report.OK {
				t.Fatalf("status %s, err %v", rep.Status, err)
			}
			checkBalanced(t, rep)
			h.deliveredOnce("drafter", 500)
			for _, name := range []string{"tokens", "hs"} {
				if c := fs.carried(name); int64(c) != rep.Edges[name].Produced || c != 500 {
					t.Errorf("edge %s: the transport carried %d, produced %d", name, c, rep.Edges[name].Produced)
				}
			}
		})
	}
}

// TestTransportMixedFanIn: a port fed by one edge in process and one on a
// transport merges both, and ends when both have.
func TestTransportMixedFanIn(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	fs := fifos{only: []string{"b"}}
	g := h.load(`
stage "a" {
  node = "t"
  config {
    role  = "source"
    count = 300
  }
}
stage "b" {
  node = "t"
  replicas = 2
  config {
    role  = "source"
    count = 200
  }
}
stage "sink" {
  node = "t"
  config {
    role = "sink"
  }
}
edge "a" {
  from = a.out
  to   = sink.in
}
edge "b" {
  from     = b.out
  to       = sink.in
  capacity = 2
}`)
	rep, err := h.run(g, Options{Transport: fs.transport})
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s, err %v", rep.Status, err)
	}
	n := 0
	for _, c := range h.got.counts["sink"] {
		n += c
	}
	if n != 500 || rep.Stages["sink"].Replicas[0].ItemsIn != 500 {
		t.Errorf("sink got %d items, want 500", n)
	}
	if fs.carried("a") != 0 || fs.carried("b") != 200 {
		t.Errorf("carried a=%d b=%d", fs.carried("a"), fs.carried("b"))
	}
}

// TestTransportDepthAndAbort: monitoring sees what is in flight on a
// transport as the queue's depth, and an abort releases producers blocked
// on a full transport.
func TestTransportDepthAndAbort(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	funcKind(reg, "flood", false, true, func(ctx context.Context, r nodes.Replica) error {
		for i := 0; ; i++ {
			if err := r.Out("out").Send(ctx, i); err != nil {
				return err
			}
		}
	})
	funcKind(reg, "deaf", true, false, func(ctx context.Context, r nodes.Replica) error {
		<-ctx.Done() // never reads: the queues fill up
		return ctx.Err()
	})
	var fs fifos
	p, err := New(loadPair(t, reg, "flood", "deaf", 5, 3, graph.RoundRobin), Options{Registry: reg, Transport: fs.transport})
	if err != nil {
		t.Fatal(err)
	}
	capacity := p.r.g.Edges[0].Capacity
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var rep *report.Report
	go func() {
		defer close(done)
		rep, _ = p.Execute(ctx)
	}()
	// Each queue's transport fills to the capacity (the consumers' side
	// holds one more item, which the depth does not count: it stays
	// within the capacity).
	testutil.Eventually(t, 20*time.Second, func() bool {
		s := p.Snapshot()
		if len(s.Edges) == 0 {
			return false
		}
		for _, q := range s.Edges[0].Queues {
			if q.Depth != capacity {
				return false
			}
		}
		return true
	}, "every queue to show its transport full")
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the abort did not release the producers blocked on the transport")
	}
	if rep.Status != report.Aborted {
		t.Errorf("status %s: %s", rep.Status, rep.Error)
	}
}
