package python

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/host"
)

// system is the interpreter the tests rely on: Debian's, where
// python3-grpcio installs.
const system = "/usr/bin/python3"

// needModules skips t unless the system Python imports mods.
func needModules(t testing.TB, mods ...string) {
	t.Helper()
	out, err := exec.Command(system, "-c", "import "+strings.Join(mods, ", ")).CombinedOutput()
	if err != nil {
		t.Skipf("%s lacks %s (Debian: python3-grpcio python3-protobuf python3-numpy, python3-torch for torch): %s",
			system, strings.Join(mods, ", "), bytes.TrimSpace(out))
	}
}

// fakePython writes dir/python3, a Python 3 that has none of the modules
// dflow's plugins need, as a pyenv or conda python3 first on PATH may
// be: the system one without its site packages and environment.
func fakePython(t testing.TB, dir string) string {
	t.Helper()
	if _, err := os.Stat(system); err != nil {
		t.Skipf("no %s to make a Python without grpcio from", system)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "python3")
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexec "+system+" -S -E \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(path, "-c", "import grpc").CombinedOutput(); err == nil {
		t.Skipf("%s -S -E imports grpc: no Python without it to test with", system)
	} else {
		t.Logf("%s: %s", path, bytes.TrimSpace(out))
	}
	return path
}

// syncBuf is a buffer that the plugin host's stderr forwarding may write
// to while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// unsetenv unsets key for the test, restoring it after.
func unsetenv(t *testing.T, key string) {
	t.Setenv(key, "")
	os.Unsetenv(key)
}

// TestFirstPython3LacksGRPC: the example plugins start, although the
// python3 first on PATH cannot import grpc (issue 28: they ran it, and
// failed with "No module named 'grpc'"), since their launcher passes
// over it for one that can.
func TestFirstPython3LacksGRPC(t *testing.T) {
	for _, tc := range []struct {
		plugin, path, kind string
		needs              []string
	}{
		{"pystats", "../examples/python/dflow-plugin-pystats", "pystats/stats", []string{"grpc", "google.protobuf", "numpy"}},
		{"torch", "../examples/torch/dflow-plugin-torch", "torch/target_forward", []string{"grpc", "google.protobuf", "numpy", "torch"}},
	} {
		t.Run(tc.plugin, func(t *testing.T) {
			needModules(t, tc.needs...)
			fake := fakePython(t, t.TempDir())
			t.Setenv("PATH", filepath.Dir(fake)+string(os.PathListSeparator)+os.Getenv("PATH"))
			unsetenv(t, "DFLOW_PYTHON")
			var stderr syncBuf
			h := host.New(&stderr)
			defer h.Close()
			reg := nodes.NewRegistry()
			kinds, err := h.Load(tc.plugin, tc.path, reg)
			if err != nil {
				t.Fatalf("with %s first on PATH: %v", fake, err)
			}
			if _, ok := reg.Kind(tc.kind); !ok || len(kinds) == 0 {
				t.Errorf("kinds %v lack %s", kinds, tc.kind)
			}
			h.Close() // and its stderr forwarded
			if s := stderr.String(); s != "" {
				t.Errorf("stderr: %s", s)
			}
		})
	}
}

// TestNoPythonWillDo: where no interpreter can import what a plugin
// needs, the plugin's start fails with the launcher's words, which name
// every interpreter tried, what each lacks, and DFLOW_PYTHON, as the
// error dflow shows (issue 28: only "No module named 'grpc'" under
// go-plugin's "Failed to read any lines from plugin's stdout").
func TestNoPythonWillDo(t *testing.T) {
	dir := t.TempDir()
	explicit := fakePython(t, filepath.Join(dir, "venv"))
	onPath := fakePython(t, filepath.Join(dir, "pyenv"))
	t.Setenv("PATH", filepath.Dir(onPath)+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("DFLOW_PYTHON", explicit)
	sdk, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	// The pystats example, with a module nobody has among its needs.
	wrapper := filepath.Join(dir, "dflow-plugin-needy")
	script := "#!/bin/sh\nexec " + sdk + "/dflow-python --needs dflow_test_no_such_module " + sdk + "/../examples/python/stats.py\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	h := host.New(nil)
	defer h.Close()
	_, err = h.Load("needy", wrapper, nodes.NewRegistry())
	if err == nil {
		t.Fatal("the plugin started")
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{
		"plugin " + wrapper + ": the plugin ended before its handshake (it wrote nothing on stdout); last stderr lines:",
		"dflow-python: no Python interpreter can run " + sdk + "/../examples/python/stats.py: it needs grpc, google.protobuf, numpy, dflow_test_no_such_module. Tried:",
		"DFLOW_PYTHON=" + explicit + ": no module named grpc",
		"python3 on PATH (" + onPath + "): no module named grpc",
		system + ": ",
		"/usr/local/bin/python3: ",
		"Set DFLOW_PYTHON to a Python 3 that has them",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q", want)
		}
	}
	if strings.Contains(msg, "Failed to read any lines") {
		t.Errorf("the error still has go-plugin's words for it")
	}
	if _, err := exec.Command(system, "-c", "import grpc, google.protobuf, numpy").CombinedOutput(); err == nil &&
		!strings.Contains(msg, system+": no module named dflow_test_no_such_module") {
		t.Errorf("the error does not say that %s lacks dflow_test_no_such_module", system)
	}
}

// TestExplicitPythonPassedOver: a $DFLOW_PYTHON that cannot import what
// the plugin needs is passed over for one that can, with a line on the
// plugin's stderr that says so.
func TestExplicitPythonPassedOver(t *testing.T) {
	needModules(t, "grpc", "google.protobuf", "numpy")
	explicit := fakePython(t, t.TempDir())
	t.Setenv("DFLOW_PYTHON", explicit)
	var stderr syncBuf
	h := host.New(&stderr)
	defer h.Close()
	if _, err := h.Load("pystats", "../examples/python/dflow-plugin-pystats", nodes.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	h.Close() // and its stderr forwarded
	if want := "dflow-python: DFLOW_PYTHON=" + explicit + ": no module named grpc, so "; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q lacks %q", stderr.String(), want)
	}
}
