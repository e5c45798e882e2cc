package host

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
	"github.com/zclconf/go-cty/cty"
)

// spinKind computes for spin_ms per item (a loop on the clock, as a model's
// forward pass keeps a core) and passes the item on.
var spinKind = nodes.Spec{
	Kind: graph.Kind{
		Name:   "spin",
		Config: []graph.Field{{Name: "spin_ms", Type: graph.Int, Default: cty.NumberIntVal(5)}},
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}, {Name: "out", Dir: graph.Out, SameAs: "in"}}
		},
	},
	New: func(cfg *graph.Config) (nodes.Node, error) {
		spin := time.Duration(cfg.Int("spin_ms")) * time.Millisecond
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			for {
				item, err := r.In("in").Recv(ctx)
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				for t := time.Now(); time.Since(t) < spin; {
				}
				if err := r.Out("out").Send(ctx, item); err != nil {
					return err
				}
			}
		}), nil
	},
}

// TestPluginTimes: a plugin replica's busy, idle and blocked time and its
// service times are what its node spent (Times), not what dflow's side of
// the stream sees. Its node computes 5 ms an item into a fast sink. Fed as
// fast as it takes them, it is busy most of its life; fed an item every
// 40 ms, it is busy for 5 ms of each and idle the rest. Either way dflow's
// side saw items of microseconds (its feeder's, between two of its Recvs:
// the service p50 of 1.2 µs). Either way its
// service time's median is the 5 ms it spins. A plugin that does not send
// Times (DFLOW_PLUGIN_TIMES=off, as one built before them) still runs,
// measured at dflow's ports as before.
func TestPluginTimes(t *testing.T) {
	t.Parallel()
	const n, spin = 60, 5 * time.Millisecond
	spec := func(pace string) string {
		return fmt.Sprintf(`
stage "src" {
  node = "synthetic_source"
  config {
    count        = %d
    service_time = %q
  }
}
stage "p" {
  node = "tp/spin"
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = p.in
}
edge "b" {
  from = p.out
  to   = sink.in
}`, n, pace)
	}
	run := func(t *testing.T, env, pace string) report.Replica {
		f := newFixture(t)
		path := script(t, f.dir, "tp", fmt.Sprintf("%s DFLOW_TEST_PLUGIN=serve exec %q -test.run='^$' \"$0\"\n", env, self(t)))
		if _, err := f.h.Load("tp", path, f.reg); err != nil {
			t.Fatal(err)
		}
		rep, err := f.run(spec(pace))
		if err != nil {
			t.Fatal(err)
		}
		r := rep.Stages["p"].Replicas[0]
		if r.ItemsIn != n || r.ItemsOut != n {
			t.Fatalf("replica took %d items and sent %d, want %d", r.ItemsIn, r.ItemsOut, n)
		}
		sh := r.Shares()
		t.Logf("busy %.2fs idle %.2fs blocked %.2fs (busy %.0f%%, idle %.0f%%, blocked %.0f%%), service p50 %v mean %v p99 %v",
			r.BusySeconds, r.IdleSeconds, r.BlockedSeconds, 100*sh.Busy, 100*sh.Idle, 100*sh.Blocked,
			seconds(r.ServiceSeconds.P50), seconds(r.ServiceSeconds.Mean), seconds(r.ServiceSeconds.P99))
		return r
	}
	// The median's bucket is about 4% wide: its middle may lie below 5 ms.
	minP50 := spin * 95 / 100
	// One after the other: each keeps a core busy.
	t.Run("fast", func(t *testing.T) {
		r := run(t, "", "0s")
		if sh := r.Shares(); sh.Busy < 0.5 || sh.Blocked > 0.25 {
			t.Errorf("busy %.0f%%, blocked %.0f%%: want mostly busy", 100*sh.Busy, 100*sh.Blocked)
		}
		if p50 := seconds(r.ServiceSeconds.P50); p50 < minP50 {
			t.Errorf("service p50 %v, want at least %v", p50, minP50)
		}
	})
	t.Run("paced", func(t *testing.T) {
		r := run(t, "", "40ms")
		// Busy holds every item's 5 ms (and the plugin's start); idle the
		// rest of each 40 ms once the plugin has started (the items sent
		// meanwhile wait for it). On a loaded machine an item's service
		// (its spin, and its send, on a core the plugin waits for) has
		// taken three times the spin: the pace leaves room for seven.
		if busy := seconds(r.BusySeconds); busy < n*spin*9/10 {
			t.Errorf("busy %v, want at least %v (%d items of %v)", busy, n*spin*9/10, n, spin)
		}
		if sh := r.Shares(); sh.Idle < 0.1 || sh.Blocked > 0.2 {
			t.Errorf("idle %.0f%%, blocked %.0f%%: want idle between items, seldom blocked", 100*sh.Idle, 100*sh.Blocked)
		}
		if p50 := seconds(r.ServiceSeconds.P50); p50 < minP50 {
			t.Errorf("service p50 %v, want at least %v", p50, minP50)
		}
	})
	t.Run("untimed", func(t *testing.T) {
		r := run(t, "DFLOW_PLUGIN_TIMES=off", "20ms")
		// Measured at dflow's ports: the feeder's items take it
		// microseconds, whatever the plugin spends on them.
		if p50 := seconds(r.ServiceSeconds.P50); p50 >= spin/2 {
			t.Errorf("service p50 %v: want dflow's side's figure (the plugin said no Times)", p50)
		}
	})
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
