package graph_test

import (
	"os"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/hashicorp/hcl/v2"
)

// TestSpecLanguageExample keeps the first example of
// docs/spec-language.md valid: it loads with exactly the one warning the
// page mentions.
func TestSpecLanguageExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/spec-language.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(doc), "```hcl\n")
	example, _, _ := strings.Cut(rest, "```")
	l := &graph.Loader{Catalog: testRegistry()}
	g, diags := l.Load("example.hcl", []byte(example))
	if g == nil || len(diags) != 1 || diags[0].Severity != hcl.DiagWarning || !strings.Contains(diags[0].Detail, `"drafter"`) {
		t.Fatalf("example: graph %v, diagnostics %v", g != nil, diags)
	}
}
