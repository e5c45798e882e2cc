package run_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestEmbedExample builds and runs examples/embed, a module of its own
// that can import only dflow's public packages (Go forbids another
// module's internal/): the public API is enough to build a graph in Go,
// register a node kind, run it and print the report; and, with
// -local-cluster 2, to coordinate a cluster whose workers are the
// program itself (`embed worker ...`, run.Worker) with its own kinds.
func TestEmbedExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	dir, err := filepath.Abs("../examples/embed")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := testutil.Built(dir, ".", []string{"GOWORK=off", "GOFLAGS="})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "1000"}, "sum of squares of 1..1000 = 333833500\n"},
		{[]string{"-n", "1000", "-local-cluster", "2"}, "sum of squares of 1..1000 = 333833500, on workers [local1 local2]\n"},
	} {
		out, err := exec.CommandContext(ctx, bin, tc.args...).CombinedOutput()
		if err != nil {
			t.Fatalf("embed %s: %v\n%s", strings.Join(tc.args, " "), err, out)
		}
		for _, want := range []string{
			"run ok in",
			"stage square     in=1000   out=1000",
			"edge  n          shared      produced=1000 consumed=1000",
			tc.want,
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("embed %s: the output lacks %q:\n%s", strings.Join(tc.args, " "), want, out)
			}
		}
	}
}
