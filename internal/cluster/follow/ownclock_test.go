package follow

import (
	"testing"
	"time"

	"github.com/dflow-dev/dflow/nodes"
)

// clockReplica is an engine replica as far as a node's own clock goes.
type clockReplica struct {
	nodes.Replica
	times, services int
}

func (c *clockReplica) OwnTimes(time.Duration, time.Duration, bool, bool) { c.times++ }
func (c *clockReplica) OwnService(time.Duration, map[time.Duration]int64) { c.services++ }

// TestOwnClockThroughShare: a plugin node that measures its own busy and
// idle time (plugins/host asks its replica for OwnTimes and OwnService)
// still reaches the engine's replica through the share's runtime around a
// restartable stage or a resuming source; without it, such a plugin on a
// cluster was measured at its ports, computing while shown idle.
func TestOwnClockThroughShare(t *testing.T) {
	for _, wrap := range []func(r nodes.Replica) nodes.Replica{
		func(r nodes.Replica) nodes.Replica { return &tracked{clocked: clocked{r}} },
		func(r nodes.Replica) nodes.Replica { return &resumed{clocked: clocked{r}} },
	} {
		inner := &clockReplica{}
		c, ok := wrap(inner).(ownClock)
		if !ok {
			t.Fatalf("%T hides the engine replica's own clock", wrap(inner))
		}
		c.OwnTimes(time.Second, 0, false, false)
		c.OwnService(time.Second, nil)
		if inner.times != 1 || inner.services != 1 {
			t.Errorf("%T: %d times, %d services reached the replica, want 1 each", wrap(inner), inner.times, inner.services)
		}
	}
}
