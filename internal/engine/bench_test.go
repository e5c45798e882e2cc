package engine

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
	"github.com/zclconf/go-cty/cty"
)

// The edge benchmarks move b.N items from 5 producer replicas to 3
// consumer replicas over one edge of capacity 8; one op is one item
// delivered. BenchmarkEdge* go through the runtime (ports, accounting,
// termination) with monitoring on: depth sampling, a series point and a
// snapshot handed to an observer every 100ms, as `dflow run` does every
// --interval. BenchmarkRawChannel* are the same shape with plain channels
// and a WaitGroup, the baseline.

func benchGraph(b *testing.B, policy graph.Policy) (*graph.Graph, *nodes.Registry) {
	reg := nodes.NewRegistry()
	reg.Register(nodes.Spec{
		Kind: graph.Kind{
			Name:   "bench_src",
			Config: []graph.Field{{Name: "count", Type: graph.Int, Default: cty.NumberIntVal(0)}},
			Ports: func(*graph.Config) []graph.PortSpec {
				return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: "x"}}
			},
		},
		New: func(cfg *graph.Config) (nodes.Node, error) {
			n := cfg.Int("count")
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				out := r.Out("out")
				for i, mine := 0, share(n, r.Index(), r.Replicas()); i < mine; i++ {
					if err := out.Send(ctx, r); err != nil {
						return err
					}
				}
				return nil
			}), nil
		},
	})
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "bench_sink", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "x"}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				return readAll(ctx, r.In("in"))
			}), nil
		},
	})
	src := fmt.Sprintf(`
stage "p" {
  node     = "bench_src"
  replicas = 5
  config {
    count = %d
  }
}
stage "c" {
  node     = "bench_sink"
  replicas = 3
}
edge "e" {
  from     = p.out
  to       = c.in
  policy   = %q
  capacity = 8
}`, b.N, policy)
	g, diags := (&graph.Loader{Catalog: reg}).Load("bench.hcl", []byte(src))
	if diags.HasErrors() {
		b.Fatal(diags)
	}
	return g, reg
}

func share(n, i, k int) int {
	s := n / k
	if i < n%k {
		s++
	}
	return s
}

func benchEdge(b *testing.B, policy graph.Policy) {
	g, reg := benchGraph(b, policy)
	b.ReportAllocs()
	b.ResetTimer()
	var prev *report.Snapshot
	observed := 0
	rep, err := Run(context.Background(), g, Options{Registry: reg, Interval: 100 * time.Millisecond,
		Observe: func(s *report.Snapshot) {
			_ = s.Sample(prev)
			prev = s
			observed++
		}})
	b.StopTimer()
	if err != nil || rep.Edges["e"].Consumed != int64(b.N) {
		b.Fatalf("err %v, consumed %d of %d", err, rep.Edges["e"].Consumed, b.N)
	}
	if rep.WallSeconds > 0.2 && observed == 0 {
		b.Fatal("monitoring was not on: no snapshot observed")
	}
}

func BenchmarkEdgeShared(b *testing.B)     { benchEdge(b, graph.Shared) }
func BenchmarkEdgeRoundRobin(b *testing.B) { benchEdge(b, graph.RoundRobin) }

// benchRaw is the baseline: 5 producer goroutines, 3 consumers, channels
// of capacity 8 wired like the policy, closed by a WaitGroup per queue.
func benchRaw(b *testing.B, policy graph.Policy) {
	queues := graph.Wire(policy, 5, 3)
	chans := make([]chan any, len(queues))
	for i := range chans {
		chans[i] = make(chan any, 8)
	}
	producers := make([]sync.WaitGroup, len(queues))
	for i, q := range queues {
		producers[i].Add(len(q.Producers))
		go func() { producers[i].Wait(); close(chans[i]) }()
	}
	e := &graph.Edge{Queues: queues}
	b.ReportAllocs()
	b.ResetTimer()
	var consumers sync.WaitGroup
	for c := 0; c < 3; c++ {
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			for range chans[e.ConsumerQueue(c)] {
			}
		}()
	}
	for p := 0; p < 5; p++ {
		go func() {
			qs := e.ProducerQueues(p)
			for i, n := 0, share(b.N, p, 5); i < n; i++ {
				chans[qs[i%len(qs)]] <- p
			}
			for _, q := range qs {
				producers[q].Done()
			}
		}()
	}
	consumers.Wait()
}

func BenchmarkRawChannelShared(b *testing.B)     { benchRaw(b, graph.Shared) }
func BenchmarkRawChannelRoundRobin(b *testing.B) { benchRaw(b, graph.RoundRobin) }

// BenchmarkScaling: items/s through a chain of depth pass-through stages
// (each `replicas` wide, shared edges), against replica count and depth.
// One op is one item through the whole chain.
func BenchmarkScaling(b *testing.B) {
	for _, depth := range []int{1, 2, 4} {
		for _, replicas := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("depth=%d/replicas=%d", depth, replicas), func(b *testing.B) {
				g, reg := chainGraph(b, depth, replicas)
				b.ReportAllocs()
				b.ResetTimer()
				rep, err := Run(context.Background(), g, Options{Registry: reg})
				b.StopTimer()
				if err != nil || rep.Edges[fmt.Sprintf("e%d", depth)].Consumed != int64(b.N) {
					b.Fatalf("err %v", err)
				}
			})
		}
	}
}

func chainGraph(b *testing.B, depth, replicas int) (*graph.Graph, *nodes.Registry) {
	_, reg := benchGraph(b, graph.Shared) // registers bench_src and bench_sink
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "bench_pass", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "x"}, {Name: "out", Dir: graph.Out, Type: "x"}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				in, out := r.In("in"), r.Out("out")
				for {
					it, err := in.Recv(ctx)
					if err == io.EOF {
						return nil
					}
					if err != nil {
						return err
					}
					if err := out.Send(ctx, it); err != nil {
						return err
					}
				}
			}), nil
		},
	})
	src := fmt.Sprintf("stage \"s0\" {\n  node = \"bench_src\"\n  replicas = %d\n  config {\n    count = %d\n  }\n}\n", replicas, b.N)
	for d := 1; d <= depth; d++ {
		node := "bench_pass"
		if d == depth {
			node = "bench_sink"
		}
		src += fmt.Sprintf("stage \"s%d\" {\n  node = %q\n  replicas = %d\n}\nedge \"e%d\" {\n  from = s%d.out\n  to = s%d.in\n  policy = \"shared\"\n}\n", d, node, replicas, d, d-1, d)
	}
	g, diags := (&graph.Loader{Catalog: reg}).Load("chain.hcl", []byte(src))
	if diags.HasErrors() {
		b.Fatal(diags)
	}
	return g, reg
}

// BenchmarkPortFastPath is the runtime's per-item cost where nothing
// waits: the ports of a source and of a sink, wired by an edge of capacity
// 8 and driven directly by the benchmark's goroutine, send an item and
// receive it, so that neither ever blocks. BenchmarkRawNonBlocking is the
// same two non-blocking channel operations. One op is one item sent and
// received.
func BenchmarkPortFastPath(b *testing.B) {
	g, reg := benchGraph(b, graph.Shared)
	p, err := New(g, Options{Registry: reg})
	if err != nil {
		b.Fatal(err)
	}
	src, sink := p.r.stages[0].replicas[0], p.r.stages[1].replicas[0]
	for _, rep := range []*replica{src, sink} {
		rep.ctx, rep.done = context.Background(), context.Background().Done()
	}
	out, in := src.Out("out"), sink.In("in")
	ctx := src.ctx
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := out.Send(ctx, src); err != nil {
			b.Fatal(err)
		}
		if _, err := in.Recv(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRawNonBlocking(b *testing.B) {
	ch := make(chan any, 8)
	var item, got any = b, nil
	b.ReportAllocs()
	for range b.N {
		select {
		case ch <- item:
		default:
			b.Fatal("full")
		}
		select {
		case got = <-ch:
		default:
			b.Fatal("empty")
		}
	}
	if got != item {
		b.Fatal("lost the item")
	}
}
