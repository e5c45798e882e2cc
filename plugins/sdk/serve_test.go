package sdk

import (
	"bytes"
	"context"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
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

// TestConcurrentOutputsDoNotInterleave: a plugin node that sends large
// (chunked) items on two ports from two goroutines at once: every item
// reaches dflow whole, because one item's chunks go out before another's.
func TestConcurrentOutputsDoNotInterleave(t *testing.T) {
	const perPort, size = 6, 2*ChunkSize + 100
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
	if err := NewServer(twins).Run(st); err != nil {
		t.Fatal(err)
	}
	var a Assembler
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
		item, err := Decode(c.Type, b)
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
		if err := NewServer(sink).Run(st); err != nil {
			t.Fatal(err)
		}
		close(st.in)
		last := st.sent[len(st.sent)-1].GetDone()
		if last == nil || !strings.Contains(last.Error, tc.want) {
			t.Errorf("%s item: the replica ended with %v; want an error naming %q", tc.item.Type, last, tc.want)
		}
	}
}
