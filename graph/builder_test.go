package graph_test

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// ExampleBuilder builds a pipeline in Go, with no HCL, and prints it.
func ExampleBuilder() {
	catalog := nodes.NewRegistry()
	synthetic.Register(catalog)

	b := graph.NewBuilder("embed", catalog)
	b.Stage("numbers", "synthetic_source", graph.ConfigAttr("count", 100), graph.ConfigAttr("type", "tokens"))
	b.Stage("square", "synthetic_work", graph.Replicas(3), graph.Devices("cpu"),
		graph.ConfigAttr("service_time", 2*time.Millisecond))
	b.Stage("sum", "sink", graph.Sim{ServiceTime: "1ms"})
	b.Edge("n", "numbers.out", "square.in", graph.Policy(graph.RoundRobin), graph.Capacity(4))
	b.Edge("s", "square.out", "sum.in") // policy and capacity as in HCL: shared, 8
	g, diags := b.Build()
	if diags.HasErrors() {
		graph.WriteDiagnostics(os.Stdout, diags, nil)
		return
	}
	graph.Render(os.Stdout, g, "text")

	// A mistake is a diagnostic naming the stage, with no file position.
	b = graph.NewBuilder("typo", catalog)
	b.Stage("numbers", "synthetic_sorce", graph.ConfigAttr("count", 100))
	_, diags = b.Build()
	fmt.Println(diags[0].Detail)
	// Output:
	// pipeline embed
	//
	// stages:
	//   numbers (synthetic_source) x1
	//     out out        tokens
	//   square (synthetic_work) x3
	//     in  in         any
	//     out out        tokens
	//   sum (sink) x1
	//     in  in         any
	//
	// edges:
	//   n: numbers.out -> square.in  tokens, round_robin, capacity 4
	//     queue 0: numbers [0] -> square [0]
	//     queue 1: numbers [0] -> square [1]
	//     queue 2: numbers [0] -> square [2]
	//   s: square.out -> sum.in  tokens, shared, capacity 8
	//     queue 0: square [0 1 2] -> sum [0]
	// stage "numbers": node kind "synthetic_sorce" is not known; did you mean "synthetic_source"? Known kinds: sink, synthetic_source, synthetic_work.
}

// seedInGo is specs/seed.hcl made with the Builder.
func seedInGo() *graph.Builder {
	b := graph.NewBuilder("seed", testRegistry())
	b.Describe("5 targets on 3 synchronized drafters, synthetic timings")
	b.Stage("reader", "synthetic_source",
		graph.ConfigAttr("count", 300), graph.ConfigAttr("size_bytes", 1024), graph.ConfigAttr("type", "tokens"))
	b.Stage("target", "synthetic_work", graph.Replicas(5),
		graph.ConfigAttr("service_time", "lognormal(50ms, 0.1)"))
	b.Stage("drafter", "synthetic_work", graph.Replicas(3),
		graph.ConfigAttr("service_time", 25*time.Millisecond), graph.ConfigAttr("sync", true))
	b.Stage("done", "sink")
	b.Edge("tokens", "reader.out", "target.in", graph.Policy(graph.Shared), graph.Capacity(16))
	b.Edge("hs", "target.out", "drafter.in", graph.RoundRobin)
	b.Edge("trained", "drafter.out", "done.in")
	return b
}

// wiring describes a graph's stages, ports, config, edges and queues, for
// comparing two graphs.
func wiring(g *graph.Graph) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", g.Name, g.Description)
	for _, s := range g.Stages {
		fmt.Fprintf(&b, "stage %s %s x%d on %s sim %v\n", s.Name, s.Node, s.Replicas, s.Device(0), s.Sim != nil)
		for _, name := range s.Config.Names() {
			fmt.Fprintf(&b, "  config %s = %#v\n", name, s.Config.Value(name).GoString())
		}
		for _, p := range append(append([]*graph.Port{}, s.Inputs...), s.Outputs...) {
			fmt.Fprintf(&b, "  port %s %s %s, %d edges\n", p, p.Dir, p.Type, len(p.Edges))
		}
	}
	for _, e := range g.Edges {
		fmt.Fprintf(&b, "edge %s %s -> %s %s cap %d/%d queues %+v\n", e.Name, e.From, e.To, e.Policy, e.Capacity, e.CapacityBytes, e.Queues)
	}
	return b.String()
}

func TestBuilderMatchesLoader(t *testing.T) {
	fromHCL := mustLoad(t, &graph.Loader{}, "../specs/seed.hcl")
	fromGo, diags := seedInGo().Build()
	if len(diags) != 0 {
		t.Fatalf("Build: %v", diags)
	}
	if got, want := wiring(fromGo), wiring(fromHCL); got != want {
		t.Errorf("built in Go:\n%s\nloaded from HCL:\n%s", got, want)
	}
	var a, b bytes.Buffer
	graph.Render(&a, fromGo, "text")
	graph.Render(&b, fromHCL, "text")
	if a.String() != b.String() {
		t.Errorf("rendered differently:\n%s\nvs\n%s", a.String(), b.String())
	}
	if fromGo.Filename != "" || fromGo.Stage("target").NameRange != (hcl.Range{}) {
		t.Errorf("a graph built in Go has no source positions")
	}
}

// TestBuilderErrors builds one broken graph per class of error the HCL
// path reports, and checks the diagnostic names what is wrong with no
// position.
func TestBuilderErrors(t *testing.T) {
	source := func(b *graph.Builder) {
		b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 10))
	}
	cases := []struct {
		name    string
		build   func(b *graph.Builder)
		summary string
		detail  string
	}{
		{"unknown kind", func(b *graph.Builder) {
			source(b)
			b.Stage("work", "synthetic_wrok")
			b.Edge("e", "src.out", "work.in")
		}, "unknown node kind", `stage "work": node kind "synthetic_wrok" is not known; did you mean "synthetic_work"?`},
		{"unknown stage", func(b *graph.Builder) {
			source(b)
			b.Stage("sink", "sink")
			b.Edge("e", "src.out", "snik.in")
		}, "unknown stage", `edge "e": stage "snik" is not defined; did you mean "sink"?`},
		{"unknown port", func(b *graph.Builder) {
			source(b)
			b.Stage("sink", "sink")
			b.Edge("e", "src.output", "sink.in")
		}, "unknown port", `edge "e": stage "src" (node "synthetic_source") has no output port "output"; its output ports are: out.`},
		{"wrong direction", func(b *graph.Builder) {
			source(b)
			b.Stage("sink", "sink")
			b.Edge("e", "src.out", "sink.in")
			b.Edge("f", "sink.in", "sink.in")
		}, "wrong port direction", `edge "f": sink.in is an input port, but "from" must name an output port.`},
		{"bad port reference", func(b *graph.Builder) {
			source(b)
			b.Edge("e", "src", "sink.in")
		}, "invalid port reference", `edge "e": from must be a port reference "STAGE.PORT", such as "target.hidden"; got "src".`},
		{"type mismatch", func(b *graph.Builder) {
			source(b) // emits blob
			b.Stage("typed", "typed_sink", graph.ConfigAttr("type", "tokens"))
			b.Edge("e", "src.out", "typed.in")
		}, "type mismatch", `edge "e": src.out emits "blob" items but typed.in takes "tokens"`},
		{"cycle", func(b *graph.Builder) {
			source(b)
			b.Stage("a", "synthetic_work")
			b.Stage("b", "synthetic_work")
			b.Edge("in", "src.out", "a.in")
			b.Edge("ab", "a.out", "b.in")
			b.Edge("ba", "b.out", "a.in")
			b.Stage("end", "sink")
			b.Edge("out", "b.out", "end.in")
		}, "cycle", `stages a -> b -> a form a loop through edges "ab", "ba"`},
		{"input with no edge", func(b *graph.Builder) {
			source(b)
			b.Stage("sink", "sink")
			b.Stage("idle", "sink")
			b.Edge("e", "src.out", "sink.in")
		}, "input port with no edge", `stage "idle": input port "in" (any) has no edge feeding it`},
		{"bad policy", func(b *graph.Builder) {
			source(b)
			b.Stage("sink", "sink")
			b.Edge("e", "src.out", "sink.in", graph.Policy("round_robbin"))
		}, "unknown policy", `edge "e": policy "round_robbin" is not known; did you mean "round_robin"?`},
		{"replicas < 1", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.Replicas(0), graph.ConfigAttr("count", 10))
		}, "invalid replicas", `stage "src": replicas must be at least 1; got 0.`},
		{"too many replicas", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.Replicas(5000), graph.ConfigAttr("count", 10))
		}, "invalid replicas", `stage "src": replicas must be at most 1024; got 5000.`},
		{"capacity < 1", func(b *graph.Builder) {
			source(b)
			b.Stage("sink", "sink")
			b.Edge("e", "src.out", "sink.in", graph.Capacity(0))
		}, "invalid capacity", `edge "e": capacity must be at least 1; got 0.`},
		{"capacity_bytes < 1", func(b *graph.Builder) {
			source(b)
			b.Stage("sink", "sink")
			b.Edge("e", "src.out", "sink.in", graph.CapacityBytes(-1))
		}, "invalid capacity_bytes", `edge "e": capacity_bytes must be at least 1; got -1.`},
		{"duplicate stage", func(b *graph.Builder) {
			source(b)
			source(b)
		}, "duplicate stage name", `stage "src" is already declared; each stage needs a unique name.`},
		{"duplicate edge", func(b *graph.Builder) {
			source(b)
			b.Stage("sink", "sink")
			b.Edge("e", "src.out", "sink.in")
			b.Edge("e", "src.out", "sink.in")
		}, "duplicate edge name", `edge "e" is already declared; each edge needs a unique name.`},
		{"invalid name", func(b *graph.Builder) {
			b.Stage("my source", "synthetic_source", graph.ConfigAttr("count", 10))
		}, "invalid stage name", `stage "my source": "my source" is not a valid name`},
		{"node config check", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 10), graph.ConfigAttr("service_time", "fast"))
		}, "invalid config", `stage "src" (synthetic_source): service_time: "fast" is not a duration such as 40ms or 1.5s.`},
		{"missing required config", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source")
		}, "missing config attribute", `stage "src": node "synthetic_source" needs config attribute "count"`},
		{"unknown config attribute", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 10), graph.ConfigAttr("cont", 4))
		}, "unknown config attribute", `stage "src" (node "synthetic_source"): node "synthetic_source" has no config attribute "cont"; did you mean "count"?`},
		{"config wrong type", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.ConfigAttr("count", "ten"))
		}, "invalid value for count", `stage "src": config attribute count must be of type int; got the string "ten".`},
		{"config not whole", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 1.5))
		}, "invalid value for count", `stage "src": config attribute count must be a whole number; got 1.5.`},
		{"config Go type", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.ConfigAttr("count", struct{}{}))
		}, "invalid value for count", `stage "src": config attribute count a Go struct {} is not a config value`},
		{"config twice", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 1), graph.ConfigAttr("count", 2))
		}, "duplicate config attribute", `stage "src": config attribute count is given twice`},
		{"bad device", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 10), graph.Devices("gpu0"))
		}, "invalid device", `stage "src": device "gpu0" is not known: use "cpu" or "cuda:N".`},
		{"no devices", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 10), graph.Devices())
		}, "invalid devices", `stage "src": devices must list at least one device`},
		{"bad sim", func(b *graph.Builder) {
			b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 10), graph.Sim{ServiceTime: "uniform(3ms, 1ms)"})
		}, "invalid service_time", `stage "src": sim service_time "uniform(3ms, 1ms)": the upper bound is below the lower.`},
		{"no stage", func(b *graph.Builder) {}, "no stage", `graph "t" has no stage`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := graph.NewBuilder("t", testRegistry())
			c.build(b)
			g, diags := b.Build()
			if g != nil {
				t.Errorf("got a graph despite errors")
			}
			for _, d := range diags {
				if strings.HasPrefix(c.summary, "invalid value for ") && d.Summary == "missing config attribute" {
					t.Errorf("a value given but refused is also called missing: %v", diags)
				}
			}
			for _, d := range diags {
				if d.Subject != nil || d.Context != nil {
					t.Errorf("diagnostic %q has a position: %v", d.Summary, d.Subject)
				}
				if d.Severity == hcl.DiagError && d.Summary == c.summary && strings.Contains(d.Detail, c.detail) {
					return
				}
			}
			t.Errorf("no error %q: %s\ngot %v", c.summary, c.detail, diags)
		})
	}
}

func TestBuilderWarning(t *testing.T) {
	b := graph.NewBuilder("t", testRegistry())
	b.Stage("src", "synthetic_source", graph.ConfigAttr("count", 10))
	g, diags := b.Build()
	if g == nil || len(diags) != 1 || diags[0].Severity != hcl.DiagWarning ||
		diags[0].Detail != `stage "src": output port "out" (blob) has no edge; its items are dropped.` {
		t.Fatalf("graph %v, diagnostics %v", g != nil, diags)
	}
	if _, again := b.Build(); !again.HasErrors() {
		t.Error("a second Build is not an error")
	}
}

func TestBuilderConfigConversion(t *testing.T) {
	b := graph.NewBuilder("t", testRegistry())
	b.Stage("src", "synthetic_source",
		graph.ConfigAttr("count", int64(7)), graph.ConfigAttr("size_bytes", uint8(3)),
		graph.ConfigAttr("speed", []int{1, 2}), graph.ConfigAttr("seed", 9.0))
	b.Stage("work", "synthetic_work",
		graph.ConfigAttr("service_time", 1500*time.Microsecond), graph.ConfigAttr("speed", []float64{1, 0.5}),
		graph.ConfigAttr("sync", true), graph.ConfigAttr("fail_after", cty.NumberIntVal(4)))
	b.Stage("end", "typed_sink", graph.ConfigAttr("type", "blob"))
	b.Edge("a", "src.out", "work.in")
	b.Edge("b", "work.out", "end.in")
	g, diags := b.Build()
	if len(diags) != 0 {
		t.Fatalf("Build: %v", diags)
	}
	src, work := g.Stage("src").Config, g.Stage("work").Config
	if src.Int("count") != 7 || src.Int("size_bytes") != 3 || src.Int("seed") != 9 || !reflect.DeepEqual(src.Floats("speed"), []float64{1, 2}) {
		t.Errorf("src config: count %d size %d seed %d speed %v", src.Int("count"), src.Int("size_bytes"), src.Int("seed"), src.Floats("speed"))
	}
	if d, err := work.Duration("service_time"); err != nil || d != 1500*time.Microsecond {
		t.Errorf("service_time = %v, %v", d, err)
	}
	if !work.Bool("sync") || work.Int("fail_after") != 4 || !reflect.DeepEqual(work.Floats("speed"), []float64{1, 0.5}) {
		t.Errorf("work config: sync %v fail_after %d speed %v", work.Bool("sync"), work.Int("fail_after"), work.Floats("speed"))
	}
	if got := src.String("type"); got != "blob" {
		t.Errorf("default type = %q, want blob", got)
	}
}
