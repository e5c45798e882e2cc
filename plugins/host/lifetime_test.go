package host

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/zclconf/go-cty/cty"
)

// asDflow is this test binary as a dflow (DFLOW_TEST_PLUGIN=dflow): it
// loads the plugin at $DFLOW_TEST_PLUGIN_PATH as tp and runs
// plugintest.SlowSpec through tp/pass on 2 replicas, until it is killed.
func asDflow() int {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	h := New(os.Stderr)
	defer h.Close()
	if _, err := h.Load("tp", os.Getenv("DFLOW_TEST_PLUGIN_PATH"), reg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(plugintest.SlowSpec("tp/pass", 2)))
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

// TestStartTimeoutHoldsForAProcessTree: a wrapper whose children keep the
// plugin's stdout open, one of them in a session of its own, does not
// hold Load past the start timeout: Load fails with the timeout (the
// escaped child keeps the pipe open for an hour, so a Load that waited
// for it would not end within the test's 15 s), and the children in the
// plugin's process group are killed.
func TestStartTimeoutHoldsForAProcessTree(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.h.StartTimeout = 500 * time.Millisecond
	body := fmt.Sprintf("DFLOW_TEST_PLUGIN=hang %[1]q -test.run='^$' \"$0\" waits &\n"+
		"DFLOW_TEST_PLUGIN=hang %[1]q -test.run='^$' \"$0\" waited\n", self(t))
	if _, err := exec.LookPath("setsid"); err == nil {
		body = fmt.Sprintf("DFLOW_TEST_PLUGIN=hang setsid %q -test.run='^$' \"$0\" escapes &\n", self(t)) + body
	}
	path := script(t, f.dir, "slow", body)
	t.Cleanup(func() { // the one that left the group is the test's to kill
		for _, pid := range plugintest.Procs(path + " escapes") {
			if p, err := os.FindProcess(pid); err == nil {
				p.Kill()
			}
		}
	})
	start := time.Now()
	loaded := make(chan error, 1)
	go func() {
		_, err := f.h.Load("slow", path, f.reg)
		loaded <- err
	}()
	select {
	case err := <-loaded:
		if err == nil || !strings.Contains(err.Error(), "timeout while waiting for plugin to start") {
			t.Fatalf("err = %v", err)
		}
		t.Logf("Load failed after %v (start timeout %v, pipe grace %v): %v", time.Since(start), f.h.StartTimeout, pipeGrace, err)
	case <-time.After(15 * time.Second):
		t.Fatal("Load still waiting 15 s after a start timeout of 0.5 s")
	}
	left := func() []int { return append(plugintest.Procs(path+" waits"), plugintest.Procs(path+" waited")...) }
	if !testutil.Within(5*time.Second, func() bool { return len(left()) == 0 }) {
		t.Fatalf("processes of the plugin's group left: %v", left())
	}
}

// upperKind is the docs' example (docs/plugins.md): bytes in, upper case
// out, asserting its items are []byte; panic_after panics instead.
var upperKind = nodes.Spec{
	Kind: graph.Kind{
		Name:   "upper",
		Config: []graph.Field{{Name: "panic_after", Type: graph.Int, Default: cty.NumberIntVal(0)}},
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "bytes"}, {Name: "out", Dir: graph.Out, Type: "bytes"}}
		},
	},
	New: func(cfg *graph.Config) (nodes.Node, error) {
		panicAfter := cfg.Int("panic_after")
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			for n := 0; ; n++ {
				item, err := r.In("in").Recv(ctx)
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				if panicAfter > 0 && n == panicAfter {
					var m map[string]int
					m["boom"] = n // a nil map: the runtime panics
				}
				b := []byte(strings.ToUpper(string(item.([]byte))))
				if err := r.Out("out").Send(ctx, b); err != nil {
					return err
				}
			}
		}), nil
	},
}

// oddKind declares ports of types that have no wire encoding (frames), or
// whose items it does not send (bytes, sending blobs), per its mode.
var oddKind = nodes.Spec{
	Kind: graph.Kind{
		Name:   "odd",
		Config: []graph.Field{{Name: "mode", Type: graph.String, Default: cty.StringVal("frames")}},
		Ports: func(cfg *graph.Config) []graph.PortSpec {
			if cfg.String("mode") == "frames" {
				return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: "frames"}}
			}
			return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: "bytes"}}
		},
	},
	New: func(*graph.Config) (nodes.Node, error) {
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			return r.Out("out").Send(ctx, &synthetic.Blob{Data: []byte("x")})
		}), nil
	},
}

const bytesSpec = `
stage "src" {
  node = "synthetic_source"
  config {
    count      = 50
    size_bytes = 3
    type       = "%s"
  }
}
stage "up" {
  node = "tp/upper"
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = up.in
}
edge "b" {
  from = up.out
  to   = sink.in
}`

// TestBytesIntoAPlugin: synthetic_source's bytes are []byte, which a
// plugin's bytes port receives; blobs do not validate against it.
func TestBytesIntoAPlugin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.h.Load("tp", wrapper(t, f.dir, "tp", "serve"), f.reg); err != nil {
		t.Fatal(err)
	}
	rep, err := f.run(fmt.Sprintf(bytesSpec, "bytes"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Edges["b"].Produced != 50 {
		t.Errorf("%d items out", rep.Edges["b"].Produced)
	}
	_, diags := (&graph.Loader{Catalog: f.reg}).Load("p.hcl", []byte(fmt.Sprintf(bytesSpec, "blob")))
	if !diags.HasErrors() || !strings.Contains(diags.Error(), `"blob"`) {
		t.Errorf("blobs into a bytes port: %v", diags)
	}
}

// TestPanicInAPlugin: a node's panic in a plugin ends its replica with
// the panic's message and where it was raised, as in process, not with
// the gRPC error of a dead process.
func TestPanicInAPlugin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.h.Load("tp", wrapper(t, f.dir, "tp", "serve"), f.reg)
	_, err := f.run(fmt.Sprintf(bytesSpec, "bytes"), "stage.up.config.panic_after=5")
	if err == nil {
		t.Fatal("a panic must fail the run")
	}
	for _, want := range []string{`stage "up" replica 0`, "plugin tp (", "panic: assignment to entry in nil map", "lifetime_test.go:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	for _, bad := range []string{"rpc error", "Unavailable", "grpc", "no stderr output"} {
		if strings.Contains(err.Error(), bad) {
			t.Errorf("error has %q:\n%v", bad, err)
		}
	}
}

// TestPortTypesMeanOneEncoding: a plugin port of a type without a wire
// encoding fails validation at the stage, and an item that is not of its
// port's type fails the replica with an error that names the port, on
// either side of the process boundary.
func TestPortTypesMeanOneEncoding(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.h.Load("tp", wrapper(t, f.dir, "tp", "serve"), f.reg)
	spec := `
stage "o" {
  node = "tp/odd"
  config {
    mode = "%s"
  }
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = o.out
  to   = sink.in
}`
	l := &graph.Loader{Catalog: f.reg}
	_, diags := l.Load("p.hcl", []byte(fmt.Sprintf(spec, "frames")))
	var b strings.Builder
	graph.WriteDiagnostics(&b, diags, l.Sources())
	for _, want := range []string{`port "out" has type "frames"`, "bytes, blob, tokens, hidden_states"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("diagnostics lack %q:\n%s", want, b.String())
		}
	}
	_, err := f.run(fmt.Sprintf(spec, "lie"))
	if err == nil || !strings.Contains(err.Error(), `output "out": a *items.Blob item on a port of type "bytes", which carries []byte`) {
		t.Errorf("a plugin sending blobs on a bytes port: %v", err)
	}

	// dflow's side: an in-process node that lies about its output.
	f.reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "liar", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: "bytes"}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				return r.Out("out").Send(ctx, &synthetic.Blob{})
			}), nil
		},
	})
	_, err = f.run(`
stage "src" {
  node = "liar"
}
stage "up" {
  node = "tp/upper"
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = up.in
}
edge "b" {
  from = up.out
  to   = sink.in
}`)
	if err == nil || !strings.Contains(err.Error(), `input "in": a *items.Blob item on a port of type "bytes"`) {
		t.Errorf("a blob fed to a bytes port: %v", err)
	}
}

// TestPluginInTheWorkingFolder: a plugin path without a folder ("path =
// \"dflow-plugin-upper\"", or what `dflow plugins .` finds) is the file in
// the folder dflow runs in, not a command looked up in $PATH.
func TestPluginInTheWorkingFolder(t *testing.T) {
	f := newFixture(t)
	wrapper(t, f.dir, "tp", "serve")
	t.Chdir(f.dir)
	path, ok := Find("tp", []string{"."})
	if !ok || path != Prefix+"tp" {
		t.Fatalf("Find in . = %q, %v", path, ok)
	}
	if _, err := f.h.Load("tp", path, f.reg); err != nil {
		t.Fatal(err)
	}
}
