package sdk

import (
	"context"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// TestPanicEndsTheReplica: a panic in a plugin's node, its own or one the
// SDK raises on its behalf (a port it lacks), ends the replica with Done
// and the panic's message and frame, as in process; the server, and so
// the process, lives on. A panic in a kind's Ports or Check is a config
// error.
func TestPanicEndsTheReplica(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		run  func(nodes.Replica)
		want []string
	}{
		{"own", func(nodes.Replica) {
			var m map[int]int
			m[1] = 1
		}, []string{"panic: assignment to entry in nil map", "lifeline_test.go:"}},
		{"port", func(r nodes.Replica) { r.In("nope") },
			[]string{`panic: sdk: no input port "nope"`, "lifeline_test.go:"}},
	} {
		spec := nodes.Spec{
			Kind: graph.Kind{Name: "k", Ports: func(*graph.Config) []graph.PortSpec { return nil }},
			New: func(*graph.Config) (nodes.Node, error) {
				return nodes.NodeFunc(func(_ context.Context, r nodes.Replica) error { tc.run(r); return nil }), nil
			},
		}
		st := &fakeStream{in: make(chan *proto.Message, 1)}
		st.in <- &proto.Message{Msg: &proto.Message_Start{Start: &proto.Start{Kind: "k", ConfigJson: "{}"}}}
		if err := newServer(Options{}, spec).Run(st); err != nil {
			t.Fatalf("%s: Run: %v", tc.name, err)
		}
		close(st.in)
		done := st.sent[len(st.sent)-1].GetDone()
		for _, want := range tc.want {
			if done == nil || !strings.Contains(done.Error, want) {
				t.Errorf("%s: the replica ended with %v; want %q", tc.name, done, want)
			}
		}
		if done != nil && (strings.Contains(done.Error, "grpc") || strings.Contains(done.Error, "runtime/debug")) {
			t.Errorf("%s: frames beyond the node's:\n%s", tc.name, done.Error)
		}
	}
	picky := nodes.Spec{Kind: graph.Kind{Name: "k", Ports: func(*graph.Config) []graph.PortSpec { panic("no ports today") }}}
	resp, err := newServer(Options{}, picky).Check(context.Background(), &proto.CheckRequest{Kind: "k", ConfigJson: "{}"})
	if err != nil || len(resp.Errors) != 1 || !strings.Contains(resp.Errors[0].Message, "panic: no ports today") {
		t.Errorf("a panic in Ports: %v, %v", resp, err)
	}
}
