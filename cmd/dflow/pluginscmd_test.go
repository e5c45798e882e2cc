package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// python sets $DFLOW_PYTHON to the interpreter the Python plugins run
// with ($DFLOW_PYTHON, or Debian's) and skips the test when it cannot
// import modules (Debian's python3-grpcio, python3-protobuf,
// python3-numpy, python3-torch).
func python(t *testing.T, modules string) {
	t.Helper()
	py := os.Getenv("DFLOW_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import "+modules).CombinedOutput(); err != nil {
		t.Skipf("%s cannot import %s: %v: %s", py, modules, err, bytes.TrimSpace(out))
	}
	t.Setenv("DFLOW_PYTHON", py)
}

// TestPluginsTorchPorts: `dflow plugins plugins/examples/torch`, as the
// example's README types it, lists the kinds' ports with their config,
// and marks drafter_train, not target_forward, a group kind that
// restores.
func TestPluginsTorchPorts(t *testing.T) {
	python(t, "grpc, google.protobuf, numpy, torch")
	code, stdout, stderr := dflow(t, "plugins", "../../plugins/examples/torch")
	const group = "    group kind: its replicas step together, each a rank with torchrun's environment\n"
	for _, want := range []string{
		"  node torch/target_forward\n",
		"    in  in tokens: token batches\n    out hidden hidden_states: hidden states\n    config model string (required)",
		"  node torch/drafter_train\n",
		group + "    restores: the group restarts whole from its last save, on a cluster when a worker is lost, in one process when a rank's process dies (restarts)\n" +
			"    in  hidden hidden_states: hidden states from target_forward (Go or PyTorch)\n",
	} {
		if code != exitOK || !strings.Contains(stdout, want) {
			t.Errorf("code %d, want %q in\n%s%s", code, want, stdout, stderr)
		}
	}
	if strings.Count(stdout, group) != 1 {
		t.Errorf("%d kinds marked group kinds, want 1 (drafter_train):\n%s", strings.Count(stdout, group), stdout)
	}
}

// picky is a Python plugin whose check fails (a KeyError) on a config
// without its required attribute, as the torch example's did: the ports
// of its default config cannot be had.
const picky = `from dflowplugin import Field, Node, Port, serve


class Picky(Node):
    name = "picky"
    config = [Field("model", "string", required=True)]

    def ports(self, config):
        return [Port("in", "blob")]

    def check(self, config):
        return [("model", "cannot read " + config["model"])]


serve(Picky())
`

// TestPluginsPortsUnknown: a kind whose plugin fails to check its default
// config is listed, and dflow plugins says why it shows no ports and
// exits 1, rather than listing a kind without ports as if it had none.
func TestPluginsPortsUnknown(t *testing.T) {
	python(t, "grpc, google.protobuf, numpy")
	launcher, err := filepath.Abs("../../plugins/python/dflow-python")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "picky.py")
	if err := os.WriteFile(script, []byte(picky), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := fmt.Sprintf("#!/bin/sh\nexec %q %q \"$@\"\n", launcher, script)
	if err := os.WriteFile(filepath.Join(dir, "dflow-plugin-picky"), []byte(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := dflow(t, "plugins", dir)
	if code != exitFailed || !strings.Contains(stdout, "  node picky/picky\n    config model string (required)") ||
		!strings.Contains(stderr, "dflow plugins: picky/picky lists no ports: the plugin's check of its default config (no attribute set) failed: plugin picky (") ||
		!strings.Contains(stderr, "check: ") {
		t.Errorf("code %d, want %d, the kind and why it has no ports:\n%s%s", code, exitFailed, stdout, stderr)
	}
}
