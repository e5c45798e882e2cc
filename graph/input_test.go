package graph_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/hashicorp/hcl/v2"
)

const twoStages = `
stage "src" {
  node = "synthetic_source"
  config {
    count        = 4
    service_time = "1ms"
  }
}
stage "out" {
  node = "sink"
}
edge "e" {
  from = src.out
  to   = out.in
}
`

func printed(l *graph.Loader, diags hcl.Diagnostics) string {
	var b bytes.Buffer
	graph.WriteDiagnostics(&b, diags, l.Sources())
	return b.String()
}

// TestSetConfigErrorNamesTheFlag: a kind's check of a value given with
// --set stage.X.config.K=V is reported against the flag, with no position
// in the file, whose own (valid) value was overridden.
func TestSetConfigErrorNamesTheFlag(t *testing.T) {
	l := &graph.Loader{Catalog: testRegistry(), Sets: []string{"stage.src.config.service_time=sometimes"}}
	_, diags := l.Load("spec.hcl", []byte(twoStages))
	out := printed(l, diags)
	if !diags.HasErrors() || !strings.Contains(out, "--set stage.src.config.service_time=sometimes") {
		t.Fatalf("want an error naming the flag:\n%s", out)
	}
	for _, d := range diags {
		if d.Subject != nil {
			t.Errorf("the error points into the file at %s, whose value was overridden:\n%s", d.Subject, out)
		}
	}
	if strings.Contains(out, `"1ms"`) {
		t.Errorf("the snippet shows the file's value:\n%s", out)
	}
	// The same value in the file is reported at the file's attribute.
	l = &graph.Loader{Catalog: testRegistry()}
	_, diags = l.Load("spec.hcl", []byte(strings.Replace(twoStages, `"1ms"`, `"sometimes"`, 1)))
	if len(diags) != 1 || diags[0].Subject == nil || diags[0].Subject.Start.Line != 6 {
		t.Errorf("file value: want one error at line 6:\n%s", printed(l, diags))
	}
}

// TestEmptySpec: a spec with nothing in it, or with no stage, is an error.
func TestEmptySpec(t *testing.T) {
	for name, src := range map[string]string{
		"empty":    "",
		"comments": "# nothing yet\n\n",
		"json":     "{}",
		"no stage": "variable \"n\" {\n  default = 1\n}\n",
	} {
		file := "spec.hcl"
		if name == "json" {
			file = "spec.hcl.json"
		}
		l := &graph.Loader{Catalog: testRegistry()}
		g, diags := l.Load(file, []byte(src))
		if g != nil || len(diags) != 1 || diags[0].Summary != "no stage" {
			t.Errorf("%s: graph %v, want one \"no stage\" error:\n%s", name, g != nil, printed(l, diags))
		}
	}
}

// TestNotText: a binary or a file in another encoding is one error that
// says so and where, not one per stray byte.
func TestNotText(t *testing.T) {
	binary := append([]byte("stage \"a\" {\n  node = \"sink\"\n}\n"), 0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0xff, 0xfe, '{', '"', '\n')
	for i := range 300 {
		binary = append(binary, byte(i), '{', '}', '=')
	}
	latin1 := []byte("# caf\xe9\nstage \"a\" {\n  node = \"sink\"\n}\n")
	for name, c := range map[string]struct {
		src  []byte
		want string
	}{
		"binary": {binary, "a NUL byte at line 4, column 8"},
		"latin1": {latin1, "an invalid byte 0xe9 at line 1, column 6"},
	} {
		for _, file := range []string{"spec.hcl", "spec.hcl.json"} {
			l := &graph.Loader{Catalog: testRegistry()}
			g, diags := l.Load(file, c.src)
			out := printed(l, diags)
			if g != nil || len(diags) != 1 || !strings.Contains(out, c.want) || !strings.Contains(out, "not UTF-8 text") {
				t.Errorf("%s as %s: %d diagnostics, want one saying %q:\n%s", name, file, len(diags), c.want, out)
			}
		}
	}
	// A --var-file too.
	varFile := filepath.Join(t.TempDir(), "vars.hcl")
	os.WriteFile(varFile, binary, 0o644)
	l0 := &graph.Loader{Catalog: testRegistry(), VarFiles: []string{varFile}}
	if _, diags := l0.Load("spec.hcl", []byte(twoStages)); len(diags) != 1 || !strings.Contains(diags[0].Detail, "vars.hcl is not UTF-8 text") {
		t.Errorf("binary --var-file: %d diagnostics:\n%s", len(diags), printed(l0, diags))
	}
	// UTF-8 beyond ASCII is text.
	l := &graph.Loader{Catalog: testRegistry()}
	if _, diags := l.Load("spec.hcl", []byte("# café ✓\n"+twoStages)); diags.HasErrors() {
		t.Errorf("UTF-8 comment: %s", printed(l, diags))
	}
}

// TestCUDADevicePlugin: a plugin's stage on "cuda:0" is valid in a build
// without a CUDA backend: the plugin's processes run it with their own
// CUDA (PyTorch's), dflow only binds the device.
func TestCUDADevicePlugin(t *testing.T) {
	if graph.CUDA {
		t.Skip("a CUDA build")
	}
	reg := testRegistry()
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "p/sink", Ports: func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
	}}})
	src := strings.Replace(twoStages, `node = "sink"`, `node    = "p/sink"
  devices = ["cuda:0"]`, 1)
	l := &graph.Loader{Catalog: reg}
	g, diags := l.Load("spec.hcl", []byte(src))
	if diags.HasErrors() || g.Stage("out").Device(0) != "cuda:0" {
		t.Errorf("a plugin's stage on cuda:0: %s", printed(l, diags))
	}
	// A built-in kind's stage beside it is still refused.
	src = strings.Replace(src, `node = "synthetic_source"`, `node    = "synthetic_source"
  devices = ["cuda:0"]`, 1)
	l = &graph.Loader{Catalog: reg}
	if _, diags := l.Load("spec.hcl", []byte(src)); !strings.Contains(printed(l, diags), "-tags cuda") {
		t.Errorf("a built-in stage on cuda:0 in this build: want the build named:\n%s", printed(l, diags))
	}
}

// TestCUDADevice: a build without a CUDA backend rejects "cuda:N" at
// validate, naming the build, instead of running on the CPU.
func TestCUDADevice(t *testing.T) {
	if graph.CUDA {
		t.Skip("a CUDA build")
	}
	for dev, want := range map[string]string{
		"cuda:0": "-tags cuda",
		"cuda:x": `a GPU is "cuda:N" with N its index`,
		"cuda:":  `a GPU is "cuda:N" with N its index`,
	} {
		src := strings.Replace(twoStages, `node = "sink"`, `node    = "sink"
  devices = ["cpu", "`+dev+`"]`, 1)
		l := &graph.Loader{Catalog: testRegistry()}
		g, diags := l.Load("spec.hcl", []byte(src))
		out := printed(l, diags)
		if g != nil || !strings.Contains(out, want) || !strings.Contains(out, "spec.hcl:11:") {
			t.Errorf("devices %q: want an error at line 11 saying %q:\n%s", dev, want, out)
		}
	}
}
