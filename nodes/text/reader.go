package text

import (
	"context"
	"fmt"
	"github.com/dflow-dev/dflow/items"
	"math/rand/v2"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/zclconf/go-cty/cty"
)

// TokensType is the port type of token batches.
const TokensType = "tokens"

// Batch is a batch of byte-token sequences (defined in package items,
// with its wire encoding).
type Batch = items.Batch

func init() { Register(nodes.Default) }

// Register adds text_reader to a registry.
func Register(r *nodes.Registry) {
	// The same files, seed and limits give the same batches in the same
	// order: a lost replica resumes where it was (nodes.Spec.Resumes).
	r.Register(nodes.Spec{Kind: readerKind, New: newReader, Total: readerTotal, Resumes: true})
}

// CorpusFields are the config attributes that name a corpus and its
// held-out split; nodes that evaluate on the held-out text take the same.
var CorpusFields = []graph.Field{
	{Name: "path", Type: graph.String, Required: true, Path: graph.ReadPath, Doc: "a file, folder or glob of text; $GOROOT/src works everywhere Go does"},
	{Name: "holdout", Type: graph.Number, Default: cty.NumberFloatVal(0.05), Doc: "share of 4 KiB chunks kept out of training for evaluation"},
	{Name: "max_bytes", Type: graph.Int, Default: cty.NumberIntVal(64 << 20), Doc: "read at most this many bytes of the corpus"},
	{Name: "seed", Type: graph.Int, Default: cty.NumberIntVal(1), Doc: "seed of the split and the shuffling"},
}

var readerKind = graph.Kind{
	Name: "text_reader",
	Doc:  "Reads text as byte tokens and emits shuffled batches of sequences, keeping a held-out split out of training.",
	Config: append(append([]graph.Field{}, CorpusFields...),
		graph.Field{Name: "seq_len", Type: graph.Int, Default: cty.NumberIntVal(64), Doc: "tokens per sequence (each row carries one more, the last target)"},
		graph.Field{Name: "batch_size", Type: graph.Int, Default: cty.NumberIntVal(8), Doc: "sequences per batch"},
		graph.Field{Name: "epochs", Type: graph.Int, Default: cty.NumberIntVal(1), Doc: "passes over the training text"},
		graph.Field{Name: "limit", Type: graph.Int, Default: cty.NumberIntVal(0), Doc: "stop after this many batches in all (0: no limit)"},
	),
	Ports: func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: TokensType, Doc: "batches of byte tokens (*items.Batch)"}}
	},
	Check: func(cfg *graph.Config) []error {
		var errs []error
		for _, f := range []string{"seq_len", "batch_size", "epochs", "max_bytes"} {
			if cfg.Int(f) < 1 {
				errs = append(errs, &graph.FieldError{Field: f, Err: fmt.Errorf("must be at least 1")})
			}
		}
		if cfg.Int("limit") < 0 {
			errs = append(errs, &graph.FieldError{Field: "limit", Err: fmt.Errorf("must be 0 (no limit) or more")})
		}
		if h := cfg.Float("holdout"); h < 0 || h >= 1 {
			errs = append(errs, &graph.FieldError{Field: "holdout", Err: fmt.Errorf("must be in [0, 1)")})
		}
		if err := CheckPath(cfg.String("path")); err != nil {
			errs = append(errs, &graph.FieldError{Field: "path", Err: err})
		}
		return errs
	},
}

// Corpus is a corpus split for training and evaluation.
type Corpus struct {
	Train, Held []byte
}

// LoadCorpus reads and splits the corpus a config names (CorpusFields).
func LoadCorpus(cfg *graph.Config) (*Corpus, error) {
	data, err := ReadCorpus(cfg.String("path"), int64(cfg.Int("max_bytes")))
	if err != nil {
		return nil, err
	}
	train, held := Split(data, cfg.Float("holdout"), uint64(cfg.Int("seed")))
	return &Corpus{Train: train, Held: held}, nil
}

type reader struct {
	train           []byte
	T, B            int
	epochs, limit   int
	seed            uint64
	batchesPerEpoch int
}

func newReader(cfg *graph.Config) (nodes.Node, error) {
	c, err := LoadCorpus(cfg)
	if err != nil {
		return nil, err
	}
	r := &reader{train: c.Train, T: cfg.Int("seq_len"), B: cfg.Int("batch_size"),
		epochs: cfg.Int("epochs"), limit: cfg.Int("limit"), seed: uint64(cfg.Int("seed"))}
	r.batchesPerEpoch = (len(r.train) / (r.T + 1)) / r.B
	if r.batchesPerEpoch == 0 {
		return nil, fmt.Errorf("text_reader: %d training bytes do not fill one batch of %d x %d", len(r.train), r.B, r.T+1)
	}
	return r, nil
}

// total is how many batches the stage emits in all.
func (r *reader) total() int {
	n := r.batchesPerEpoch * r.epochs
	if r.limit > 0 {
		n = min(n, r.limit)
	}
	return n
}

func readerTotal(cfg *graph.Config) int64 {
	n, err := newReader(cfg)
	if err != nil {
		return 0
	}
	return int64(n.(*reader).total())
}

// Run emits batches i, i+R, i+2R... of the shuffled order (replica i of R).
func (r *reader) Run(ctx context.Context, rep nodes.Replica) error {
	out := rep.Out("out")
	total := r.total()
	var order []int
	epoch := -1
	for k := rep.Index(); k < total; k += rep.Replicas() {
		if e := k / r.batchesPerEpoch; e != epoch {
			epoch = e
			order = r.shuffle(epoch)
		}
		b := &Batch{Tokens: make([]int32, r.B*(r.T+1)), B: r.B, T: r.T, Seq: int64(k)}
		first := (k % r.batchesPerEpoch) * r.B
		for row := 0; row < r.B; row++ {
			start := order[first+row] * (r.T + 1)
			for j, c := range r.train[start : start+r.T+1] {
				b.Tokens[row*(r.T+1)+j] = int32(c)
			}
		}
		if err := out.Send(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

// shuffle returns the order of the epoch's sequences.
func (r *reader) shuffle(epoch int) []int {
	rng := rand.New(rand.NewPCG(r.seed, uint64(epoch)))
	return rng.Perm(len(r.train) / (r.T + 1))
}
