package torch

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/dflow-dev/dflow/plugins/conformance"
)

// TestMain: the conformance suite runs this binary as a dflow
// (conformance.Main).
func TestMain(m *testing.M) { conformance.Main(m) }

// TestConformance: the protocol's suite against the PyTorch example, the
// cases its one kind (target_forward: token batches in, hidden states
// out) can run, fed by text_reader; skipped without torch.
func TestConformance(t *testing.T) {
	python(t)
	model, err := filepath.Abs("../../../models/target.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	target, err := filepath.Abs("target.py")
	if err != nil {
		t.Fatal(err)
	}
	corpus := filepath.Join(t.TempDir(), "corpus.txt")
	if err := os.WriteFile(corpus, bytes.Repeat([]byte("func main() { fmt.Println(\"hello, dflow\") }\n"), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	conformance.Run(t, conformance.Plugin{
		Path:   "dflow-plugin-torch",
		Marker: target, // the launcher execs python3 .../target.py
		Pass: conformance.Pass{
			Kind:   "target_forward",
			Out:    "hidden",
			Config: fmt.Sprintf("model = %q", model),
			Source: fmt.Sprintf("node = \"text_reader\"\n  config {\n    path = %q\n    seq_len = 16\n    batch_size = 2\n    epochs = 100000\n    limit = %%d\n  }", corpus),
			Count:  12, // a forward pass each
			Int:    "threads",
		},
	})
}
