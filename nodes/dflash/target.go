package dflash

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/text"
)

func init() { Register(nodes.Default) }

// Register adds target_forward and drafter_train to a registry.
func Register(r *nodes.Registry) {
	// target_forward keeps nothing between batches that a restart would
	// lose: its weights are frozen and loaded from their file at the start,
	// and a batch's hidden states are a function of the batch, so on a
	// cluster a replica lost with its worker restarts on a live one.
	r.Register(nodes.Spec{Kind: targetKind, New: newTarget, Stateless: true})
	r.Register(nodes.Spec{Kind: drafterKind, New: newDrafter, Outputs: drafterOutputs, Sync: nodes.Always, Moves: true})
}

// HiddenType names the hidden-state items of a target of width d tapped at
// the given blocks: "hidden_states(d=128,layers=0,2,3)". Target and drafter
// must agree, and validation compares the two ends' types, so a width or
// tap mismatch is caught before a run.
func HiddenType(d int, layers []int) string {
	s := make([]string, len(layers))
	for i, l := range layers {
		s[i] = fmt.Sprint(l)
	}
	return fmt.Sprintf("hidden_states(d=%d,layers=%s)", d, strings.Join(s, ","))
}

// HiddenStates is one batch as the target saw it (defined in package
// items, with its wire encoding).
type HiddenStates = items.HiddenStates

// DefaultLayers spaces k taps evenly through a model of n layers, first to
// last block, as DFlash does.
func DefaultLayers(n, k int) []int { return nn.DefaultTaps(n, k) }

var targetKind = graph.Kind{
	Name: "target_forward",
	Doc:  "Runs a frozen safetensors target LM on token batches; emits the hidden states of chosen layers and its greedy next tokens.",
	Config: []graph.Field{
		{Name: "model", Type: graph.String, Required: true, Path: graph.ReadPath, Doc: "the target model (safetensors, from lm_train)"},
		{Name: "layers", Type: graph.NumberList, Doc: "block indices to tap (0-based); default: 3 spread evenly from first to last"},
	},
	Ports: func(cfg *graph.Config) []graph.PortSpec {
		t := "hidden_states"
		if c, err := nn.ReadConfig(cfg.String("model")); err == nil {
			t = HiddenType(c.DModel, tapLayers(cfg, c))
		}
		return []graph.PortSpec{
			{Name: "in", Dir: graph.In, Type: text.TokensType, Doc: "token batches"},
			{Name: "hidden", Dir: graph.Out, Type: t, Doc: "*items.HiddenStates"},
		}
	},
	Check: func(cfg *graph.Config) []error {
		c, err := nn.ReadConfig(cfg.String("model"))
		if err != nil {
			return []error{&graph.FieldError{Field: "model", Err: err}}
		}
		for _, l := range cfg.Floats("layers") {
			if l < 0 || int(l) >= c.Layers || l != float64(int(l)) {
				return []error{&graph.FieldError{Field: "layers", Err: fmt.Errorf("layer %g is not a block of the %d-layer target", l, c.Layers)}}
			}
		}
		return nil
	},
}

func tapLayers(cfg *graph.Config, c nn.Config) []int {
	if fs := cfg.Floats("layers"); len(fs) > 0 {
		out := make([]int, len(fs))
		for i, f := range fs {
			out[i] = int(f)
		}
		return out
	}
	return DefaultLayers(c.Layers, 3)
}

// target shares one read-only copy of the weights among its replicas;
// each replica has its own workspace.
type target struct {
	m      *nn.Model // on the CPU: the config, and the replicas placed there
	path   string
	layers []int
}

var (
	loadedMu sync.Mutex
	loaded   = map[[3]string]*nn.Model{} // by path, content hash and device
)

// loadShared loads a model once per process and content (a file replaced
// in between is loaded anew); callers must not modify it.
func loadShared(path string) (*nn.Model, error) {
	m, _, err := loadSharedHash(path)
	return m, err
}

// loadSharedHash is loadShared that also returns the file's SHA-256.
func loadSharedHash(path string) (*nn.Model, string, error) { return loadSharedOn(path, "cpu") }

// loadSharedOn is loadSharedHash onto a device ("cpu", "cuda:N"): one
// read-only copy of the weights per device, which that device's replicas
// share (each with a backend of its own: its own stream).
func loadSharedOn(path, dev string) (*nn.Model, string, error) {
	loadedMu.Lock()
	defer loadedMu.Unlock()
	h, err := nn.FileSHA256(path)
	if err != nil {
		return nil, "", fmt.Errorf("nn: %w", err)
	}
	key := [3]string{path, h, dev}
	if m, ok := loaded[key]; ok {
		return m, h, nil
	}
	be, err := nn.ForDevice(dev)
	if err != nil {
		return nil, "", err
	}
	m, _, err := nn.LoadModelOn(be, path)
	if err != nil {
		return nil, "", err
	}
	loaded[key] = m
	return m, h, nil
}

func newTarget(cfg *graph.Config) (nodes.Node, error) {
	m, err := loadShared(cfg.String("model"))
	if err != nil {
		return nil, err
	}
	return &target{m: m, path: cfg.String("model"), layers: tapLayers(cfg, m.Config)}, nil
}

func (t *target) Run(ctx context.Context, r nodes.Replica) error {
	in, out := r.In("in"), r.Out("hidden")
	// The replica runs on its device: the weights loaded there once, and
	// a backend (a stream) of its own.
	m, _, err := loadSharedOn(t.path, r.Device())
	if err != nil {
		return fmt.Errorf("target_forward: %w", err)
	}
	be, err := nn.ForDevice(r.Device())
	if err != nil {
		return fmt.Errorf("target_forward: %w", err)
	}
	var w *nn.Workspace
	var greedy nn.Ints
	for {
		item, err := in.Recv(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		b, ok := item.(*text.Batch)
		if !ok {
			return fmt.Errorf("target_forward: got %T, want *text.Batch", item)
		}
		if w == nil || w.B != b.B || w.T != b.T {
			if w != nil {
				w.Free()
				be.FreeInts(greedy)
			}
			if w, err = m.NewWorkspaceOn(be, b.B, b.T); err != nil {
				return fmt.Errorf("target_forward: %w", err)
			}
			greedy = be.AllocInts(b.B * b.T)
		}
		hs := t.forward(w, be, greedy, b)
		if err := out.Send(ctx, hs); err != nil {
			return err
		}
	}
}

// forward runs the target on one batch and packs what the drafter needs.
// greedy holds B*T values on be, the workspace's backend.
func (t *target) forward(w *nn.Workspace, be nn.Backend, greedy nn.Ints, b *text.Batch) *HiddenStates {
	c := t.m.Config
	N, D, K := b.B*b.T, c.DModel, len(t.layers)
	hs := &HiddenStates{B: b.B, T: b.T, K: K, D: D, Seq: b.Seq,
		Hidden: make([]float32, N*K*D), Tokens: make([]int32, N), Greedy: make([]int32, N)}
	b.Inputs(hs.Tokens)
	logits := w.Forward(hs.Tokens)
	// The item on the edge is on the host: the tapped layers and the
	// greedy tokens cross once per batch (docs/models.md: what crosses
	// between a target and a drafter on one GPU, and why).
	for k, l := range t.layers {
		h := w.Hidden(l)
		for n := 0; n < N; n++ {
			be.ToHost(hs.Hidden[(n*K+k)*D:(n*K+k+1)*D], h.Slice(n*D, D))
		}
	}
	be.ArgmaxRows(greedy, logits, N, c.Vocab)
	be.IntsToHost(hs.Greedy, greedy)
	return hs
}
