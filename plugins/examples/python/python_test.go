package python

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/dflash"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/nodes/text"
	"github.com/dflow-dev/dflow/plugins/conformance"
	"github.com/dflow-dev/dflow/plugins/host"
	"github.com/dflow-dev/dflow/report"
)

// TestMain: the conformance suite runs this binary as a dflow
// (conformance.Main).
func TestMain(m *testing.M) { conformance.Main(m) }

// python is the interpreter the plugin runs with ($DFLOW_PYTHON, or
// Debian's, which is where python3-grpcio installs); the test skips
// without grpcio, protobuf and numpy.
func python(t testing.TB) string {
	py := os.Getenv("DFLOW_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	out, err := exec.Command(py, "-c", "import grpc, google.protobuf, numpy").CombinedOutput()
	if err != nil {
		t.Skipf("%s lacks grpcio, protobuf or numpy (Debian: python3-grpcio python3-protobuf python3-numpy): %s", py, bytes.TrimSpace(out))
	}
	t.Setenv("DFLOW_PYTHON", py)
	return py
}

// lockedBuf is a goroutine-safe buffer for the plugin's forwarded stderr.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

type fixture struct {
	reg    *nodes.Registry
	h      *host.Host
	stderr lockedBuf
	mu     sync.Mutex
	rms    []float64 // per hidden-states item the sink got, in order
	items  int
	// when the first and the last item came to the sink
	first, last time.Time
}

func newFixture(t testing.TB) *fixture {
	python(t)
	f := &fixture{reg: nodes.NewRegistry()}
	synthetic.Register(f.reg)
	text.Register(f.reg)
	dflash.Register(f.reg)
	f.reg.Register(plugintest.Sink("rms_sink", graph.Any, func(item any) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.items++
		if f.last = time.Now(); f.first.IsZero() {
			f.first = f.last
		}
		if h, ok := item.(*dflash.HiddenStates); ok {
			if len(h.Hidden) != h.B*h.T*h.K*h.D || len(h.Tokens) != h.B*h.T {
				return fmt.Errorf("hidden states of %dx%dx%dx%d with %d values", h.B, h.T, h.K, h.D, len(h.Hidden))
			}
			var sum float64
			for _, x := range h.Hidden {
				sum += float64(x) * float64(x)
			}
			f.rms = append(f.rms, math.Sqrt(sum/float64(len(h.Hidden))))
		}
		return nil
	}))
	f.h = host.New(&f.stderr)
	path, err := filepath.Abs("dflow-plugin-pystats")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.h.Load("py", path, f.reg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.h.Close)
	return f
}

func (f *fixture) run(t testing.TB, src string) (*report.Report, error) {
	t.Helper()
	g, diags := (&graph.Loader{Catalog: f.reg}).Load("p.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return engine.Run(ctx, g, engine.Options{Registry: f.reg})
}

// passSpec: COUNT small items through REPLICAS of py/stats with CONFIG.
const passSpec = `
stage "src" {
  node = "synthetic_source"
  config {
    count      = %d
    size_bytes = 100
  }
}
stage "s" {
  node     = "py/stats"
  replicas = %d
  config {
    %s
  }
}
stage "sink" {
  node = "rms_sink"
}
edge "a" {
  from = src.out
  to   = s.in
}
edge "b" {
  from = s.out
  to   = sink.in
}`

// TestHiddenStates: the target's hidden states cross into Python and back:
// the plugin scales them by 2 and publishes the RMS it saw, and the sink
// sees twice that.
func TestHiddenStates(t *testing.T) {
	f := newFixture(t)
	corpus := filepath.Join(t.TempDir(), "corpus.txt")
	if err := os.WriteFile(corpus, bytes.Repeat([]byte("func main() { fmt.Println(\"hello, dflow\") }\n"), 400), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := f.run(t, fmt.Sprintf(`
stage "reader" {
  node = "text_reader"
  config {
    path       = %q
    seq_len    = 32
    batch_size = 4
    limit      = 3
  }
}
stage "target" {
  node = "target_forward"
  config {
    model = "../../../models/target.safetensors"
  }
}
stage "s" {
  node = "py/stats"
  config {
    scale = 2
  }
}
stage "sink" {
  node = "rms_sink"
}
edge "tokens" {
  from = reader.out
  to   = target.in
}
edge "hs" {
  from = target.hidden
  to   = s.in
}
edge "out" {
  from = s.out
  to   = sink.in
}`, corpus))
	if err != nil {
		t.Fatalf("%v\n%s", err, f.stderr.String())
	}
	if len(f.rms) != 3 {
		t.Fatalf("the sink got %d hidden-states items, want 3", len(f.rms))
	}
	// hidden_rms is a gauge: the last item's, before scaling.
	seen := rep.Stages["s"].Metrics["hidden_rms"]
	if last := f.rms[2]; seen <= 0 || math.Abs(last-2*seen) > 1e-4*last {
		t.Errorf("the plugin saw RMS %g, the sink got %g after scaling by 2", seen, last)
	}
}

// BenchmarkPythonPlugin: items through one replica of the Python plugin,
// small (64 B) and large (16 MiB), large ones by reference in shared
// memory, and with shared memory off (-grpc: as before it); one op is one
// item there and back, and a run includes starting the plugin (bench/run
// moves 10,000 small and 20-200 large ones). Compare with
// BenchmarkPluginStage in plugins/host, the same shape through a Go
// plugin, and its BenchmarkMemmove.
func BenchmarkPythonPlugin(b *testing.B) {
	for _, size := range []int{64, 16 << 20} {
		for _, shm := range []bool{true, false} {
			name := fmt.Sprintf("%dB", size)
			if !shm {
				name += "-grpc"
			}
			b.Run(name, func(b *testing.B) {
				if !shm {
					b.Setenv("DFLOW_PLUGIN_SHM", "off") // as before shared memory
				}
				benchPython(b, size)
			})
		}
	}
}

func benchPython(b *testing.B, size int) {
	f := newFixture(b)
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	if _, err := f.run(b, fmt.Sprintf(strings.Replace(passSpec, "size_bytes = 100", "size_bytes = %d", 1), b.N, size, 1, "")); err != nil {
		b.Fatalf("%v\n%s", err, f.stderr.String())
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "items/s")
	if b.N > 1 {
		// Without the plugin's start: from the first item at the sink to the last.
		b.ReportMetric(float64(b.N-1)/f.last.Sub(f.first).Seconds()*float64(size)/1e6, "steady-MB/s")
	}
}
