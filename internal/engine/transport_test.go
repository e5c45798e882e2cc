package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// carried, hands every item with a receipt and counts the receipts
// settled, and records the origins of what it was sent.
type fifo struct {
	mu      sync.Mutex
	items   []any
	cap     int
	closed  bool
	changed chan struct{} // closed and replaced at every change: a broadcast
	carried int
	settled int      // receipts Done
	twice   int      // receipts Done more than once
	origins []Origin // of every Send, in order
}

// fifoReceipt is the receipt of one item a fifo handed over.
type fifoReceipt struct {
	f    *fifo
	item any
	done bool
}

func (r *fifoReceipt) Done() {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if r.done {
		r.f.twice++
	}
	r.done = true
	r.f.settled++
}

func newFIFO(capacity int) *fifo { return &fifo{cap: capacity, changed: make(chan struct{})} }

// signal wakes every waiter; called with mu held.
func (f *fifo) signal() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fifo) Send(ctx context.Context, item any, from Origin) error {
	for {
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			return errors.New("fifo: send after close")
		}
		if len(f.items) < f.cap {
			f.items = append(f.items, item)
			f.origins = append(f.origins, from)
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

func (f *fifo) Recv(ctx context.Context) (Delivery, bool, error) {
	for {
		f.mu.Lock()
		if len(f.items) > 0 {
			item := f.items[0]
			f.items = f.items[1:]
			f.signal()
			f.mu.Unlock()
			return Delivery{Item: item, Receipt: &fifoReceipt{f: f, item: item}}, true, nil
		}
		if f.closed {
			f.mu.Unlock()
			return Delivery{}, false, nil
		}
		wait := f.changed
		f.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return Delivery{}, false, ctx.Err()
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

// settled is how many receipts of the edge's queues were settled, and how
// many of those more than once.
func (fs *fifos) settled(edge string) (n, twice int) {
	for _, f := range fs.byKey[edge] {
		f.mu.Lock()
		n += f.settled
		twice += f.twice
		f.mu.Unlock()
	}
	return n, twice
}

// origins are the origins of every item sent on the edge's queues.
func (fs *fifos) origins(edge string) []Origin {
	var out []Origin
	for _, f := range fs.byKey[edge] {
		f.mu.Lock()
		out = append(out, f.origins...)
		f.mu.Unlock()
	}
	return out
}

// TestDeliveryInHand: a delivery is the unit, whatever the item's Go
// type. Items of a value type ([]byte, which no map can key and no pointer
// can follow) go through a stage on transports at both ends: each one the
// replica receives is its delivery in hand until it asks for the next (its
// receipt is settled then) or returns; what it sends
// meanwhile derives from that delivery, counted from 0; and a replica that
// fails keeps its last delivery unsettled.
func TestDeliveryInHand(t *testing.T) {
	t.Parallel()
	const n = 40
	reg := nodes.NewRegistry()
	funcKind(reg, "src", false, true, func(ctx context.Context, r nodes.Replica) error {
		for i := range n {
			if err := r.Out("out").Send(ctx, []byte{byte(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	var mu sync.Mutex
	var inHandWhileSending []Receipt // what Delivered said before each pair of sends
	var fs fifos
	funcKind(reg, "twice", true, true, func(ctx context.Context, r nodes.Replica) error {
		h := r.(Hands)
		for {
			item, err := r.In("in").Recv(ctx)
			if err != nil {
				return nil
			}
			b := item.([]byte)
			mu.Lock()
			inHandWhileSending = append(inHandWhileSending, h.Delivered())
			mu.Unlock()
			for range 2 {
				if err := r.Out("out").Send(ctx, append([]byte(nil), b...)); err != nil {
					return err
				}
			}
		}
	})
	funcKind(reg, "sink", true, false, func(ctx context.Context, r nodes.Replica) error {
		for {
			if _, err := r.In("in").Recv(ctx); err != nil {
				return nil
			}
		}
	})
	g, diags := (&graph.Loader{Catalog: reg}).Load("chain.hcl", []byte(`
stage "src" {
  node = "src"
}
stage "mid" {
  node     = "twice"
  replicas = 2
}
stage "end" {
  node = "sink"
}
edge "a" {
  from   = src.out
  to     = mid.in
  policy = "shared"
}
edge "b" {
  from   = mid.out
  to     = end.in
  policy = "shared"
}`))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	p, err := New(g, Options{Registry: reg, Transport: fs.transport})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.Execute(context.Background())
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s, err %v", rep.Status, err)
	}
	if settled, twice := fs.settled("a"); settled != n || twice != 0 {
		t.Errorf("edge a: %d receipts settled (%d twice), want %d once each", settled, twice, n)
	}
	if settled, twice := fs.settled("b"); settled != 2*n || twice != 0 {
		t.Errorf("edge b: %d receipts settled (%d twice), want %d once each", settled, twice, 2*n)
	}
	// What mid sent derives from its delivery in hand, 0 then 1.
	origins := fs.origins("b")
	if len(origins) != 2*n {
		t.Fatalf("%d origins on b, want %d", len(origins), 2*n)
	}
	count := map[Receipt][]int{}
	for _, o := range origins {
		if o.Receipt == nil {
			t.Fatalf("an item of mid's derives from no delivery: %+v", o)
		}
		count[o.Receipt] = append(count[o.Receipt], o.Sent)
	}
	if len(count) != n {
		t.Errorf("mid's sends derive from %d deliveries, want %d", len(count), n)
	}
	for rc, sent := range count {
		if !slices.Equal(sent, []int{0, 1}) {
			t.Errorf("the sends from %v count %v, want [0 1]", rc.(*fifoReceipt).item, sent)
		}
	}
	for _, rc := range inHandWhileSending {
		if rc == nil || count[rc] == nil {
			t.Errorf("Delivered said %v while sending, not one of the deliveries sent from", rc)
		}
	}
	// What the source sent derives from nothing, counted over its life.
	for i, o := range fs.origins("a") {
		if o.Receipt != nil || o.Sent != i {
			t.Errorf("source's send %d: origin %+v, want none and %d", i, o, i)
		}
	}
}

// TestDeliveryKeptOnFailure: a replica whose Run fails leaves its
// delivery in hand unsettled (its item is not done), while those it asked
// past are settled.
func TestDeliveryKeptOnFailure(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	funcKind(reg, "src", false, true, func(ctx context.Context, r nodes.Replica) error {
		for i := range 3 {
			if err := r.Out("out").Send(ctx, []byte{byte(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	funcKind(reg, "fails", true, false, func(ctx context.Context, r nodes.Replica) error {
		for {
			item, err := r.In("in").Recv(ctx)
			if err != nil {
				return nil
			}
			if item.([]byte)[0] == 2 {
				return errors.New("fails on its third item")
			}
		}
	})
	var fs fifos
	p, err := New(loadPair(t, reg, "src", "fails", 1, 1, graph.Shared), Options{Registry: reg, Transport: fs.transport})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.Execute(context.Background())
	if err == nil || rep.Status == report.OK {
		t.Fatalf("the run did not fail: status %s", rep.Status)
	}
	if settled, _ := fs.settled("e"); settled != 2 {
		t.Errorf("%d receipts settled, want 2 (the third was in hand when the replica failed)", settled)
	}
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
				if settled, twice := fs.settled(name); settled != 500 || twice != 0 {
					t.Errorf("edge %s: %d receipts settled (%d more than once), want 500 once each", name, settled, twice)
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

// TestDeliveryKeptOnStop: a replica stopped with a delivery in hand (its
// context done: an abort here, a drain for a source) leaves it unsettled
// even where its Run returns nil, as a node that ends quietly on
// cancellation does: the item was not done, and comes back to whatever
// takes over.
func TestDeliveryKeptOnStop(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	funcKind(reg, "src", false, true, func(ctx context.Context, r nodes.Replica) error {
		for i := range 3 {
			if err := r.Out("out").Send(ctx, []byte{byte(i)}); err != nil {
				return err
			}
		}
		<-ctx.Done()
		return nil
	})
	holding := make(chan struct{})
	funcKind(reg, "quiet", true, false, func(ctx context.Context, r nodes.Replica) error {
		for {
			item, err := r.In("in").Recv(ctx)
			if err != nil {
				return nil
			}
			if item.([]byte)[0] == 1 {
				close(holding)
				<-ctx.Done()
				return nil // quietly, with item 1 in hand
			}
		}
	})
	var fs fifos
	p, err := New(loadPair(t, reg, "src", "quiet", 1, 1, graph.Shared), Options{Registry: reg, Transport: fs.transport})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Execute(ctx)
	}()
	select {
	case <-holding:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer never took item 1")
	}
	cancel()
	<-done
	if settled, _ := fs.settled("e"); settled != 1 {
		t.Errorf("%d receipts settled, want 1 (item 0; item 1 was in hand when the replica was stopped)", settled)
	}
}

// testChain is an engine.Chain that records what it derives.
type testChain struct {
	mu      sync.Mutex
	derived []*chainReceipt
	unsent  int
}

type chainReceipt struct {
	c    *testChain
	from Origin
	done int
}

func (c *testChain) Derive(from Origin) Receipt {
	if from.Receipt == nil {
		return nil
	}
	rc := &chainReceipt{c: c, from: from}
	c.mu.Lock()
	c.derived = append(c.derived, rc)
	c.mu.Unlock()
	return rc
}

func (c *testChain) Unsent(Receipt) {
	c.mu.Lock()
	c.unsent++
	c.mu.Unlock()
}

func (rc *chainReceipt) Done() {
	rc.c.mu.Lock()
	rc.done++
	rc.c.mu.Unlock()
}

// TestChainReceipts: a chain's queue stays in process, and each item sent
// on it carries a receipt derived from its sender's delivery in hand (the
// k-th sent from it), which the receiving replica holds as its own
// delivery in hand and settles once; the consumer sees the item itself,
// not its box.
func TestChainReceipts(t *testing.T) {
	t.Parallel()
	const n = 30
	reg := nodes.NewRegistry()
	funcKind(reg, "src", false, true, func(ctx context.Context, r nodes.Replica) error {
		for i := range n {
			if err := r.Out("out").Send(ctx, []byte{byte(i)}); err != nil {
				return err
			}
		}
		return nil
	})
	funcKind(reg, "twice", true, true, func(ctx context.Context, r nodes.Replica) error {
		for {
			item, err := r.In("in").Recv(ctx)
			if err != nil {
				return nil
			}
			for range 2 {
				if err := r.Out("out").Send(ctx, item); err != nil {
					return err
				}
			}
		}
	})
	var mu sync.Mutex
	var held []Receipt // the sink's delivery in hand at each item
	var got int
	funcKind(reg, "sink", true, false, func(ctx context.Context, r nodes.Replica) error {
		for {
			item, err := r.In("in").Recv(ctx)
			if err != nil {
				return nil
			}
			if _, ok := item.([]byte); !ok {
				return fmt.Errorf("the sink got a %T, want []byte", item)
			}
			mu.Lock()
			held = append(held, r.(Hands).Delivered())
			got++
			mu.Unlock()
		}
	})
	g, diags := (&graph.Loader{Catalog: reg}).Load("chain.hcl", []byte(`
stage "src" {
  node = "src"
}
stage "mid" {
  node = "twice"
}
stage "end" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = mid.in
}
edge "b" {
  from = mid.out
  to   = end.in
}`))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	fs := &fifos{only: []string{"a"}}
	chain := &testChain{}
	p, err := New(g, Options{Registry: reg, Transport: fs.transport, Chain: func(e *graph.Edge, i int) Chain {
		if e.Name == "b" {
			return chain
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.Execute(context.Background())
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s, err %v", rep.Status, err)
	}
	if got != 2*n || rep.Edges["b"].Produced != 2*n || rep.Edges["b"].Consumed != 2*n {
		t.Errorf("the sink got %d items, b produced %d and consumed %d, want %d", got, rep.Edges["b"].Produced, rep.Edges["b"].Consumed, 2*n)
	}
	if len(chain.derived) != 2*n || chain.unsent != 0 {
		t.Fatalf("%d receipts derived (%d unsent), want %d", len(chain.derived), chain.unsent, 2*n)
	}
	sends := map[Receipt][]int{}
	for i, rc := range chain.derived {
		if rc.done != 1 {
			t.Errorf("receipt %d settled %d times, want once", i, rc.done)
		}
		if held[i] != Receipt(rc) {
			t.Errorf("the sink held %v at item %d, want its receipt", held[i], i)
		}
		sends[rc.from.Receipt] = append(sends[rc.from.Receipt], rc.from.Sent)
	}
	if len(sends) != n {
		t.Errorf("the chain's items derive from %d deliveries, want %d", len(sends), n)
	}
	for _, s := range sends {
		if !slices.Equal(s, []int{0, 1}) {
			t.Errorf("sends from one delivery count %v, want [0 1]", s)
		}
	}
	if settled, _ := fs.settled("a"); settled != n {
		t.Errorf("edge a: %d receipts settled, want %d", settled, n)
	}
}
