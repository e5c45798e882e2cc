package graph_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestValidateSuite loads every spec under testdata/validate and compares
// the printed diagnostics with the .golden file beside it. Run with
// -update to rewrite the golden files after checking the change.
func TestValidateSuite(t *testing.T) {
	files, _ := filepath.Glob("testdata/validate/*.hcl*")
	if len(files) < 10 {
		t.Fatalf("found only %d cases", len(files))
	}
	for _, file := range files {
		if strings.HasSuffix(file, ".golden") {
			continue
		}
		t.Run(filepath.Base(file), func(t *testing.T) {
			l := &graph.Loader{Catalog: testRegistry()}
			g, diags := l.LoadFile(filepath.ToSlash(file))
			if g != nil && !diags.HasErrors() {
				diags = append(diags, graph.CheckKeys(g)...) // as dflow validate runs it
			}
			var buf bytes.Buffer
			graph.WriteDiagnostics(&buf, diags, l.Sources())
			golden := strings.TrimSuffix(file, ".json")
			golden = strings.TrimSuffix(golden, ".hcl") + ".golden"
			if *update {
				os.WriteFile(golden, buf.Bytes(), 0o644)
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("no golden file (run with -update): %v", err)
			}
			if got := buf.String(); got != string(want) {
				t.Errorf("diagnostics differ from %s\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
			if len(diags) == 0 {
				t.Errorf("case produced no diagnostics; every case exists to show one")
			}
		})
	}
}
