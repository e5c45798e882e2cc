package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// TestOwnTimes: a node that gives its own account of its time (the plugin
// host, for its plugin's) is shown with it: its idle and blocked time as
// it said, the time since its last account counted towards the wait it
// said it was in, busy the rest; and its service times are its own, not
// what its ports saw.
func TestOwnTimes(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const said, quiet = 30 * time.Millisecond, 100 * time.Millisecond
	h.reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "own", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: "id"}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				c, ok := r.(interface {
					OwnTimes(idle, blocked time.Duration, idleNow, blockedNow bool)
					OwnService(sum time.Duration, counts map[time.Duration]int64)
				})
				if !ok {
					return errors.New("the replica takes no account of its own")
				}
				time.Sleep(2 * said) // said/3 of it idle and 2*said/3 blocked, as the node says next; busy the rest
				c.OwnService(10*5*time.Millisecond, map[time.Duration]int64{5 * time.Millisecond: 9, 5*time.Millisecond + 1: 1})
				c.OwnTimes(said/3, 2*said/3, true, false)
				time.Sleep(quiet) // idle, as it said: counted so without another word
				return nil
			}), nil
		},
	})
	g := h.load(`
stage "src" {
  node = "own"
}
stage "sink" {
  node   = "t"
  config {
    role = "sink"
  }
}
edge "a" {
  from = src.out
  to   = sink.in
}
`)
	rep, err := h.run(g, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Stages["src"].Replicas[0]
	idle, blocked, busy := dur(r.IdleSeconds), dur(r.BlockedSeconds), dur(r.BusySeconds)
	t.Logf("busy %v idle %v blocked %v, service %+v", busy, idle, blocked, r.ServiceSeconds)
	if want := 2 * said / 3; blocked < want-time.Millisecond || blocked > want+time.Millisecond {
		t.Errorf("blocked %v, want the %v the node said", blocked, want)
	}
	if idle < said/3+quiet || busy < said {
		t.Errorf("idle %v, busy %v: want at least %v idle (said, then the wait it said it was in) and %v busy",
			idle, busy, said/3+quiet, said)
	}
	if p50, mean := dur(r.ServiceSeconds.P50), dur(r.ServiceSeconds.Mean); p50 < 4800*time.Microsecond || p50 > 5200*time.Microsecond || mean != 5*time.Millisecond {
		t.Errorf("service p50 %v mean %v, want the node's 5ms", p50, mean)
	}
}

func dur(s float64) time.Duration { return time.Duration(s*1e9 + 0.5) }

// TestWaitIdle: a wait that the runtime around a node marks (WaitIdle)
// is the replica's idle time, not busy.
func TestWaitIdle(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const quiet = 100 * time.Millisecond
	h.reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: "waits", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "out", Dir: graph.Out, Type: "id"}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				w, ok := r.(interface{ WaitIdle() (end func()) })
				if !ok {
					return errors.New("the replica takes no idle wait")
				}
				end := w.WaitIdle()
				time.Sleep(quiet) // the wait marked
				end()
				return nil
			}), nil
		},
	})
	g := h.load(`
stage "src" {
  node = "waits"
}
stage "sink" {
  node   = "t"
  config {
    role = "sink"
  }
}
edge "a" {
  from = src.out
  to   = sink.in
}
`)
	rep, err := h.run(g, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Stages["src"].Replicas[0]
	idle, busy := dur(r.IdleSeconds), dur(r.BusySeconds)
	// the run's coarse clock may count a wait a tick short
	if idle < quiet-20*time.Millisecond || busy > idle {
		t.Errorf("idle %v, busy %v: want the %v wait idle", idle, busy, quiet)
	}
}
