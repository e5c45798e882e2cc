package cluster

import (
	"fmt"
	"testing"

	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
)

// TestReviewChainFanOutSpreads: a resuming source of one replica fanning
// out round_robin or key_hash to a stateless stage of 4 replicas, on 4
// workers. Each queue of that edge is one producer's to one consumer, but
// the producer picks among 4 queues: were the edge chainable, placement
// would draw every work replica to the source's worker and leave three
// workers idle. The work replicas are spread.
func TestReviewChainFanOutSpreads(t *testing.T) {
	for _, policy := range []string{"round_robin", "key_hash"} {
		g, err := loader(nodes.Default)(&wire.Job{Filename: "fan.hcl", Src: []byte(fmt.Sprintf(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 10
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 4
}
edge "a" {
  from   = src.out
  to     = work.in
  policy = %q
}
`, policy))})
		if err != nil {
			t.Fatal(err)
		}
		place, carried, err := Plan(g, nodes.Default, []string{"w1", "w2", "w3", "w4"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		at := map[string]bool{}
		for _, w := range place["work"] {
			at[w] = true
		}
		if len(at) < 2 {
			t.Errorf("%s: work's 4 replicas all on %v of 4 workers (edge a %s)", policy, place["work"], carried["a"])
		}
	}
}
