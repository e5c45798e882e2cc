package graph_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/dflow-dev/dflow/graph"
)

// FuzzLoad feeds arbitrary bytes to the loader, as native and JSON syntax,
// and checks it never panics and never returns a graph alongside errors.
// Its seeds are every shipped spec, every suite case, and the corpus in
// testdata/fuzz/FuzzLoad. Run: go test ./graph -fuzz FuzzLoad
func FuzzLoad(f *testing.F) {
	for _, pattern := range []string{"../specs/*.hcl", "testdata/validate/*.hcl", "testdata/*.json"} {
		files, _ := filepath.Glob(pattern)
		for _, file := range files {
			src, _ := os.ReadFile(file)
			f.Add(src, filepath.Ext(file) == ".json")
		}
	}
	reg := testRegistry()
	f.Fuzz(func(t *testing.T, src []byte, asJSON bool) {
		name := "fuzz.hcl"
		if asJSON {
			name += ".json"
		}
		l := &graph.Loader{Catalog: reg, Sets: []string{"edge.hs.policy=shared"}}
		g, diags := l.Load(name, src)
		if diags.HasErrors() != (g == nil) {
			t.Fatalf("graph %v with errors %v", g != nil, diags.HasErrors())
		}
		var b bytes.Buffer
		graph.WriteDiagnostics(&b, diags, l.Sources())
		graph.WriteDiagnosticsJSON(&b, diags, l.Sources())
		if g != nil {
			for _, format := range graph.Formats {
				graph.Render(&b, g, format)
			}
		}
	})
}
