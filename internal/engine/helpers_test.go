package engine

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/report"
	"github.com/zclconf/go-cty/cty"
)

// The test node kind "t" plays any role:
//
//	role = "source": emits count items (ids replica<<32 | seq) on out
//	role = "work":   forwards every item from in to out
//	role = "sink":   records every item it receives
//
// with optional jitter (random sleeps up to jitter_us), fail_after (return
// an error after that many items), panic_after, quit_after (return nil
// early, without reading the rest), start_delay_ms (sleep before starting)
// and stuck (block ignoring ctx until the test releases it).
var testKind = graph.Kind{
	Name: "t",
	Config: []graph.Field{
		{Name: "role", Type: graph.String, Default: cty.StringVal("work")},
		{Name: "count", Type: graph.Int, Default: cty.NumberIntVal(0)},
		{Name: "jitter_us", Type: graph.Int, Default: cty.NumberIntVal(0)},
		{Name: "fail_after", Type: graph.Int, Default: cty.NumberIntVal(-1)},
		{Name: "panic_after", Type: graph.Int, Default: cty.NumberIntVal(-1)},
		{Name: "quit_after", Type: graph.Int, Default: cty.NumberIntVal(-1)},
		{Name: "start_delay_ms", Type: graph.NumberList},
		{Name: "stuck", Type: graph.Bool, Default: cty.False},
		{Name: "keyed", Type: graph.Bool, Default: cty.False},
	},
	Ports: func(cfg *graph.Config) []graph.PortSpec {
		var ps []graph.PortSpec
		if cfg.String("role") != "source" {
			ps = append(ps, graph.PortSpec{Name: "in", Dir: graph.In, Type: graph.Any})
		}
		if cfg.String("role") != "sink" {
			ps = append(ps, graph.PortSpec{Name: "out", Dir: graph.Out, Type: "id"})
		}
		return ps
	},
}

// received collects what sinks saw, by stage then item id.
type received struct {
	mu     sync.Mutex
	counts map[string]map[uint64]int
}

func (rc *received) add(stage string, id uint64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.counts[stage] == nil {
		rc.counts[stage] = map[uint64]int{}
	}
	rc.counts[stage][id]++
}

type testNode struct {
	cfg   *graph.Config
	got   *received
	stuck chan struct{}
}

func (n *testNode) Run(ctx context.Context, r nodes.Replica) error {
	cfg := n.cfg
	if delays := cfg.Floats("start_delay_ms"); len(delays) > 0 {
		time.Sleep(time.Duration(delays[r.Index()%len(delays)] * float64(time.Millisecond)))
	}
	if cfg.Bool("stuck") {
		<-n.stuck // deliberately ignores ctx
		return nil
	}
	rng := rand.New(rand.NewPCG(uint64(r.Index()), 7))
	jitter := func() {
		if j := cfg.Int("jitter_us"); j > 0 {
			time.Sleep(time.Duration(rng.IntN(j)) * time.Microsecond)
		}
	}
	check := func(done int) error {
		if cfg.Int("fail_after") == done {
			return fmt.Errorf("failing on purpose after %d items", done)
		}
		if cfg.Int("panic_after") == done {
			panic(fmt.Sprintf("panicking on purpose after %d items", done))
		}
		return nil
	}
	role := cfg.String("role")
	if role == "source" {
		out := r.Out("out")
		n := synthetic.Share(cfg.Int("count"), r.Index(), r.Replicas())
		for seq := 0; seq < n; seq++ {
			if err := check(seq); err != nil {
				return err
			}
			jitter()
			var item any = uint64(r.Index())<<32 | uint64(seq)
			if cfg.Bool("keyed") {
				item = keyedID(item.(uint64))
			}
			if err := out.Send(ctx, item); err != nil {
				return err
			}
		}
		return nil
	}
	in := r.In("in")
	for done := 0; ; done++ {
		if err := check(done); err != nil {
			return err
		}
		if cfg.Int("quit_after") == done {
			return nil
		}
		item, err := in.Recv(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		jitter()
		if role == "sink" {
			n.got.add(r.Stage(), idOf(item))
			continue
		}
		if err := r.Out("out").Send(ctx, item); err != nil {
			return err
		}
	}
}

// harness runs specs written inline against the test kinds.
type harness struct {
	t     *testing.T
	reg   *nodes.Registry
	got   *received
	stuck chan struct{}
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, reg: nodes.NewRegistry(), got: &received{counts: map[string]map[uint64]int{}}, stuck: make(chan struct{})}
	synthetic.Register(h.reg)
	h.reg.Register(nodes.Spec{Kind: testKind, New: func(cfg *graph.Config) (nodes.Node, error) {
		return &testNode{cfg: cfg, got: h.got, stuck: h.stuck}, nil
	}})
	return h
}

func (h *harness) load(src string, sets ...string) *graph.Graph {
	h.t.Helper()
	l := &graph.Loader{Catalog: h.reg, Sets: sets}
	g, diags := l.Load("test.hcl", []byte(src))
	if diags.HasErrors() {
		var b bytes.Buffer
		graph.WriteDiagnostics(&b, diags, l.Sources())
		h.t.Fatalf("spec:\n%s\n%s", src, b.String())
	}
	return g
}

// run executes g with a deadline, so a hang fails the test instead of
// stalling it.
func (h *harness) run(g *graph.Graph, opts Options) (*report.Report, error) {
	h.t.Helper()
	opts.Registry = h.reg
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Run(ctx, g, opts)
	if ctx.Err() == context.DeadlineExceeded {
		h.t.Fatalf("run hung: %v", err)
	}
	return rep, err
}

// deliveredOnce asserts that the sink stage got n distinct items, each
// exactly once.
func (h *harness) deliveredOnce(stage string, n int) {
	h.t.Helper()
	got := h.got.counts[stage]
	if len(got) != n {
		h.t.Fatalf("%s got %d distinct items, want %d", stage, len(got), n)
	}
	for id, k := range got {
		if k != 1 {
			h.t.Fatalf("item %x delivered %d times", id, k)
		}
	}
}

// checkBalanced asserts produced == consumed on every edge.
func checkBalanced(t *testing.T, rep *report.Report) {
	t.Helper()
	for name, e := range rep.Edges {
		if e.Produced != e.Consumed {
			t.Errorf("edge %s: produced %d, consumed %d", name, e.Produced, e.Consumed)
		}
	}
}

// keyedID is a test id with a key (its decimal digits), for key_hash
// edges.
type keyedID uint64

func (k keyedID) Key() string { return strconv.FormatUint(uint64(k), 10) }

// idOf identifies an item: test ids as they are, synthetic blobs by
// replica and sequence.
func idOf(item any) uint64 {
	switch b := item.(type) {
	case *synthetic.Blob:
		return uint64(b.Replica)<<32 | uint64(b.Seq)
	case keyedID:
		return uint64(b)
	}
	return item.(uint64)
}
