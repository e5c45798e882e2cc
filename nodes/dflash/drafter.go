package dflash

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strconv"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/internal/nn/reduce"
	"github.com/dflow-dev/dflow/internal/speceval"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/text"
	"github.com/dflow-dev/dflow/report"
	"github.com/zclconf/go-cty/cty"
)

var drafterKind = graph.Kind{
	Name: "drafter_train",
	Doc:  "Trains a DFlash-style block drafter on a target's hidden states; replicas train one model data-parallel.",
	Config: []graph.Field{
		{Name: "target", Type: graph.String, Path: graph.ReadPath, Default: cty.StringVal("models/target.safetensors"), Doc: "the target model whose embedding and head the drafter reuses (frozen)"},
		{Name: "target_layers", Type: graph.Int, Default: cty.NumberIntVal(3), Doc: "how many target layers the hidden states carry, spaced evenly (as target_forward's default)"},
		{Name: "taps", Type: graph.NumberList, Doc: "the target blocks the hidden states come from, when target_forward sets its layers; overrides target_layers"},
		{Name: "block_size", Type: graph.Int, Default: cty.NumberIntVal(4), Doc: "tokens per block: the anchor and block_size-1 drafted"},
		{Name: "layers", Type: graph.Int, Default: cty.NumberIntVal(1), Doc: "drafter blocks"},
		{Name: "heads", Type: graph.Int, Default: cty.NumberIntVal(4), Doc: "attention heads"},
		{Name: "hidden", Type: graph.Int, Default: cty.NumberIntVal(256), Doc: "SwiGLU width"},
		{Name: "anchors", Type: graph.Int, Default: cty.NumberIntVal(16), Doc: "anchor positions sampled per sequence"},
		{Name: "gamma", Type: graph.Number, Default: cty.NumberFloatVal(4), Doc: "loss weight of drafted position k is exp(-(k-1)/gamma)"},
		{Name: "lr", Type: graph.Number, Default: cty.NumberFloatVal(3e-3), Doc: "peak learning rate"},
		{Name: "warmup", Type: graph.Int, Default: cty.NumberIntVal(20), Doc: "steps of linear warmup"},
		{Name: "weight_decay", Type: graph.Number, Default: cty.NumberFloatVal(0.01), Doc: "AdamW weight decay on matrices"},
		{Name: "checkpoint", Type: graph.String, Path: graph.WritePath, Default: cty.StringVal(""), Doc: "safetensors file to save to (every checkpoint_every steps, on drain and at the end); \"\": none"},
		{Name: "checkpoint_every", Type: graph.Int, Default: cty.NumberIntVal(100), Doc: "steps between checkpoints"},
		{Name: "resume", Type: graph.Bool, Default: cty.False, Doc: "start from the checkpoint file when it exists (weights and optimizer)"},
		{Name: "overwrite", Type: graph.Bool, Default: cty.False, Doc: "start afresh and replace the checkpoint file when another run wrote it (otherwise the run refuses to start)"},
		{Name: "eval", Type: graph.String, Path: graph.ReadPath, Default: cty.StringVal(""), Doc: "corpus whose held-out text measures acceptance length (same path, holdout and seed as the reader); \"\": no evaluation"},
		{Name: "holdout", Type: graph.Number, Default: cty.NumberFloatVal(0.05), Doc: "held-out share, as the reader's"},
		{Name: "seed", Type: graph.Int, Default: cty.NumberIntVal(1), Doc: "split seed, as the reader's; also the drafter's init and sampling seed"},
		{Name: "max_bytes", Type: graph.Int, Default: cty.NumberIntVal(64 << 20), Doc: "corpus cap, as the reader's"},
		{Name: "eval_every", Type: graph.Int, Default: cty.NumberIntVal(0), Doc: "also measure acceptance every N steps (0: at the start and the end)"},
		{Name: "eval_prompts", Type: graph.Int, Default: cty.NumberIntVal(8), Doc: "held-out prompts per evaluation"},
	},
	Metrics: []graph.Metric{
		{Name: "loss", Merge: graph.MergeMean, Doc: "weighted cross-entropy of the drafted tokens on the replica's latest batch"},
		{Name: "step", Merge: graph.MergeMax, Doc: "optimizer steps the group has taken"},
		{Name: "batches", Merge: graph.MergeMax, Doc: "batches whose gradients the drafter holds (each step adds the replicas that took part; a checkpoint records it)"},
		{Name: "tokens_per_s", Merge: graph.MergeLast, Doc: "training tokens a second, the group's, measured by the lead"},
		{Name: "acceptance_length", Merge: graph.MergeLast, Doc: "tokens accepted per drafting cycle on held-out text: the lead's latest evaluation, then the last member's at the end"},
		{Name: "acceptance_length_initial", Merge: graph.MergeLast, Doc: "acceptance length before training"},
		{Name: "acceptance_length_ngram", Merge: graph.MergeLast, Doc: "acceptance length of an order-3 byte n-gram drafter, a baseline"},
		{Name: report.DataWait, Merge: graph.MergeSum, Doc: "seconds the replicas waited for their next batch (the step's wait for data)"},
		{Name: report.Compute, Merge: graph.MergeSum, Doc: "seconds the replicas spent on their batches (the step's compute: training, the all-reduce, evaluations and saves)"},
	},
	Ports: func(cfg *graph.Config) []graph.PortSpec {
		t := "hidden_states"
		if c, err := nn.ReadConfig(cfg.String("target")); err == nil {
			t = HiddenType(c.DModel, drafterTaps(cfg, c))
		}
		return []graph.PortSpec{{Name: "hidden", Dir: graph.In, Type: t, Doc: "*items.HiddenStates from target_forward"}}
	},
	Check: func(cfg *graph.Config) []error {
		var errs []error
		if _, err := nn.ReadConfig(cfg.String("target")); err != nil {
			errs = append(errs, &graph.FieldError{Field: "target", Err: err})
		}
		for _, f := range []string{"target_layers", "layers", "heads", "hidden", "anchors", "checkpoint_every", "eval_prompts"} {
			if cfg.Int(f) < 1 {
				errs = append(errs, &graph.FieldError{Field: f, Err: fmt.Errorf("must be at least 1")})
			}
		}
		if cfg.Int("block_size") < 2 {
			errs = append(errs, &graph.FieldError{Field: "block_size", Err: fmt.Errorf("must be at least 2 (an anchor and one drafted token)")})
		}
		if cfg.Bool("resume") && cfg.String("checkpoint") == "" {
			errs = append(errs, &graph.FieldError{Field: "resume", Err: fmt.Errorf("needs a checkpoint file to resume from")})
		}
		if cfg.Bool("resume") && cfg.Bool("overwrite") {
			errs = append(errs, &graph.FieldError{Field: "overwrite", Err: fmt.Errorf("and resume contradict each other: resume trains the checkpoint further, overwrite starts afresh over it")})
		}
		if p := cfg.String("eval"); p != "" {
			if err := text.CheckPath(p); err != nil {
				errs = append(errs, &graph.FieldError{Field: "eval", Err: err})
			}
		}
		return errs
	},
}

// drafterNode is the stage; what it does once per run (the final
// checkpoint and evaluation, the save on the way out of a cancelled run)
// is done by the group's last member (nodes.Group.Finish), wherever the
// replicas run.
type drafterNode struct {
	cfg        *graph.Config
	target     *nn.Model
	targetHash string // SHA-256 of the target file, recorded in checkpoints
	dc         nn.DrafterConfig
	held       []byte
	ngram      *text.NGram
	out        *nn.Output // the checkpoint file; nil: none
	// resumed is the checkpoint resumed from (nil: a fresh start), read
	// once when the stage is built; every replica starts from a copy.
	resumed *checkpoint
}

func drafterOutputs(cfg *graph.Config) []string {
	if p := cfg.String("checkpoint"); p != "" {
		return []string{p}
	}
	return nil
}

func newDrafter(cfg *graph.Config) (nodes.Node, error) {
	n := &drafterNode{cfg: cfg}
	path := cfg.String("checkpoint")
	if path != "" {
		// Before any work: a checkpoint another run wrote is not replaced
		// unasked.
		out, err := nn.ClaimOutput(path, cfg.Bool("resume") || cfg.Bool("overwrite"),
			fmt.Sprintf(`Set resume = true to train it further or overwrite = true to start afresh and replace it `+
				`(--set stage.%[1]s.config.resume=true, or --set stage.%[1]s.config.overwrite=true), or write elsewhere with checkpoint = "FILE".`, cfg.Stage()))
		if err != nil {
			return nil, err
		}
		n.out = out
	}
	t, hash, err := loadSharedHash(cfg.String("target"))
	if err != nil {
		return nil, err
	}
	n.targetHash = hash
	taps := drafterTaps(cfg, t.Config)
	n.target = t
	n.dc = nn.DrafterConfig{D: t.Config.DModel, K: len(taps), Taps: taps,
		Layers: cfg.Int("layers"), Heads: cfg.Int("heads"), Hidden: cfg.Int("hidden"), BlockSize: cfg.Int("block_size")}
	if path != "" && cfg.Bool("resume") {
		if err := n.loadResume(path); err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
	}
	if path := cfg.String("eval"); path != "" {
		data, err := text.ReadCorpus(path, int64(cfg.Int("max_bytes")))
		if err != nil {
			return nil, err
		}
		train, held := text.Split(data, cfg.Float("holdout"), uint64(cfg.Int("seed")))
		n.held = held
		n.ngram = text.NewNGram(train[:min(len(train), 4<<20)], 3)
	}
	return n, nil
}

// state is one replica's copy of the drafter, kept identical across
// replicas by the all-reduced gradient.
type state struct {
	d    *nn.Drafter
	w    *nn.DrafterWork
	opt  *nn.AdamW
	mask nn.Buffer
	step int
	// batches counts the batches whose gradients the drafter holds: the
	// replicas that took part, summed over its steps
	batches int
	rng     *rand.Rand
	// group is the stage's replica group, which names the member that
	// saves on the way out
	group nodes.Group
}

func (n *drafterNode) Run(ctx context.Context, r nodes.Replica) error {
	st, err := n.init(r)
	if err != nil {
		return err
	}
	in, group, metrics := r.In("hidden"), r.Group(), r.Metrics()
	defer group.Leave()
	st.group = group
	lead := r.Index() == 0
	// Checkpoints every so many steps are the group's saves: on a
	// cluster, what it trained on is settled only once a save holds it,
	// so a group lost whole restores its last save.
	every := n.cfg.Int("checkpoint_every")
	if n.out != nil && every > 0 {
		if err := group.Saves(ctx); err != nil {
			return fmt.Errorf("drafter_train: %w", err)
		}
	}
	// A replica restarted elsewhere (a cluster's worker lost), or started
	// by a rebalance's move, takes the group's weights, optimizer state,
	// step and batch count over here, or, the group lost whole, restores
	// its last save.
	began, restarted := st.step, false // a resumed checkpoint's step, or 0
	if err := group.Keep(ctx, nn.TrainState{Params: st.d.Params, Opt: st.opt, Step: &st.step, Batches: &st.batches}); err != nil {
		var re *nodes.Restore
		if !errors.As(err, &re) {
			return fmt.Errorf("drafter_train: %w", err)
		}
		if err := n.restore(st, re.Step); err != nil {
			return err
		}
		restarted = true
	}
	// The measures before training, once per run: a lead restarted on a
	// cluster with the group's state (taken over or restored) has them
	// from its first incarnation, which the coordinator's report keeps.
	if lead && n.held != nil && !restarted && st.step == began {
		tau, err := n.tau(st.d)
		if err != nil {
			return err
		}
		metrics.Set("acceptance_length_initial", tau)
		metrics.Set("acceptance_length", tau)
		if nb, err := n.ngramTau(); err == nil {
			metrics.Set("acceptance_length_ngram", nb)
		}
	}
	// tokens: the group's, those of the batches its steps took since this
	// replica began (its members change in a rebalanced run)
	start, tokens := time.Now(), 0
	asked := start // the wait for the next batch begins (report.DataWait)
	for {
		item, err := in.Recv(ctx)
		ready := time.Now()
		metrics.Add(report.DataWait, ready.Sub(asked).Seconds())
		if err == io.EOF {
			break
		}
		if err != nil {
			return n.saveOnCancel(ctx, st, err)
		}
		hs, ok := item.(*HiddenStates)
		if !ok {
			return fmt.Errorf("drafter_train: got %T, want *dflash.HiddenStates", item)
		}
		if hs.D != n.dc.D || hs.K != n.dc.K {
			return fmt.Errorf("drafter_train: hidden states of width %d x %d layers, the drafter expects %d x %d", hs.D, hs.K, n.dc.D, n.dc.K)
		}
		before := st.batches
		loss, err := n.train(ctx, st, hs, r)
		if err != nil {
			return n.saveOnCancel(ctx, st, err)
		}
		tokens += (st.batches - before) * hs.B * hs.T
		metrics.Set("loss", loss)
		metrics.Set("step", float64(st.step))
		metrics.Set("batches", float64(st.batches))
		if lead {
			metrics.Set("tokens_per_s", float64(tokens)/time.Since(start).Seconds())
			if every := n.cfg.Int("eval_every"); every > 0 && n.held != nil && st.step%every == 0 {
				if tau, err := n.tau(st.d); err == nil {
					metrics.Set("acceptance_length", tau)
				}
			}
			if every > 0 && st.step%every == 0 {
				if err := n.save(st); err != nil {
					return err
				}
				if n.out != nil {
					if err := group.Saved(ctx, st.step); err != nil {
						return n.saveOnCancel(ctx, st, err)
					}
				}
			}
		}
		asked = time.Now()
		metrics.Add(report.Compute, asked.Sub(ready).Seconds())
	}
	// The last member to leave holds every update: the others left the
	// group once their input ended, and it trained on without them.
	if last, err := group.Finish(ctx); err != nil || !last {
		return err
	}
	if err := n.save(st); err != nil {
		return err
	}
	if n.held != nil {
		tau, err := n.tau(st.d)
		if err != nil {
			return err
		}
		metrics.Set("acceptance_length", tau)
	}
	return nil
}

// loadResume reads the checkpoint to resume from, when it exists, and
// checks it is a drafter of this config trained against this target.
func (n *drafterNode) loadResume(path string) error {
	meta, err := nn.ReadSafetensorsMetadata(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // nothing to resume: a fresh start
	}
	if err != nil {
		return err
	}
	c, err := nn.CheckDrafterMeta(path, meta)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(c, n.dc) {
		return fmt.Errorf("%s holds a drafter of %v; the config asks for %v", path, c, n.dc)
	}
	if h := meta["target_sha256"]; h != "" && h != n.targetHash {
		return fmt.Errorf("%s was trained against another target (%s, sha256 %s) than this run's %s (sha256 %s); "+
			"resume with that target, or set overwrite = true and resume = false to start afresh",
			path, meta["target"], short(h), n.cfg.String("target"), short(n.targetHash))
	}
	ck, err := n.load(path)
	if err != nil {
		return err
	}
	n.resumed = ck
	return nil
}

// checkpoint is a drafter checkpoint read on the CPU.
type checkpoint struct {
	d             *nn.Drafter
	opt           *nn.AdamW
	step, batches int
}

// load reads a checkpoint of this stage's.
func (n *drafterNode) load(path string) (*checkpoint, error) {
	opt := nn.NewAdamW(n.target.Backend(), n.dc.NumParams(), float32(n.cfg.Float("lr")))
	d, meta, err := nn.LoadDrafter(path, n.target.P("wte"), opt)
	if err != nil {
		return nil, err
	}
	ck := &checkpoint{d: d, opt: opt}
	ck.step, _ = strconv.Atoi(meta["step"])
	ck.batches, _ = strconv.Atoi(meta["batches"]) // 0 in a checkpoint from before it was counted
	return ck, nil
}

// restore puts the group's save of step into the replica's state: a
// group lost whole on a cluster, restarted (step < 0: nothing was saved,
// and the state it started with is the group's).
func (n *drafterNode) restore(st *state, step int) error {
	if step < 0 {
		return nil
	}
	path := n.cfg.String("checkpoint")
	ck, err := n.load(path)
	if err != nil {
		return fmt.Errorf("drafter_train: the group was lost whole and restores its save of step %d: %w (a restart on another host reads the checkpoint at the same path: a shared filesystem)", step, err)
	}
	if ck.step != step {
		return fmt.Errorf("drafter_train: the group was lost whole and restores its save of step %d, but %s holds step %d", step, path, ck.step)
	}
	n.copyInto(st, ck)
	return nil
}

// short abbreviates a hash for messages.
func short(h string) string { return h[:min(len(h), 12)] }

// init builds the replica's drafter, from the checkpoint when resuming.
// Every replica starts from the same weights (same seed or same file).
func (n *drafterNode) init(r nodes.Replica) (*state, error) {
	// The replica trains on its device, against its target's embedding
	// loaded there, on a backend (a stream) of its own.
	tm, _, err := loadSharedOn(n.cfg.String("target"), r.Device())
	if err != nil {
		return nil, err
	}
	be, err := nn.ForDevice(r.Device())
	if err != nil {
		return nil, err
	}
	d, err := nn.NewDrafterOn(be, n.dc, tm.P("wte"), uint64(n.cfg.Int("seed")))
	if err != nil {
		return nil, err
	}
	opt := nn.NewAdamW(be, d.Params.Len(), float32(n.cfg.Float("lr")))
	opt.WeightDecay = float32(n.cfg.Float("weight_decay"))
	st := &state{d: d, opt: opt, mask: d.DecayMask(), rng: rand.New(rand.NewPCG(uint64(n.cfg.Int("seed")), uint64(r.Index())))}
	if n.resumed != nil {
		n.copyInto(st, n.resumed)
	}
	return st, nil
}

// copyInto sets a replica's state to a checkpoint's, read on the CPU: it
// crosses to the replica's device once.
func (n *drafterNode) copyInto(st *state, ck *checkpoint) {
	be, d, opt, from := st.d.Backend(), st.d, st.opt, ck.d
	m, v, t := ck.opt.State()
	if nn.Shares(be, from.Backend()) {
		be.Copy(d.Params, from.Params)
		opt.SetState(m, v, t)
	} else {
		fromCPU(be, d.Params, from.Params)
		dm, dv := be.Alloc(m.Len()), be.Alloc(v.Len())
		fromCPU(be, dm, m)
		fromCPU(be, dv, v)
		opt.SetState(dm, dv, t)
		be.Free(dm)
		be.Free(dv)
	}
	st.step, st.batches = ck.step, ck.batches
}

// fromCPU copies a CPU buffer into dst on be.
func fromCPU(be nn.Backend, dst, src nn.Buffer) {
	host := make([]float32, src.Len())
	src.Backend().ToHost(host, src)
	be.FromHost(dst, host)
}

// train runs one data-parallel step on a batch: sample anchors, forward,
// backward, average gradients over the replicas still training, AdamW.
func (n *drafterNode) train(ctx context.Context, st *state, hs *HiddenStates, r nodes.Replica) (float64, error) {
	P, A := n.dc.BlockSize, n.cfg.Int("anchors")
	if hs.T < P+1 {
		return 0, fmt.Errorf("drafter_train: sequences of %d tokens are too short for blocks of %d", hs.T, P)
	}
	S := hs.B * A
	if st.w == nil || st.w.S != S {
		st.w = st.d.NewWork(S)
	}
	labels := make([]int32, P-1)
	KD := hs.K * hs.D
	for b := 0; b < hs.B; b++ {
		for k := 0; k < A; k++ {
			a := st.rng.IntN(hs.T - P) // anchor position: labels reach a+P-1 <= T-1
			i := b*hs.T + a
			for j := 1; j < P; j++ {
				labels[j-1] = hs.Greedy[i+j]
			}
			st.w.Sample(b*A+k, hs.Hidden[i*KD:(i+1)*KD], hs.Tokens[i+1], labels)
		}
	}
	st.w.Forward()
	loss := st.w.Loss(n.cfg.Float("gamma"))
	st.d.Backend().Zero(st.d.Grads)
	st.w.Backward()
	took, err := nodes.AllReduceMean(ctx, r, reduce.Of(st.d.Grads))
	if err != nil {
		return 0, err
	}
	st.batches += took
	peak, warm := n.cfg.Float("lr"), n.cfg.Int("warmup")
	st.opt.LR = float32(peak * math.Min(1, float64(st.step+1)/float64(max(warm, 1))))
	st.opt.Step(st.d.Params, st.d.Grads, st.mask)
	st.step++
	return loss, nil
}

// saveOnCancel returns err, the error that ends a replica; when the run
// was cancelled (a failure elsewhere, a deadlock, an abort) the group's
// last member first writes its weights as of its last completed step.
// A step applies its update only once its all-reduce has answered, so
// the members still in the group hold the same weights (or, where the
// cancellation cut one member's wait for an answer the others got, one
// step less).
func (n *drafterNode) saveOnCancel(ctx context.Context, st *state, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if last, _ := st.group.Finish(ctx); !last || st.step == 0 {
		return err
	}
	if serr := n.save(st); serr != nil {
		return fmt.Errorf("%w; and the checkpoint on the way out failed: %v", err, serr)
	}
	return err
}

func (n *drafterNode) save(st *state) error {
	path := n.cfg.String("checkpoint")
	if path == "" {
		return nil
	}
	if err := n.out.Check(); err != nil {
		return fmt.Errorf("drafter_train: checkpoint: %w", err)
	}
	meta := nn.RunMetadata(n.cfg.Range("checkpoint").Filename)
	// The target's absolute path: dflow eval finds it from any folder (and
	// checks it by its hash).
	target, err := filepath.Abs(n.cfg.String("target"))
	if err != nil {
		target = n.cfg.String("target")
	}
	meta["step"], meta["batches"], meta["target"], meta["target_sha256"] = strconv.Itoa(st.step), strconv.Itoa(st.batches), target, n.targetHash
	if err := st.d.Save(path, st.opt, meta); err != nil {
		return fmt.Errorf("drafter_train: checkpoint: %w", err)
	}
	return nil
}

func (n *drafterNode) evaluator() *speceval.Evaluator {
	return &speceval.Evaluator{Target: n.target, Layers: n.dc.Taps, Block: n.dc.BlockSize,
		Prompt: 48, Cycles: 12, Prompts: n.cfg.Int("eval_prompts")}
}

func (n *drafterNode) tau(d *nn.Drafter) (float64, error) {
	return n.evaluator().Tau(n.held, speceval.DrafterProposer(d))
}

func (n *drafterNode) ngramTau() (float64, error) {
	return n.evaluator().Tau(n.held, speceval.NGramProposer(n.ngram))
}

// drafterTaps are the target blocks the drafter's hidden states come from.
func drafterTaps(cfg *graph.Config, c nn.Config) []int {
	if fs := cfg.Floats("taps"); len(fs) > 0 {
		out := make([]int, len(fs))
		for i, f := range fs {
			out[i] = int(f)
		}
		return out
	}
	return DefaultLayers(c.Layers, cfg.Int("target_layers"))
}
