package graph_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
)

// FuzzLoad feeds arbitrary bytes to the loader, as native and JSON syntax,
// and checks it never panics and never returns a graph alongside errors.
// Its seeds are every spec in the repository (specs/, every .hcl and .json
// under graph/testdata, the plugin examples') and the corpus in
// testdata/fuzz/FuzzLoad. Run: go test ./graph -fuzz FuzzLoad
func FuzzLoad(f *testing.F) {
	seeds := 0
	for _, root := range []string{"../specs", "testdata", "../plugins/examples"} {
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.Contains(path, "fuzz") {
				return err
			}
			if ext := filepath.Ext(path); ext == ".hcl" || ext == ".json" {
				src, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				f.Add(src, ext == ".json")
				seeds++
			}
			return nil
		})
	}
	if seeds < 20 {
		f.Fatalf("only %d seed specs found", seeds)
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
