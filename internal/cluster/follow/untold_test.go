package follow

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
)

// handing is a replica as the engine runs it, with a delivery in hand.
type handing struct {
	nodes.Replica
	d engine.Receipt
}

func (h *handing) Stage() string             { return "work" }
func (h *handing) Index() int                { return 0 }
func (h *handing) Delivered() engine.Receipt { return h.d }
func (h *handing) Hand(rc engine.Receipt)    { h.d = rc }
func (h *handing) In(string) nodes.Input     { return nil }
func (h *handing) Out(string) nodes.Output   { return nil }
func (h *handing) Draining() <-chan struct{} { return nil }
func (h *handing) Metrics() nodes.Metrics    { return nil }
func (h *handing) Device() string            { return "cpu" }
func (h *handing) Replicas() int             { return 1 }
func (h *handing) Group() nodes.Group        { return nil }

// oneItem is an input whose every receive brings an item.
type oneItem struct{}

func (oneItem) Recv(context.Context) (any, error) { return "item", nil }

// TestUntoldNeverSettled: an item taken again whose group across workers
// cannot say whether it was trained (here no host answers) fails the
// share, and is never settled by it, even where the node goes on
// receiving past the error: acked, it would be lost untrained.
func TestUntoldNeverSettled(t *testing.T) {
	t.Parallel()
	g := clustertest.Chain(t, 1)
	job := &wire.Job{Run: "untold", Remote: map[string][]bool{"a": {true}, "b": {true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2"}, "sink": {"w3"}}}
	f, in, sh := followed(t, job, g, "w2")
	sh.Go(f.env.Ledger.Run) // the ledger settles
	f.mu.Lock()
	f.remotes = map[string]*group.Member{"work": {NC: f.env.NC, Subject: "untold.nobody", Share: "w2"}}
	f.mu.Unlock()
	tk := f.env.Ledger.Take(in, "in-1", nil, true) // taken again
	rep := &handing{d: tk}
	tr := &tracked{f: f, clocked: clocked{rep}}
	ctx := context.Background()
	if _, err := (&trackedIn{Input: oneItem{}, t: tr}).Recv(ctx); err == nil || !strings.Contains(err.Error(), "could not say whether it was trained") {
		t.Fatalf("receive: %v, want the group's silence", err)
	}
	if err := sh.failure(); err == nil {
		t.Fatal("the share was not failed")
	}
	// The node goes on: the engine settles the delivery in hand.
	tk.Done()
	open := func() int { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.open }
	if testutil.Within(300*time.Millisecond, func() bool { return open() == 0 }) {
		t.Fatal("an item whose training is unknown was settled")
	}
}
