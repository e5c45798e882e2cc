package sdk

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// TestPoolsOutliveTheReceiver: the pools a replica mapped stay mapped
// until its receiver has ended, not only until Run returns. The receiver
// runs until the stream ends, which may be after the node and Run are
// done (a node that returns without reading all its input, while dflow
// is still sending): an item by reference that arrives then is checked
// and read from the pool. When Run unmapped the pools as it returned
// (issue 32), such an item was read from an unmapped pool: under -race,
// Pool.Check's read of the mapping raced with Pools.Close's write (seen
// with an item sent from a goroutine with no happens-before edge to the
// handler's), and without, a receiver between Check and Decode read
// freed memory. Here the item comes after Run has returned: the pools
// are still mapped, the item is applied without error, and the pools are
// unmapped once the stream ends.
func TestPoolsOutliveTheReceiver(t *testing.T) {
	t.Parallel()
	if !wire.SharedMemoryEnabled() {
		t.Skip("no shared memory here")
	}
	ps, err := wire.CreatePools(1<<20, 1<<20) // dflow's side, in this process
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	quick := nodes.Spec{
		Kind: graph.Kind{Name: "quick", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(context.Context, nodes.Replica) error { return nil }), nil // reads nothing
		},
	}
	var ss *session
	unmapped := make(chan struct{})
	srv := newServer(Options{}, quick)
	srv.onSession = func(s *session) { ss = s; s.closed = func() { close(unmapped) } }
	st := &fakeStream{in: make(chan *proto.Message, 4)}
	st.in <- &proto.Message{Msg: &proto.Message_Start{Start: &proto.Start{Kind: "quick", ConfigJson: "{}", Pools: ps.Proto()}}}
	if err := srv.Run(st); err != nil {
		t.Fatal(err)
	}
	if att := st.sent[0].GetAttached(); att == nil || att.Error != "" {
		t.Fatalf("first message %v; want Attached without error", st.sent[0])
	}
	select {
	case <-unmapped:
		t.Fatal("the pools were unmapped as Run returned, while the receiver still reads the stream")
	default:
	}
	const n = 100 << 10
	h, ok := ps.In.Write([][]byte{make([]byte, n)}, n, nil, "bytes")
	if !ok {
		t.Fatal("no room in pool 0")
	}
	st.in <- &proto.Message{Msg: &proto.Message_Item{Item: &proto.Item{Port: "in", Type: "bytes", Size: n, Ref: &proto.Ref{Pool: 0, Offset: h.Off, Length: n}}}}
	close(st.in) // the stream ends: the receiver with it
	select {
	case <-unmapped:
	case <-time.After(10 * time.Second):
		t.Fatal("the pools were not unmapped after the stream ended")
	}
	select {
	case <-ss.dead:
	default:
		t.Error("the pools were unmapped before the receiver ended")
	}
	if err := ss.failed(); err != nil {
		t.Errorf("the item by reference after Run: %v; want it applied from the mapped pool", err)
	}
	if !ss.pools.Closed() {
		t.Error("the plugin's pools are still mapped")
	}
}

// TestKeptWhileItsRegionHoldsALaterItem: a node that sends an item it
// kept past its lifetime fails with the rule also once dflow has taken
// the item's region again for a later item, as long as the node has not
// received that item: the region's bytes are then a later item's, which
// the node cannot have. (Only a live region was checked: the later item
// on its way made the kept one's bytes go out silently as that item.)
func TestKeptWhileItsRegionHoldsALaterItem(t *testing.T) {
	t.Parallel()
	if !wire.SharedMemoryEnabled() {
		t.Skip("no shared memory here")
	}
	ps, err := wire.CreatePools(1<<20, 1<<20) // dflow's side, in this process
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	const n = 100 << 10
	ready := make(chan struct{})
	kept := nodes.Spec{
		Kind: graph.Kind{Name: "kept", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}, {Name: "out", Dir: graph.Out, Type: graph.Any}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				first, err := r.In("in").Recv(ctx)
				if err != nil {
					return err
				}
				if _, err := r.In("in").Recv(ctx); err != nil { // the first item's lifetime ends
					return err
				}
				<-ready // the first item's region holds a third item, not received yet
				return r.Out("out").Send(ctx, first)
			}), nil
		},
	}
	sessions := make(chan *session, 1)
	srv := newServer(Options{}, kept)
	srv.onSession = func(s *session) { sessions <- s }
	st := &fakeStream{in: make(chan *proto.Message, 8)}
	st.in <- &proto.Message{Msg: &proto.Message_Start{Start: &proto.Start{Kind: "kept", ConfigJson: "{}", Pools: ps.Proto()}}}
	item := func(off int64) *proto.Message {
		return &proto.Message{Msg: &proto.Message_Item{Item: &proto.Item{Port: "in", Type: "bytes", Size: n, Ref: &proto.Ref{Pool: 0, Offset: off, Length: n}}}}
	}
	var regions []int64
	for range 2 {
		h, ok := ps.In.Write([][]byte{make([]byte, n)}, n, nil, "bytes")
		if !ok {
			t.Fatal("no room in pool 0")
		}
		regions = append(regions, h.Off)
		st.in <- item(h.Off)
	}
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(st) }()
	s := <-sessions
	// Once the plugin has released the first item's region, dflow may
	// take it again: a third item there, which the session receives
	// into the node's input (the node is waiting on ready, not in Recv).
	deadline := time.Now().Add(10 * time.Second)
	for !released(st, regions[0]) {
		if time.Now().After(deadline) {
			t.Fatal("the first item's region was not released after the node's second Recv")
		}
		time.Sleep(time.Millisecond)
	}
	st.in <- item(regions[0])
	for len(s.inputs["in"].ch) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the third item did not reach the node's input")
		}
		time.Sleep(time.Millisecond)
	}
	close(ready)
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	close(st.in)
	st.mu.Lock()
	defer st.mu.Unlock()
	var done *proto.Done
	for _, m := range st.sent {
		if d := m.GetDone(); d != nil {
			done = d
		}
		if it := m.GetItem(); it != nil {
			t.Errorf("the kept item went out: %v", it)
		}
	}
	if done == nil || !strings.Contains(done.Error, "no longer holds") {
		t.Errorf("Done %v, want the node's error: the item lies in the memory of an item it no longer holds", done)
	}
}

// released reports whether the plugin has released pool 0's region at
// off.
func released(st *fakeStream, off int64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, m := range st.sent {
		for _, ref := range m.GetRelease().GetRefs() {
			if ref.Pool == 0 && ref.Offset == off {
				return true
			}
		}
	}
	return false
}
