package text

import (
	"context"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
)

// registerSink adds a "sink" kind that drains its input (nodes/synthetic
// has one, but it imports this package).
func registerSink(reg *nodes.Registry) {
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "sink", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: TokensType}}
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
	})
}

func writeCorpus(t *testing.T) string {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub", ".git"), 0o755)
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte(strings.Repeat("hello dflow, ", 3000)), 0o644)
	os.WriteFile(filepath.Join(dir, "sub", "b.go"), []byte(strings.Repeat("package main\n", 2000)), 0o644)
	os.WriteFile(filepath.Join(dir, "sub", "bin.dat"), []byte{1, 0, 2}, 0o644)
	os.WriteFile(filepath.Join(dir, "sub", ".git", "HEAD"), []byte("ref: secret"), 0o644)
	return dir
}

func TestReadCorpus(t *testing.T) {
	dir := writeCorpus(t)
	b, err := ReadCorpus(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 13*3000+13*2000 || strings.Contains(string(b), "secret") || strings.ContainsRune(string(b), 0) {
		t.Errorf("folder read %d bytes", len(b))
	}
	g, _ := ReadCorpus(filepath.Join(dir, "sub", "*.go"), 1<<30)
	if len(g) != 13*2000 {
		t.Errorf("glob read %d bytes", len(g))
	}
	if c, _ := ReadCorpus(dir, 100); len(c) != 100 {
		t.Errorf("max_bytes: %d", len(c))
	}
	if _, err := ReadCorpus(filepath.Join(dir, "none*"), 10); err == nil || !strings.Contains(err.Error(), "matches no file") {
		t.Errorf("missing: %v", err)
	}
	os.Setenv("DFLOW_TEST_CORPUS", dir)
	defer os.Unsetenv("DFLOW_TEST_CORPUS")
	if e, _ := ReadCorpus("$DFLOW_TEST_CORPUS/a.txt", 1<<30); len(e) != 13*3000 {
		t.Errorf("env expansion read %d", len(e))
	}
	if !strings.HasSuffix(nodes.ExpandPath("$GOROOT/src"), "/src") || nodes.ExpandPath("$GOROOT/src") == "/src" {
		t.Errorf("$GOROOT expands to %q", nodes.ExpandPath("$GOROOT/src"))
	}
}

func TestSplit(t *testing.T) {
	data := make([]byte, 1000*ChunkSize)
	for i := range data {
		data[i] = byte(i / ChunkSize)
	}
	train, held := Split(data, 0.1, 1)
	if len(train)+len(held) != len(data) || len(held) < 60*ChunkSize || len(held) > 140*ChunkSize {
		t.Errorf("split %d / %d", len(train), len(held))
	}
	t2, _ := Split(data, 0.1, 1)
	if string(t2) != string(train) {
		t.Error("the split is not deterministic")
	}
	if _, h := Split(data, 0, 1); len(h) != 0 {
		t.Error("holdout 0 held text out")
	}
}

func TestNGram(t *testing.T) {
	text := []byte(strings.Repeat("abcabcabd", 500))
	m := NewNGram(text, 3)
	// Probabilities over all bytes sum to 1 in every context.
	for _, ctx := range []string{"", "a", "ab", "abc", "zzz"} {
		var sum float64
		for c := 0; c < 256; c++ {
			sum += m.Prob([]byte(ctx), byte(c))
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Errorf("context %q: probabilities sum to %v", ctx, sum)
		}
	}
	if p := m.Prob([]byte("ab"), 'c'); p < 0.5 {
		t.Errorf("p(c|ab) = %v", p)
	}
	if bpb := m.BitsPerByte(text[:900], 3); bpb > 1.5 {
		t.Errorf("a repetitive text costs %.2f bits per byte", bpb)
	}
}

// TestReaderNode runs text_reader into a sink: exact batch counts, the
// held-out text never appears, totals known for progress.
func TestReaderNode(t *testing.T) {
	dir := writeCorpus(t)
	reg := nodes.NewRegistry()
	Register(reg)
	registerSink(reg)
	src := `
stage "reader" {
  node     = "text_reader"
  replicas = 2
  config {
    path       = "` + dir + `"
    seq_len    = 32
    batch_size = 4
    limit      = 25
  }
}
stage "sink" {
  node = "sink"
}
edge "e" {
  from = reader.out
  to   = sink.in
}`
	l := &graph.Loader{Catalog: reg}
	g, diags := l.Load("r.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	p, err := engine.New(g, engine.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.Execute(context.Background())
	if err != nil || rep.Edges["e"].Consumed != 25 {
		t.Fatalf("err %v, consumed %d", err, rep.Edges["e"].Consumed)
	}
	// The runtime knows the reader's total (progress and ETA).
	if st := p.Snapshot(); st.Stages[0].Name != "reader" || st.Stages[0].Total != 25 {
		t.Errorf("snapshot total %+v", st.Stages[0])
	}
	spec, _ := reg.Spec("text_reader")
	if n := spec.Total(g.Stage("reader").Config); n != 25 {
		t.Errorf("total %d, want 25", n)
	}
	// A bad config is caught at validate time, at the attribute.
	_, diags = l.Load("bad.hcl", []byte(strings.Replace(src, "seq_len    = 32", "seq_len    = 0", 1)))
	if !diags.HasErrors() || !strings.Contains(diags.Error(), "seq_len") {
		t.Errorf("seq_len 0: %v", diags)
	}
}

func TestBatch(t *testing.T) {
	b := &Batch{Tokens: []int32{1, 2, 3, 4, 5, 6, 7, 8}, B: 2, T: 3}
	in, tg := make([]int32, 6), make([]int32, 6)
	b.Inputs(in)
	b.Targets(tg)
	if !reflect.DeepEqual(in, []int32{1, 2, 3, 5, 6, 7}) || !reflect.DeepEqual(tg, []int32{2, 3, 4, 6, 7, 8}) || b.SizeBytes() != 32 {
		t.Errorf("inputs %v targets %v", in, tg)
	}
}
