package engine

import (
	"context"
	"testing"

	"github.com/dflow-dev/dflow/nodes"
)

type quiet struct{ nodes.NodeFunc }

func (quiet) Quiescent(replica int) bool { return replica == 1 }

// TestWrappedKeepsQuiescer: a wrapper made with Wrapped runs its own
// function and says of quiescence what the node it wraps says, and only
// where that node says anything.
func TestWrappedKeepsQuiescer(t *testing.T) {
	ran := false
	run := nodes.NodeFunc(func(context.Context, nodes.Replica) error { ran = true; return nil })
	w := Wrapped(quiet{}, run)
	q, ok := w.(nodes.Quiescer)
	if !ok || q.Quiescent(0) || !q.Quiescent(1) {
		t.Fatalf("wrapped quiescer: %v (want it to say replica 1 only)", ok)
	}
	if err := w.Run(context.Background(), nil); err != nil || !ran {
		t.Fatalf("the wrapper did not run its own function: ran %v, %v", ran, err)
	}
	if _, ok := Wrapped(nodes.NodeFunc(nil), run).(nodes.Quiescer); ok {
		t.Error("a wrapper of a node that says nothing says it is quiescent")
	}
}
