package sdk

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/proto"
	"google.golang.org/grpc"
)

// fakeStream is a replica's stream as the plugin side sees it: it hands
// the server the messages in, and keeps what the server sends.
type fakeStream struct {
	grpc.ServerStream
	in   chan *proto.Message
	mu   sync.Mutex
	sent []*proto.Message
}

func (s *fakeStream) Context() context.Context { return context.Background() }

func (s *fakeStream) Recv() (*proto.Message, error) {
	m, ok := <-s.in
	if !ok {
		return nil, io.EOF
	}
	return m, nil
}

func (s *fakeStream) Send(m *proto.Message) error {
	runtime.Gosched() // let another sender in, if one can get in
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, m)
	return nil
}

// credit is the input credit the server has granted so far.
func (s *fakeStream) credit() int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int32
	for _, m := range s.sent {
		n += m.GetCredit().GetN()
	}
	return n
}

// TestConcurrentOutputsDoNotInterleave: a plugin node that sends large
// (chunked) items on two ports from two goroutines at once: every item
// reaches dflow whole, because one item's chunks go out before another's.
func TestConcurrentOutputsDoNotInterleave(t *testing.T) {
	t.Parallel()
	const perPort, size = 6, 2*wire.ChunkSize + 100
	twins := nodes.Spec{
		Kind: graph.Kind{Name: "twins", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "a", Dir: graph.Out, Type: "blob"}, {Name: "b", Dir: graph.Out, Type: "blob"}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				var wg sync.WaitGroup
				errs := make([]error, 2)
				for p, port := range []string{"a", "b"} {
					wg.Go(func() {
						for i := range perPort {
							data := bytes.Repeat([]byte{byte(10*p + i)}, size)
							if err := r.Out(port).Send(ctx, &synthetic.Blob{Replica: p, Seq: int64(i), Data: data}); err != nil {
								errs[p] = err
								return
							}
						}
					})
				}
				wg.Wait()
				return errs[0]
			}), nil
		},
	}
	st := &fakeStream{in: make(chan *proto.Message, 1)}
	st.in <- &proto.Message{Msg: &proto.Message_Start{Start: &proto.Start{Kind: "twins", ConfigJson: "{}"}}}
	defer close(st.in)
	if err := newServer(Options{}, twins).Run(st); err != nil {
		t.Fatal(err)
	}
	var a wire.Assembler
	got := 0
	for _, m := range st.sent {
		c := m.GetItem()
		if c == nil {
			if d := m.GetDone(); d != nil && d.Error != "" {
				t.Fatalf("the node failed: %s", d.Error)
			}
			continue
		}
		b, whole := a.Add(c)
		if !whole {
			continue
		}
		item, err := wire.Decode(c.Type, b)
		if err != nil {
			t.Fatalf("item %d on %s: %v", got, c.Port, err)
		}
		blob := item.(*synthetic.Blob)
		want := byte(10*blob.Replica + int(blob.Seq))
		if c.Port != []string{"a", "b"}[blob.Replica] || len(blob.Data) != size || bytes.Count(blob.Data, []byte{want}) != size {
			t.Fatalf("item %d on port %s: blob %d/%d of %d bytes, mixed with another item's", got, c.Port, blob.Replica, blob.Seq, len(blob.Data))
		}
		got++
	}
	if got != 2*perPort {
		t.Errorf("%d items arrived whole, want %d", got, 2*perPort)
	}
}

// TestBrokenInputIsReported: when dflow's side sends an item the plugin
// cannot decode, the replica ends with that error in Done, not with a
// bare cancellation.
func TestBrokenInputIsReported(t *testing.T) {
	t.Parallel()
	sink := nodes.Spec{
		Kind: graph.Kind{Name: "sink", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for {
					if _, err := r.In("in").Recv(ctx); err != nil {
						if err == io.EOF {
							return nil
						}
						return err
					}
				}
			}), nil
		},
	}
	for _, tc := range []struct {
		item *proto.Item
		want string
	}{
		{&proto.Item{Port: "in", Type: "hidden", Payload: []byte{1, 2, 3}}, "malformed hidden item"},
		{&proto.Item{Port: "nope", Type: "bytes", Payload: []byte{1}}, `input port "nope"`},
	} {
		st := &fakeStream{in: make(chan *proto.Message, 2)}
		st.in <- &proto.Message{Msg: &proto.Message_Start{Start: &proto.Start{Kind: "sink", ConfigJson: "{}"}}}
		st.in <- &proto.Message{Msg: &proto.Message_Item{Item: tc.item}}
		if err := newServer(Options{}, sink).Run(st); err != nil {
			t.Fatal(err)
		}
		close(st.in)
		last := st.sent[len(st.sent)-1].GetDone()
		if last == nil || !strings.Contains(last.Error, tc.want) {
			t.Errorf("%s item: the replica ended with %v; want an error naming %q", tc.item.Type, last, tc.want)
		}
	}
}

// TestOverrunIsReported: dflow sending more items on an input than the
// plugin granted credit for ends the replica with an error naming the
// port. The node takes nothing, so no credit is granted meanwhile.
func TestOverrunIsReported(t *testing.T) {
	t.Parallel()
	stalled := nodes.Spec{
		Kind: graph.Kind{Name: "stalled", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				<-ctx.Done()
				return ctx.Err()
			}), nil
		},
	}
	var items []*proto.Item
	for range firstCredit + 1 {
		items = append(items, &proto.Item{Port: "in", Type: "bytes", Payload: []byte{1}})
	}
	st := &fakeStream{in: make(chan *proto.Message, 2)}
	st.in <- &proto.Message{Msg: &proto.Message_Start{Start: &proto.Start{Kind: "stalled", ConfigJson: "{}", Batches: true}}}
	st.in <- &proto.Message{Msg: &proto.Message_Batch{Batch: &proto.Batch{Items: items}}}
	done := make(chan error, 1)
	go func() { done <- newServer(Options{}, stalled).Run(st) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the replica did not end: the overrun went unnoticed")
	}
	close(st.in)
	want := `dflow sent more items on "in" than the plugin granted it credit for`
	if last := st.sent[len(st.sent)-1].GetDone(); last == nil || !strings.Contains(last.Error, want) {
		t.Errorf("the replica ended with %v; want %q", last, want)
	}
}

// TestBatchesAndCredit: a plugin replica told that dflow takes batches
// receives a Batch in order, and grants input credit only while what it
// holds and what it has granted fit its byte budget: with 1 MiB items and
// a 4 MiB budget, no more than 4 items' worth once it has taken the 8 it
// was first sent; with items larger than the budget, one at a time, but
// never none. The node waits for that credit before it returns (credit is
// granted by another goroutine, and none is owed once the node is done).
func TestBatchesAndCredit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		budget, size int64
		least, most  int32
	}{{4 << 20, 1 << 20, 1, 4}, {1 << 20, 2 << 20, 1, 1}} {
		take := make(chan struct{})
		var got []byte
		st := &fakeStream{in: make(chan *proto.Message, 16)}
		slow := nodes.Spec{
			Kind: graph.Kind{Name: "slow", Ports: func(*graph.Config) []graph.PortSpec {
				return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
			}},
			New: func(*graph.Config) (nodes.Node, error) {
				return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
					for range take {
						item, err := r.In("in").Recv(ctx)
						if err != nil {
							return err
						}
						got = append(got, item.([]byte)[0])
					}
					if !testutil.Within(5*time.Second, func() bool { return st.credit() > firstCredit }) {
						return errors.New("no credit granted after the first items were taken")
					}
					return nil
				}), nil
			},
		}
		st.in <- &proto.Message{Msg: &proto.Message_Start{Start: &proto.Start{Kind: "slow", ConfigJson: "{}", Batches: true}}}
		var items []*proto.Item
		for i := range firstCredit {
			items = append(items, &proto.Item{Port: "in", Type: "bytes", Payload: append([]byte{byte(i)}, make([]byte, tc.size-1)...)})
		}
		st.in <- &proto.Message{Msg: &proto.Message_Batch{Batch: &proto.Batch{Items: items}}}
		done := make(chan error)
		go func() { done <- newServer(Options{InputBytes: tc.budget}, slow).Run(st) }()
		for range firstCredit {
			take <- struct{}{}
		}
		close(take)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		close(st.in)
		if !bytes.Equal(got, []byte{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Errorf("the node got %v", got)
		}
		if more := st.credit() - firstCredit; more < tc.least || more > tc.most {
			t.Errorf("%d-byte items, %d-byte budget: %d items of credit granted after the first %d; want %d to %d",
				tc.size, tc.budget, more, firstCredit, tc.least, tc.most)
		}
	}
}

// TestRestoresAsksOneAtATime: a member of a kind that restores (Sync and
// Moves: Kind.restores) grants input credit for one item only as its node
// asks for one, never ahead, so that the item dflow holds in hand is the
// one the node trains in its group's step; its Keep names the save to
// restore where its Start says restore_step, and is nil on a first start.
func TestRestoresAsksOneAtATime(t *testing.T) {
	t.Parallel()
	took := make(chan int, 4)
	asked := make(chan struct{})
	kept := make(chan error, 1)
	spec := nodes.Spec{
		Kind: graph.Kind{Name: "ranks", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
		}},
		Sync: nodes.Always, Moves: true,
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				kept <- r.Group().Keep(ctx, nil)
				<-asked
				for {
					it, err := r.In("in").Recv(ctx)
					if err == io.EOF {
						return nil
					}
					if err != nil {
						return err
					}
					took <- int(it.([]byte)[0])
				}
			}), nil
		},
	}
	for _, c := range []struct{ restore *int64 }{{nil}, {ptr(int64(4))}} {
		st := &fakeStream{in: make(chan *proto.Message, 4)}
		st.in <- &proto.Message{Msg: &proto.Message_Start{Start: &proto.Start{Kind: "ranks", ConfigJson: "{}", Batches: true, Group: true, RestoreStep: c.restore}}}
		done := make(chan error, 1)
		go func() { done <- newServer(Options{}, spec).Run(st) }()
		err := <-kept
		var re *nodes.Restore
		switch {
		case c.restore == nil && err != nil:
			t.Errorf("a first start: Keep says %v, want nil", err)
		case c.restore != nil && (!errors.As(err, &re) || re.Step != 4):
			t.Errorf("a restart told step 4: Keep says %v, want a *nodes.Restore of step 4", err)
		}
		if n := st.credit(); n != 0 {
			t.Errorf("credit %d before the node asked, want none", n)
		}
		close(asked)
		testutil.Eventually(t, 10*time.Second, func() bool { return st.credit() == 1 }, "the node's ask granted no credit")
		st.in <- &proto.Message{Msg: &proto.Message_Batch{Batch: &proto.Batch{Items: []*proto.Item{{Port: "in", Type: "bytes", Payload: []byte{7}}}}}}
		if got := <-took; got != 7 {
			t.Errorf("took %d, want 7", got)
		}
		testutil.Eventually(t, 10*time.Second, func() bool { return st.credit() == 2 }, "the second ask granted no credit")
		st.in <- &proto.Message{Msg: &proto.Message_Eof{Eof: &proto.Eof{Port: "in"}}}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := st.credit(); n != 2 {
			t.Errorf("credit %d granted over the run, want 2: one an ask", n)
		}
		close(st.in)
		asked = make(chan struct{})
	}
}

func ptr[T any](v T) *T { return &v }
