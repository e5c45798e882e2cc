package sdk

import (
	"context"
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
