package sdktest

import (
	"context"
	"fmt"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/sdk"
	"github.com/dflow-dev/dflow/report"
)

// stepper is a group kind whose replicas take their input in steps of
// 2 and say, per step, how many items they had and the step's total.
var stepper = nodes.Spec{
	Kind: graph.Kind{
		Name: "stepper",
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "bytes"}, {Name: "out", Dir: graph.Out, Type: "bytes"}}
		},
	},
	Sync: nodes.Always,
	New: func(*graph.Config) (nodes.Node, error) {
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			for st, err := range sdk.Steps(ctx, r, "in", 2) {
				if err != nil {
					return err
				}
				line := fmt.Sprintf("%d %d %d %d %d", r.Index(), st.Index, len(st.Items), st.Total, st.Members)
				if err := r.Out("out").Send(ctx, []byte(line)); err != nil {
					return err
				}
			}
			return nil
		}), nil
	},
}

// TestStepsInProcess: sdk.Steps works on a built-in kind's group as on a
// plugin's: 7 items over 3 replicas, 2 a step: every replica has the
// same steps, the totals of each step agree and add up to 7; the steps'
// wait for data and compute are measured (node metrics).
func TestStepsInProcess(t *testing.T) {
	var inputs []any
	for i := range 7 {
		inputs = append(inputs, []byte{byte(i)})
	}
	res, err := RunNode(stepper, nil, 3, inputs)
	if err != nil {
		t.Fatal(err)
	}
	steps := map[int]int{}  // replica -> steps
	totals := map[int]int{} // step -> total
	items := map[int]int{}  // step -> items over the replicas
	for _, it := range res.Outputs["out"] {
		var rep, step, n, total, members int
		if _, err := fmt.Sscanf(string(it.([]byte)), "%d %d %d %d %d", &rep, &step, &n, &total, &members); err != nil {
			t.Fatal(err)
		}
		if members != 3 || n > 2 {
			t.Errorf("replica %d step %d: %d items of %d members", rep, step, n, members)
		}
		if prev, ok := totals[step]; ok && prev != total {
			t.Errorf("step %d: totals %d and %d", step, prev, total)
		}
		totals[step] = total
		items[step] += n
		steps[rep]++
	}
	sum := 0
	for step, total := range totals {
		if items[step] != total {
			t.Errorf("step %d: total %d, items %d", step, total, items[step])
		}
		sum += total
	}
	if sum != 7 {
		t.Errorf("the steps hold %d items, want 7", sum)
	}
	if len(steps) != 3 || steps[0] != steps[1] || steps[1] != steps[2] {
		t.Errorf("steps per replica: %v, want the same on all 3", steps)
	}
	// Steps measures each step's wait for data and its compute.
	if w, c := res.Metrics[report.DataWait], res.Metrics[report.Compute]; w <= 0 || c <= 0 {
		t.Errorf("%s %v, %s %v: want both measured; metrics %v", report.DataWait, w, report.Compute, c, res.Metrics)
	}
}
