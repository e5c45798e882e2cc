// Package plugintest holds what the plugin tests of several packages
// (the host's, the Python example's) share.
package plugintest

import (
	"context"
	"fmt"
	"io"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
)

// BThenA is an in-process node kind, "b_then_a", that takes count items
// from its input b, then count from a, then expects both to end: the
// consumer of ForkSpec. Each item must be a synthetic.Blob whose Data
// names its port and whose Seq counts from 0 on that port.
func BThenA(count int) nodes.Spec {
	return nodes.Spec{
		Kind: graph.Kind{Name: "b_then_a", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "a", Dir: graph.In, Type: "blob"}, {Name: "b", Dir: graph.In, Type: "blob"}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for _, port := range []string{"b", "a"} {
					for i := range count {
						item, err := r.In(port).Recv(ctx)
						if err != nil {
							return fmt.Errorf("%s after %d items: %w", port, i, err)
						}
						if b, ok := item.(*synthetic.Blob); !ok || string(b.Data) != port || b.Seq != int64(i) {
							return fmt.Errorf("item %d on %s is %v", i, port, item)
						}
					}
				}
				for _, port := range []string{"a", "b"} {
					if item, err := r.In(port).Recv(ctx); err != io.EOF {
						return fmt.Errorf("%s: %v (%v) after %d items, want the end", port, item, err, count)
					}
				}
				return nil
			}), nil
		},
	}
}

// ForkSpec is a pipeline in which stage f, of node kind fork (a plugin's:
// count items on each of its outputs a and b, sent concurrently), feeds
// BThenA over two edges that hold 4 items each.
func ForkSpec(fork string, count int) string {
	return fmt.Sprintf(`
stage "f" {
  node = %q
  config {
    count = %d
  }
}
stage "j" {
  node = "b_then_a"
}
edge "a" {
  from     = f.a
  to       = j.a
  capacity = 4
}
edge "b" {
  from     = f.b
  to       = j.b
  capacity = 4
}`, fork, count)
}
