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
	"github.com/dflow-dev/dflow/plugins/host"
	"github.com/dflow-dev/dflow/report"
)

// TestMain re-runs the test binary as a dflow when DFLOW_TEST_AS_DFLOW
// names a plugin: TestPluginsDieWithKilledDflow kills it.
func TestMain(m *testing.M) {
	if path := os.Getenv("DFLOW_TEST_AS_DFLOW"); path != "" {
		os.Exit(asDflow(path))
	}
	os.Exit(m.Run())
}

// asDflow loads the plugin at path as py and runs plugintest.SlowSpec
// through py/stats on 2 replicas, until it is killed.
func asDflow(path string) int {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	h := host.New(os.Stderr)
	defer h.Close()
	if _, err := h.Load("py", path, reg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(plugintest.SlowSpec("py/stats", 2)))
	if diags.HasErrors() {
		fmt.Fprintln(os.Stderr, diags)
		return 1
	}
	if _, err := engine.Run(context.Background(), g, engine.Options{Registry: reg}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestPluginsDieWithKilledDflow: SIGKILL of dflow leaves no Python plugin
// process behind, whether its wrapper execs Python (the shipped one) or
// runs it as a child.
func TestPluginsDieWithKilledDflow(t *testing.T) {
	python(t)
	for _, tc := range []struct {
		name    string
		wrapper string
		want    int // processes naming the plugin's folder: catalog + 2 replicas
	}{
		{"exec", "", 3},
		{"child", "#!/bin/sh\n\"$(dirname \"$0\")/../../python/dflow-python\" \"$(dirname \"$0\")/stats.py\"\n", 6}, // and 3 shells
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A copy of the plugin and the SDK, laid out as in the
			// clone, so that pgrep sees this test's processes only.
			dir := t.TempDir()
			for _, name := range []string{"dflow-plugin-pystats", "stats.py", "../../python/dflow-python", "../../python/dflowplugin.py", "../../python/dflow_pb2.py"} {
				b, err := os.ReadFile(name)
				if err != nil {
					t.Fatal(err)
				}
				if name == "dflow-plugin-pystats" && tc.wrapper != "" {
					b = []byte(tc.wrapper)
				}
				dst := filepath.Join(dir, "plugins", "examples", "python", name)
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(dst, b, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			dflow := exec.Command(os.Args[0], "-test.run=^$")
			dflow.Env = append(os.Environ(), "DFLOW_TEST_AS_DFLOW="+filepath.Join(dir, "plugins", "examples", "python", "dflow-plugin-pystats"))
			plugintest.KillDflow(t, dflow, dir, tc.want)
		})
	}
}

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

// TestSmallItems: thousands of items through two replicas of the Python
// plugin, counts exact, its counter metric summed over the replicas.
func TestSmallItems(t *testing.T) {
	f := newFixture(t)
	rep, err := f.run(t, fmt.Sprintf(passSpec, 2000, 2, ""))
	if err != nil {
		t.Fatalf("%v\n%s", err, f.stderr.String())
	}
	if rep.Edges["b"].Produced != 2000 || f.items != 2000 || rep.Stages["s"].Metrics["items"] != 2000 {
		t.Errorf("out %d, sink %d, items metric %v; want 2000", rep.Edges["b"].Produced, f.items, rep.Stages["s"].Metrics["items"])
	}
}

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

// TestCrash: a Python plugin that dies mid-stream fails its stage with its
// last words, and leaves no process behind.
func TestCrash(t *testing.T) {
	f := newFixture(t)
	_, err := f.run(t, fmt.Sprintf(passSpec, 100, 1, "crash_after = 10"))
	if err == nil || !strings.Contains(err.Error(), "crashing on purpose after 10 items") || !strings.Contains(err.Error(), `stage "s"`) {
		t.Fatalf("want the stage to fail with the plugin's last words, got %v", err)
	}
	f.h.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _ := exec.Command("pgrep", "-f", "examples/python/stats.py").Output()
		if len(bytes.TrimSpace(out)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin processes left running: %s", out)
		}
		time.Sleep(20 * time.Millisecond)
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

// TestInterleavedInputs: a Python node that reads its two inputs in turn
// gets both (credit per input port).
func TestInterleavedInputs(t *testing.T) {
	f := newFixture(t)
	rep, err := f.run(t, `
stage "sa" {
  node = "synthetic_source"
  config {
    count = 300
  }
}
stage "sb" {
  node = "synthetic_source"
  config {
    count = 200
  }
}
stage "z" {
  node = "py/zip"
}
stage "sink" {
  node = "rms_sink"
}
edge "a" {
  from = sa.out
  to   = z.a
}
edge "b" {
  from = sb.out
  to   = z.b
}
edge "out" {
  from = z.out
  to   = sink.in
}`)
	if err != nil {
		t.Fatalf("%v\n%s", err, f.stderr.String())
	}
	if rep.Edges["out"].Produced != 500 || f.items != 500 {
		t.Errorf("%d items out, %d at the sink; want 500", rep.Edges["out"].Produced, f.items)
	}
}

// TestOutputsHeldBackApart: a Python node sends on two outputs from two
// threads, and the consumer takes every item of b before any of a, whose
// edge holds 4: the full edge must hold back a's items only (output
// credit), or the run hangs with b's items behind a's on the stream.
func TestOutputsHeldBackApart(t *testing.T) {
	f := newFixture(t)
	const count = 300
	f.reg.Register(plugintest.BThenA(count))
	rep, err := f.run(t, plugintest.ForkSpec("py/fork", count))
	if err != nil {
		t.Fatalf("%v\n%s", err, f.stderr.String())
	}
	if rep.Edges["a"].Consumed != count || rep.Edges["b"].Consumed != count {
		t.Errorf("a %d, b %d items consumed, want %d each", rep.Edges["a"].Consumed, rep.Edges["b"].Consumed, count)
	}
}
