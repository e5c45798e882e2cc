package graph_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes/dflash"
	"github.com/dflow-dev/dflow/nodes/lm"
	"github.com/dflow-dev/dflow/nodes/text"
	"github.com/hashicorp/hcl/v2"
)

func TestWire(t *testing.T) {
	for _, tc := range []struct {
		policy graph.Policy
		p, c   int
		want   [][2][]int // per queue: producers, consumers
	}{
		{graph.RoundRobin, 5, 3, [][2][]int{{{0, 3}, {0}}, {{1, 4}, {1}}, {{2}, {2}}}},
		{graph.RoundRobin, 3, 3, [][2][]int{{{0}, {0}}, {{1}, {1}}, {{2}, {2}}}},
		{graph.RoundRobin, 2, 4, [][2][]int{{{0}, {0}}, {{1}, {1}}, {{0}, {2}}, {{1}, {3}}}},
		{graph.RoundRobin, 1, 3, [][2][]int{{{0}, {0}}, {{0}, {1}}, {{0}, {2}}}},
		{graph.RoundRobin, 4, 1, [][2][]int{{{0, 1, 2, 3}, {0}}}},
		{graph.Shared, 5, 3, [][2][]int{{{0, 1, 2, 3, 4}, {0, 1, 2}}}},
	} {
		t.Run(fmt.Sprintf("%s_%d_%d", tc.policy, tc.p, tc.c), func(t *testing.T) {
			qs := graph.Wire(tc.policy, tc.p, tc.c)
			var got [][2][]int
			for i, q := range qs {
				if q.Index != i {
					t.Errorf("queue %d has index %d", i, q.Index)
				}
				got = append(got, [2][]int{q.Producers, q.Consumers})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Wire = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestWireProperties checks, over many shapes, that every producer feeds at
// least one queue, every consumer pulls from exactly one, and round_robin
// never gives a queue producers that differ by more than one.
func TestWireProperties(t *testing.T) {
	for p := 1; p <= 9; p++ {
		for c := 1; c <= 9; c++ {
			for _, pol := range graph.Policies {
				e := &graph.Edge{Name: "e", Policy: pol, Queues: graph.Wire(pol, p, c)}
				for i := 0; i < p; i++ {
					if len(e.ProducerQueues(i)) == 0 {
						t.Fatalf("%s %d->%d: producer %d feeds nothing", pol, p, c, i)
					}
				}
				seen := map[int]int{}
				lo, hi := p, 0
				for _, q := range e.Queues {
					for _, cc := range q.Consumers {
						seen[cc]++
					}
					lo, hi = min(lo, len(q.Producers)), max(hi, len(q.Producers))
				}
				for j := 0; j < c; j++ {
					if seen[j] != 1 {
						t.Fatalf("%s %d->%d: consumer %d in %d queues", pol, p, c, j, seen[j])
					}
					if q := e.ConsumerQueue(j); !contains(e.Queues[q].Consumers, j) {
						t.Fatalf("ConsumerQueue(%d) = %d, which does not hold it", j, q)
					}
				}
				if pol == graph.RoundRobin && hi-lo > 1 {
					t.Fatalf("%s %d->%d: uneven wiring %d..%d", pol, p, c, lo, hi)
				}
			}
		}
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestRotationOrderPLessThanC(t *testing.T) {
	e := &graph.Edge{Queues: graph.Wire(graph.RoundRobin, 2, 5)}
	if got := e.ProducerQueues(0); !reflect.DeepEqual(got, []int{0, 2, 4}) {
		t.Errorf("producer 0 rotates over %v, want [0 2 4]", got)
	}
	if got := e.ProducerQueues(1); !reflect.DeepEqual(got, []int{1, 3}) {
		t.Errorf("producer 1 rotates over %v, want [1 3]", got)
	}
}

func load(t *testing.T, l *graph.Loader, file string) (*graph.Graph, hcl.Diagnostics) {
	t.Helper()
	if l.Catalog == nil {
		l.Catalog = testRegistry()
	}
	return l.LoadFile(file)
}

func mustLoad(t *testing.T, l *graph.Loader, file string) *graph.Graph {
	t.Helper()
	g, diags := load(t, l, file)
	if diags.HasErrors() {
		var b bytes.Buffer
		graph.WriteDiagnostics(&b, diags, l.Sources())
		t.Fatalf("load %s:\n%s", file, b.String())
	}
	return g
}

func TestLoadSeed(t *testing.T) {
	g := mustLoad(t, &graph.Loader{}, "../specs/seed.hcl")
	if g.Name != "seed" || len(g.Stages) != 4 || len(g.Edges) != 3 {
		t.Fatalf("got pipeline %q with %d stages, %d edges", g.Name, len(g.Stages), len(g.Edges))
	}
	target := g.Stage("target")
	if target.Replicas != 5 || target.Node != "synthetic_work" || target.Device(7) != "cpu" {
		t.Errorf("target = %+v", target)
	}
	hs := g.Edge("hs")
	if hs.Policy != graph.RoundRobin || hs.Capacity != 8 || hs.Fanin() != "2-2-1" {
		t.Errorf("hs: policy %s capacity %d wiring %s", hs.Policy, hs.Capacity, hs.Fanin())
	}
	// synthetic_work's out carries its input's type, through two stages.
	if got := g.Stage("drafter").Port("out").Type; got != "tokens" {
		t.Errorf("drafter.out type = %q, want tokens (from reader's config)", got)
	}
	if got := g.Stage("drafter").Config.Bool("sync"); !got {
		t.Error("drafter sync not decoded")
	}
	if d, _ := g.Stage("drafter").Config.Duration("service_time"); d != 25*time.Millisecond {
		t.Errorf("drafter service_time = %v", d)
	}
}

func TestVarsAndSets(t *testing.T) {
	l := &graph.Loader{
		Vars: map[string]string{"targets": "6", "items": "12"},
		Sets: []string{
			"edge.hs.policy=shared", "edge.hs.capacity=3", "edge.tokens.capacity_bytes=4096",
			"stage.drafter.replicas=2", "stage.drafter.config.service_time=1ms",
		},
	}
	g := mustLoad(t, l, "../specs/seed.hcl")
	hs := g.Edge("hs")
	if hs.Policy != graph.Shared || hs.Capacity != 3 || len(hs.Queues) != 1 {
		t.Errorf("hs after --set: %s cap %d, %d queues", hs.Policy, hs.Capacity, len(hs.Queues))
	}
	if g.Edge("tokens").CapacityBytes != 4096 {
		t.Error("capacity_bytes not set")
	}
	if g.Stage("target").Replicas != 6 || g.Stage("reader").Config.Int("count") != 12 {
		t.Error("--var not applied")
	}
	if g.Stage("drafter").Replicas != 2 || g.Stage("drafter").Config.String("service_time") != "1ms" {
		t.Error("--set on stage not applied")
	}
}

func TestVarsAndSetsErrors(t *testing.T) {
	for _, tc := range []struct {
		l    graph.Loader
		want string
	}{
		{graph.Loader{Vars: map[string]string{"target": "3"}}, `declares no variable "target"; did you mean "targets"?`},
		{graph.Loader{Vars: map[string]string{"targets": "many"}}, `--var targets=many: want number`},
		{graph.Loader{Sets: []string{"edge.hs.policy=balanced"}}, `policy "balanced" is not known`},
		{graph.Loader{Sets: []string{"edge.h.policy=shared"}}, `no edge "h"; did you mean "hs"?`},
		{graph.Loader{Sets: []string{"stage.target.replicas=0"}}, `replicas must be at least 1; got 0`},
		{graph.Loader{Sets: []string{"stage.target.replica=2"}}, `no settable attribute "replica"`},
		{graph.Loader{Sets: []string{"edge.hs.capacity"}}, `want PATH=VALUE`},
		{graph.Loader{Sets: []string{"stage.drafter.config.sinc=true"}}, `no config attribute "sinc"; did you mean "sync"?`},
		{graph.Loader{Sets: []string{"stage.drafter.config.service_time=fast"}}, `"fast" is not a duration`},
		{graph.Loader{VarFiles: []string{"testdata/vars/bad.hcl"}}, `sets variable "itemz", which ../specs/seed.hcl does not declare; did you mean "items"?`},
	} {
		l := tc.l
		_, diags := load(t, &l, "../specs/seed.hcl")
		var b bytes.Buffer
		graph.WriteDiagnostics(&b, diags, l.Sources())
		if !diags.HasErrors() || !strings.Contains(b.String(), tc.want) {
			t.Errorf("want an error containing %q, got:\n%s", tc.want, b.String())
		}
	}
}

func TestVarFile(t *testing.T) {
	g := mustLoad(t, &graph.Loader{VarFiles: []string{"testdata/vars/good.hcl"}, Vars: map[string]string{"items": "7"}}, "../specs/seed.hcl")
	if g.Stage("target").Replicas != 2 {
		t.Errorf("var file: targets = %d, want 2", g.Stage("target").Replicas)
	}
	if g.Stage("reader").Config.Int("count") != 7 {
		t.Error("--var must win over the var file")
	}
}

// TestJSONSyntax loads the same pipeline written in both syntaxes.
func TestJSONSyntax(t *testing.T) {
	native := mustLoad(t, &graph.Loader{}, "../specs/seed.hcl")
	js := mustLoad(t, &graph.Loader{}, "testdata/seed.hcl.json")
	var a, b bytes.Buffer
	graph.Render(&a, native, "text")
	graph.Render(&b, js, "text")
	if a.String() != b.String() {
		t.Errorf("JSON and native differ:\n%s\n---\n%s", a.String(), b.String())
	}
}

func TestDiagnosticsJSON(t *testing.T) {
	l := &graph.Loader{Catalog: testRegistry()}
	_, diags := l.LoadFile("testdata/validate/unknown_stage.hcl")
	var b bytes.Buffer
	if err := graph.WriteDiagnosticsJSON(&b, diags, l.Sources()); err != nil {
		t.Fatal(err)
	}
	var got struct {
		FormatVersion string `json:"format_version"`
		Valid         bool
		ErrorCount    int `json:"error_count"`
		WarningCount  int `json:"warning_count"`
		Diagnostics   []struct {
			Severity, Summary, Detail string
			Range                     struct {
				Filename string
				Start    struct{ Line, Column, Byte int }
			}
			Snippet struct {
				Context              *string
				Code                 string
				StartLine            int `json:"start_line"`
				HighlightStartOffset int `json:"highlight_start_offset"`
				HighlightEndOffset   int `json:"highlight_end_offset"`
			}
		}
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if got.FormatVersion != "1.0" || got.Valid || got.ErrorCount != 1 || got.WarningCount != 1 {
		t.Fatalf("header: %+v", got)
	}
	var d = got.Diagnostics[1]
	if d.Severity != "error" || d.Range.Start.Line != 22 || d.Range.Start.Column != 10 {
		t.Errorf("diagnostic: %+v", d)
	}
	if hl := d.Snippet.Code[d.Snippet.HighlightStartOffset:d.Snippet.HighlightEndOffset]; hl != "targt" {
		t.Errorf("highlight = %q, want targt", hl)
	}
	// As Terraform's: the enclosing block.
	if c := d.Snippet.Context; c == nil || *c != `edge "hs"` {
		t.Errorf("snippet context = %v, want edge \"hs\"", c)
	}
}

func TestCycles(t *testing.T) {
	l := &graph.Loader{Catalog: testRegistry()}
	src, _ := os.ReadFile("testdata/validate/cycle.hcl")
	_, diags := l.Load("cycle.hcl", src)
	if !diags.HasErrors() || !strings.Contains(diags.Error(), "a -> b -> c -> a") {
		t.Fatalf("want the loop named, got %v", diags)
	}
	err := &graph.CycleError{Stages: []string{"a", "b"}, Edges: []string{"ab", "ba"}}
	if err.Error() != "graph: cycle a -> b -> a" {
		t.Errorf("CycleError = %q", err.Error())
	}
}

func TestDistribution(t *testing.T) {
	for _, tc := range []struct {
		in   string
		mean time.Duration
	}{
		{"40ms", 40 * time.Millisecond},
		{"uniform(10ms, 30ms)", 20 * time.Millisecond},
		{"exponential(5ms)", 5 * time.Millisecond},
		{"normal(50ms, 5ms)", 50 * time.Millisecond},
		{"lognormal(40ms, 0.2)", 40 * time.Millisecond},
	} {
		d, err := graph.ParseDistribution(tc.in)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if d.Mean() != tc.mean {
			t.Errorf("%s: Mean = %v", tc.in, d.Mean())
		}
		r := rand.New(rand.NewPCG(1, 2))
		var sum time.Duration
		const n = 20000
		for range n {
			s := d.Sample(r)
			if s < 0 {
				t.Fatalf("%s: negative sample", tc.in)
			}
			sum += s
		}
		if got := sum / n; got < tc.mean*97/100 || got > tc.mean*103/100 {
			t.Errorf("%s: sample mean %v, want about %v", tc.in, got, tc.mean)
		}
	}
	for _, bad := range []string{"", "fast", "-1ms", "uniform(1ms)", "gamma(1ms, 2)", "lognormal(1ms, x)", "uniform(2ms, 1ms", "normal(1ms, -1ms)"} {
		if _, err := graph.ParseDistribution(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestRender(t *testing.T) {
	g := mustLoad(t, &graph.Loader{}, "../specs/fan.hcl")
	for _, f := range graph.Formats {
		var b bytes.Buffer
		if err := graph.Render(&b, g, f); err != nil {
			t.Fatal(err)
		}
		golden := filepath.Join("testdata", "render", "fan."+f)
		if *update {
			os.MkdirAll(filepath.Dir(golden), 0o755)
			os.WriteFile(golden, b.Bytes(), 0o644)
		}
		want, _ := os.ReadFile(golden)
		if b.String() != string(want) {
			t.Errorf("%s differs from %s:\n%s", f, golden, b.String())
		}
	}
	if err := graph.Render(&bytes.Buffer{}, g, "svg"); err == nil {
		t.Error("unknown format: want an error")
	}
}

// TestSpecsValidate keeps every shipped spec valid, without warnings,
// against every built-in node kind. Specs name files relative to the
// repository root (the directory dflow runs in), so the test runs there.
// A spec with plugin blocks is validated where its plugins are loaded
// (specs/dflash-torch.hcl: plugins/examples/torch's TestDFlashTorchDDP).
func TestSpecsValidate(t *testing.T) {
	t.Chdir("..")
	files, _ := filepath.Glob("specs/*.hcl")
	if len(files) < 4 {
		t.Fatalf("only %d specs", len(files))
	}
	full := testRegistry()
	text.Register(full)
	lm.Register(full)
	dflash.Register(full)
	for _, f := range files {
		var plugins []string
		_, diags := load(t, &graph.Loader{Catalog: full, Plugins: func(declared []*graph.Plugin, _ []string) hcl.Diagnostics {
			for _, p := range declared {
				plugins = append(plugins, p.Name)
			}
			return nil
		}}, f)
		if len(plugins) > 0 {
			t.Logf("%s uses plugins %v: validated where they are loaded", f, plugins)
			continue
		}
		for _, d := range diags {
			if d.Severity == hcl.DiagError {
				t.Errorf("%s: %s: %s", f, d.Summary, d.Detail)
			}
			if d.Severity == hcl.DiagWarning {
				t.Errorf("%s: shipped specs should not warn: %s", f, d.Detail)
			}
		}
	}
}

// TestPipelineLease: the pipeline block's lease is a duration, read into
// the graph; anything else is an error at the attribute.
func TestPipelineLease(t *testing.T) {
	load := func(lease string) (*graph.Graph, hcl.Diagnostics) {
		src := "pipeline \"p\" {\n  lease = " + lease + "\n}\nstage \"src\" {\n  node = \"synthetic_source\"\n  config {\n    count = 1\n  }\n}\nstage \"dst\" {\n  node = \"sink\"\n}\nedge \"e\" {\n  from = src.out\n  to   = dst.in\n}\n"
		return (&graph.Loader{Catalog: testRegistry()}).Load("lease.hcl", []byte(src))
	}
	g, diags := load(`"12s"`)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if g.Lease != 12*time.Second {
		t.Errorf("lease %v, want 12s", g.Lease)
	}
	for _, bad := range []string{`"soon"`, `"-1s"`, `"0s"`} {
		_, diags := load(bad)
		if !diags.HasErrors() || !strings.Contains(diags.Error(), "lease.hcl:2") || !strings.Contains(diags.Error(), "invalid lease") {
			t.Errorf("lease = %s: %v", bad, diags)
		}
	}
}
