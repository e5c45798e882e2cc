package lm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/internal/nn/reduce"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/text"
	"github.com/zclconf/go-cty/cty"
)

func init() { Register(nodes.Default) }

// Register adds lm_train to a registry.
func Register(r *nodes.Registry) {
	r.Register(nodes.Spec{Kind: trainKind, New: newTrainer, Sync: nodes.Always, Moves: true,
		Outputs: func(cfg *graph.Config) []string { return []string{cfg.String("out")} }})
}

var trainKind = graph.Kind{
	Name: "lm_train",
	Doc:  "Trains the byte-level target LM on token batches (replicas train one model data-parallel) and saves it as safetensors.",
	Config: append(append([]graph.Field{}, text.CorpusFields...),
		graph.Field{Name: "out", Type: graph.String, Required: true, Path: graph.WritePath, Doc: "the safetensors file to write (checkpoints and the final model)"},
		graph.Field{Name: "overwrite", Type: graph.Bool, Default: cty.False, Doc: "replace out when another run wrote it (otherwise the run refuses to start)"},
		graph.Field{Name: "d_model", Type: graph.Int, Default: cty.NumberIntVal(128), Doc: "model width"},
		graph.Field{Name: "layers", Type: graph.Int, Default: cty.NumberIntVal(4), Doc: "transformer blocks"},
		graph.Field{Name: "heads", Type: graph.Int, Default: cty.NumberIntVal(4), Doc: "attention heads"},
		graph.Field{Name: "hidden", Type: graph.Int, Default: cty.NumberIntVal(352), Doc: "SwiGLU width"},
		graph.Field{Name: "max_seq", Type: graph.Int, Default: cty.NumberIntVal(128), Doc: "longest sequence the model takes"},
		graph.Field{Name: "lr", Type: graph.Number, Default: cty.NumberFloatVal(3e-3), Doc: "peak learning rate"},
		graph.Field{Name: "warmup", Type: graph.Int, Default: cty.NumberIntVal(30), Doc: "steps of linear warmup"},
		graph.Field{Name: "steps", Type: graph.Int, Default: cty.NumberIntVal(0), Doc: "length of the cosine schedule (0: constant after warmup)"},
		graph.Field{Name: "weight_decay", Type: graph.Number, Default: cty.NumberFloatVal(0.1), Doc: "AdamW weight decay on matrices"},
		graph.Field{Name: "checkpoint_every", Type: graph.Int, Default: cty.NumberIntVal(0), Doc: "also save every N steps, with the optimizer's state (0: only at the end)"},
		graph.Field{Name: "eval_batches", Type: graph.Int, Default: cty.NumberIntVal(16), Doc: "held-out sequences (of the batch's length) to evaluate on at the end"},
		graph.Field{Name: "init_seed", Type: graph.Int, Default: cty.NumberIntVal(1), Doc: "seed of the weights' initialization"},
	),
	Metrics: []graph.Metric{
		{Name: "loss", Merge: graph.MergeMean, Doc: "next-byte cross-entropy (nats) on the replica's latest batch"},
		{Name: "loss_initial", Merge: graph.MergeLast, Doc: "the lead's loss on its first batch"},
		{Name: "step", Merge: graph.MergeMax, Doc: "optimizer steps the group has taken"},
		{Name: "batches", Merge: graph.MergeMax, Doc: "batches whose gradients the model holds (each step adds the replicas that took part; a checkpoint records it)"},
		{Name: "tokens_per_s", Merge: graph.MergeLast, Doc: "training tokens a second, the group's, measured by the lead"},
		{Name: "eval_bpb", Merge: graph.MergeLast, Doc: "held-out bits per byte of the final model"},
		{Name: "ngram_bpb", Merge: graph.MergeLast, Doc: "held-out bits per byte of an order-3 byte n-gram, a baseline"},
	},
	Ports: func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: text.TokensType, Doc: "token batches from text_reader"}}
	},
	Check: func(cfg *graph.Config) []error {
		var errs []error
		c := modelConfig(cfg)
		if err := c.Validate(); err != nil {
			errs = append(errs, err)
		}
		if err := text.CheckPath(cfg.String("path")); err != nil {
			errs = append(errs, &graph.FieldError{Field: "path", Err: err}) // before any work, as text_reader's
		}
		return errs
	},
}

func modelConfig(cfg *graph.Config) nn.Config {
	return nn.Config{Vocab: 256, DModel: cfg.Int("d_model"), Layers: cfg.Int("layers"), Heads: cfg.Int("heads"),
		Hidden: cfg.Int("hidden"), MaxSeq: cfg.Int("max_seq")}
}

// trainer is the stage; the group's last member (nodes.Group.Finish)
// saves the final model and evaluates it, or saves it on the way out of
// a cancelled run, wherever the replicas run.
type trainer struct {
	cfg    *graph.Config
	model  nn.Config
	corpus *text.Corpus
	out    *nn.Output
}

func newTrainer(cfg *graph.Config) (nodes.Node, error) {
	// Before any work: a model another run wrote is not replaced unasked.
	out, err := nn.ClaimOutput(cfg.String("out"), cfg.Bool("overwrite"),
		fmt.Sprintf(`Set overwrite = true in the stage's config to replace it (--set stage.%s.config.overwrite=true; with specs/pretrain.hcl, --var overwrite=true), or write elsewhere with out = "FILE".`, cfg.Stage()))
	if err != nil {
		return nil, err
	}
	c, err := text.LoadCorpus(cfg)
	if err != nil {
		return nil, err
	}
	return &trainer{cfg: cfg, model: modelConfig(cfg), corpus: c, out: out}, nil
}

// replicaState is one replica's copy of the model, kept identical across
// replicas by applying the same averaged gradient.
type replicaState struct {
	m    *nn.Model
	w    *nn.Workspace
	opt  *nn.AdamW
	mask nn.Buffer
	in   []int32
	tgt  []int32
	// batches counts the batches whose gradients the model holds: the
	// replicas that took part, summed over its steps
	batches int
}

func (t *trainer) Run(ctx context.Context, r nodes.Replica) error {
	be, err := nn.ForDevice(r.Device()) // the replica's device, a backend (a stream) of its own
	if err != nil {
		return fmt.Errorf("lm_train: %w", err)
	}
	m, err := nn.NewModelOn(be, t.model, uint64(t.cfg.Int("init_seed")))
	if err != nil {
		return err
	}
	st := &replicaState{m: m, opt: nn.NewAdamW(m.Backend(), m.Params.Len(), float32(t.cfg.Float("lr"))), mask: m.DecayMask()}
	st.opt.WeightDecay = float32(t.cfg.Float("weight_decay"))
	in, group, metrics := r.In("in"), r.Group(), r.Metrics()
	defer group.Leave()
	start := time.Now()
	var step, tokens int
	every := t.cfg.Int("checkpoint_every")
	// Checkpoints every so many steps are the group's saves: on a
	// cluster, what it trained on is settled only once a save holds it,
	// so a group lost whole restores its last save.
	if every > 0 {
		if err := group.Saves(ctx); err != nil {
			return fmt.Errorf("lm_train: %w", err)
		}
	}
	// A replica restarted elsewhere (a cluster's worker lost) takes the
	// group's weights, optimizer state and step over here, or, the group
	// lost whole, restores its last save.
	if err := group.Keep(ctx, nn.TrainState{Params: st.m.Params, Opt: st.opt, Step: &step, Batches: &st.batches}); err != nil {
		var re *nodes.Restore
		if !errors.As(err, &re) {
			return fmt.Errorf("lm_train: %w", err)
		}
		if step, err = t.restore(st, re.Step); err != nil {
			return err
		}
	}
	for {
		item, err := in.Recv(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return t.saveOnCancel(ctx, group, st, step, err)
		}
		b, ok := item.(*text.Batch)
		if !ok {
			return fmt.Errorf("lm_train: got %T, want *text.Batch", item)
		}
		before := st.batches
		loss, err := t.step(ctx, st, b, step, r)
		if err != nil {
			return t.saveOnCancel(ctx, group, st, step, err)
		}
		step++
		tokens += (st.batches - before) * b.B * b.T // the group's step
		metrics.Set("loss", loss)
		metrics.Set("step", float64(step))
		metrics.Set("batches", float64(st.batches))
		if r.Index() == 0 {
			if step == 1 {
				metrics.Set("loss_initial", loss)
			}
			metrics.Set("tokens_per_s", float64(tokens)/time.Since(start).Seconds())
			if every > 0 && step%every == 0 {
				if err := t.checkpoint(st, step); err != nil {
					return err
				}
				if err := group.Saved(ctx, step); err != nil {
					return t.saveOnCancel(ctx, group, st, step, err)
				}
			}
		}
	}
	// The last member to leave holds every update: the others left the
	// group once their input ended, and it trained on without them.
	if last, err := group.Finish(ctx); err != nil || !last || st.w == nil {
		return err
	}
	if err := t.save(st.m, step); err != nil {
		return err
	}
	return t.evaluate(st, metrics)
}

// step trains on one batch: forward, backward, all-reduce of gradients
// over the replicas still training, AdamW.
func (t *trainer) step(ctx context.Context, st *replicaState, b *text.Batch, step int, r nodes.Replica) (float64, error) {
	if st.w == nil || st.w.B != b.B || st.w.T != b.T {
		w, err := st.m.NewWorkspace(b.B, b.T)
		if err != nil {
			return 0, fmt.Errorf("lm_train: %w", err)
		}
		st.w, st.in, st.tgt = w, make([]int32, b.B*b.T), make([]int32, b.B*b.T)
	}
	b.Inputs(st.in)
	b.Targets(st.tgt)
	st.w.Forward(st.in)
	loss := st.w.Loss(st.tgt, nil)
	st.m.ZeroGrad()
	st.w.Backward(st.tgt, nil)
	took, err := nodes.AllReduceMean(ctx, r, reduce.Of(st.m.Grads))
	if err != nil {
		return 0, err
	}
	st.batches += took
	st.opt.LR = float32(t.lr(step))
	st.opt.Step(st.m.Params, st.m.Grads, st.mask)
	return loss, nil
}

// lr is linear warmup then cosine decay to a tenth over `steps`.
func (t *trainer) lr(step int) float64 {
	peak, warm, total := t.cfg.Float("lr"), t.cfg.Int("warmup"), t.cfg.Int("steps")
	if step < warm {
		return peak * float64(step+1) / float64(warm)
	}
	if total <= warm {
		return peak
	}
	p := math.Min(1, float64(step-warm)/float64(total-warm))
	return peak * (0.1 + 0.9*0.5*(1+math.Cos(math.Pi*p)))
}

// saveOnCancel returns err, the error that ends a replica; when the run
// was cancelled (a failure elsewhere, a deadlock, an abort) the group's
// last member first writes its model as of its last completed step (the
// members still in the group hold the same weights: a step applies its
// update only once its all-reduce has answered).
func (t *trainer) saveOnCancel(ctx context.Context, group nodes.Group, st *replicaState, step int, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if last, _ := group.Finish(ctx); !last || step == 0 {
		return err
	}
	if serr := t.save(st.m, step); serr != nil {
		return fmt.Errorf("%w; and saving the model on the way out failed: %v", err, serr)
	}
	return err
}

func (t *trainer) save(m *nn.Model, step int) error {
	if err := t.out.Check(); err != nil {
		return fmt.Errorf("lm_train: %w", err)
	}
	if err := m.Save(t.cfg.String("out"), t.meta(step)); err != nil {
		return fmt.Errorf("lm_train: %w", err)
	}
	return nil
}

func (t *trainer) meta(step int) map[string]string {
	meta := nn.RunMetadata(t.cfg.Range("out").Filename)
	meta["steps"], meta["corpus"] = strconv.Itoa(step), t.cfg.String("path")
	return meta
}

// checkpoint saves the model as of step with AdamW's state and the
// batches it holds: what a group lost whole restores (restore).
func (t *trainer) checkpoint(st *replicaState, step int) error {
	if err := t.out.Check(); err != nil {
		return fmt.Errorf("lm_train: %w", err)
	}
	meta := t.meta(step)
	meta["batches"] = strconv.Itoa(st.batches)
	if err := st.m.SaveTraining(t.cfg.String("out"), st.opt, meta); err != nil {
		return fmt.Errorf("lm_train: checkpoint: %w", err)
	}
	return nil
}

// restore puts the group's save of step into the replica's state and
// returns the step it resumes from: a group lost whole on a cluster,
// restarted (step < 0: nothing was saved, and the state it started with
// is the group's).
func (t *trainer) restore(st *replicaState, step int) (int, error) {
	if step < 0 {
		return 0, nil
	}
	path := t.cfg.String("out")
	m, meta, err := nn.LoadTrainingOn(st.m.Backend(), path, st.opt)
	if err != nil {
		return 0, fmt.Errorf("lm_train: the group was lost whole and restores its save of step %d: %w (a restart on another host reads the checkpoint at the same path: a shared filesystem)", step, err)
	}
	if got := meta["steps"]; got != strconv.Itoa(step) || meta["opt.t"] == "" {
		return 0, fmt.Errorf("lm_train: the group was lost whole and restores its save of step %d, but %s holds step %s (optimizer state %q)", step, path, got, meta["opt.t"])
	}
	st.m.Backend().Copy(st.m.Params, m.Params)
	st.batches, _ = strconv.Atoi(meta["batches"])
	return step, nil
}

// evaluate measures held-out bits per byte of the model and of an order-3
// byte n-gram counted on (up to 4 MiB of) the training text.
func (t *trainer) evaluate(st *replicaState, metrics nodes.Metrics) error {
	bpb, err := evalBitsPerByte(st.m, t.corpus.Held, st.w.T, t.cfg.Int("eval_batches"))
	if errors.Is(err, errNoHeldOut) {
		return nil
	}
	if err != nil {
		return err
	}
	metrics.Set("eval_bpb", bpb)
	ng := text.NewNGram(t.corpus.Train[:min(len(t.corpus.Train), 4<<20)], 3)
	metrics.Set("ngram_bpb", ngramBitsPerByte(ng, t.corpus.Held, st.w.T, t.cfg.Int("eval_batches")))
	return nil
}

var errNoHeldOut = errors.New("no held-out text")

// evalWindows are the held-out sequences both models are scored on:
// n evenly spaced windows of T+1 bytes.
func evalWindows(held []byte, T, n int) [][]byte {
	stride := len(held) / max(n, 1)
	var out [][]byte
	for i := 0; i < n && i*stride+T+1 <= len(held); i++ {
		out = append(out, held[i*stride:i*stride+T+1])
	}
	return out
}

// evalBitsPerByte is the model's mean -log2 p(next byte) over n held-out
// windows of T+1 bytes.
func evalBitsPerByte(m *nn.Model, held []byte, T, n int) (float64, error) {
	wins := evalWindows(held, T, n)
	if len(wins) == 0 {
		return 0, errNoHeldOut
	}
	w, err := m.NewWorkspace(1, T)
	if err != nil {
		return 0, err
	}
	in, tgt := make([]int32, T), make([]int32, T)
	var sum float64
	for _, win := range wins {
		for j := 0; j < T; j++ {
			in[j], tgt[j] = int32(win[j]), int32(win[j+1])
		}
		w.Forward(in)
		sum += w.Loss(tgt, nil)
	}
	return sum / float64(len(wins)) / math.Ln2, nil
}

// ngramBitsPerByte scores the same windows with an n-gram model (context
// limited to the window, as the neural model's is).
func ngramBitsPerByte(ng *text.NGram, held []byte, T, n int) float64 {
	wins := evalWindows(held, T, n)
	var sum float64
	for _, win := range wins {
		sum += ng.BitsPerByte(win, 1)
	}
	return sum / float64(max(len(wins), 1))
}
