package sdktest_test

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/sdk/sdktest"
)

// TestSourceItemsAreTheirType: synthetic_source emits, for each port type
// it can carry, items of the Go type that type means on the wire.
func TestSourceItemsAreTheirType(t *testing.T) {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	source, _ := reg.Spec("synthetic_source")
	for _, typ := range []string{"blob", "bytes", "tokens", "frames"} {
		res, err := sdktest.RunNode(*source, map[string]any{"count": 3, "size_bytes": 16, "type": typ}, 1, nil)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if len(res.Outputs["out"]) != 3 {
			t.Fatalf("%s: %d items", typ, len(res.Outputs["out"]))
		}
		for _, item := range res.Outputs["out"] {
			if err := wire.CheckPortItem(typ, item); err != nil {
				t.Errorf("synthetic_source with type %q: %v", typ, err)
			}
		}
	}
}

// TestBadConfig: a config value the kind's schema refuses is an error
// naming the key, before anything runs.
func TestBadConfig(t *testing.T) {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	source, _ := reg.Spec("synthetic_source")
	if _, err := sdktest.RunNode(*source, map[string]any{"count": "many"}, 1, nil); err == nil || !strings.Contains(err.Error(), "count") {
		t.Errorf("err = %v", err)
	}
}

// TestSDKLinksNoEngine: a plugin built on the SDK links neither the
// runtime nor dflow's models: the item codec is a registry the item
// types fill (package items), not a switch over the built-in nodes'
// types.
func TestSDKLinksNoEngine(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../examples/checksum").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v\n%s", err, out)
	}
	for _, pkg := range []string{"internal/nn", "nodes/dflash", "internal/engine", "nodes/synthetic", "nodes/text", "github.com/dflow-dev/dflow/run"} {
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasSuffix(dep, pkg) && strings.HasPrefix(dep, "github.com/dflow-dev/dflow") {
				t.Errorf("the checksum plugin links %s", dep)
			}
		}
	}
}

// Example tests a node kind of a plugin's own in process: one replica,
// three inputs, its outputs and metrics collected.
func Example() {
	upper := nodes.Spec{
		Kind: graph.Kind{Name: "upper", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "bytes"}, {Name: "out", Dir: graph.Out, Type: "bytes"}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for {
					item, err := r.In("in").Recv(ctx)
					if err == io.EOF {
						return nil
					} else if err != nil {
						return err
					}
					r.Metrics().Add("items", 1)
					if err := r.Out("out").Send(ctx, []byte(strings.ToUpper(string(item.([]byte))))); err != nil {
						return err
					}
				}
			}), nil
		},
	}
	res, err := sdktest.RunNode(upper, nil, 1, []any{[]byte("a"), []byte("b"), []byte("c")})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, item := range res.Outputs["out"] {
		fmt.Print(string(item.([]byte)))
	}
	fmt.Println("", res.Metrics["items"])
	// Output: ABC 3
}
