package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/graph"
)

// Stuck is a simulation that ran out of events with replicas still
// running: each waits on a full queue, an empty queue or its stage's sync
// step, and nothing is left that could release one. A real run of the
// same wiring deadlocks the same way.
type Stuck struct {
	At    time.Duration // simulated time when the last event ran
	Waits []string      // each stuck replica's wait, in stage order
	// RoundRobin names the round_robin edges the waits are on: making one
	// of them "shared" lets any replica take any of its items.
	RoundRobin []string
	// Full names the edges whose full queues hold producers back.
	Full []string
}

func (e *Stuck) Error() string {
	var names []string
	for _, w := range e.Waits {
		names = append(names, strings.Fields(w)[0])
	}
	return fmt.Sprintf("sim: no event left at %.3fs simulated but replicas %s never finished:\n    %s",
		e.At.Seconds(), strings.Join(names, ", "), strings.Join(e.Waits, "\n    "))
}

// stuck describes the replicas left waiting; nil when every one is done.
func (s *sim) stuck() *Stuck {
	st := &Stuck{At: s.now}
	note := func(list *[]string, e *graph.Edge) {
		for _, n := range *list {
			if n == e.Name {
				return
			}
		}
		*list = append(*list, e.Name)
	}
	for _, sst := range s.stages {
		for _, p := range sst.procs {
			if p.state == done {
				continue
			}
			name := fmt.Sprintf("%s[%d]", sst.g.Name, p.idx)
			switch {
			case p.phase == phaseRecv:
				var qs []string
				for _, q := range p.waiting {
					qs = append(qs, q.name())
					if q.e.g.Policy == graph.RoundRobin {
						note(&st.RoundRobin, q.e.g)
					}
				}
				st.Waits = append(st.Waits, fmt.Sprintf("%s waits for input on %s (empty)", name, strings.Join(qs, ", ")))
			case p.phase == phaseBarrier:
				st.Waits = append(st.Waits, fmt.Sprintf("%s waits at stage %s's group step (%d of %d there)",
					name, sst.g.Name, len(sst.arrived), sst.members))
			case p.phase == phaseSend:
				o := p.outs[p.sendIdx]
				q := o.queues[o.cur]
				if q.e.g.Policy == graph.RoundRobin {
					note(&st.RoundRobin, q.e.g)
				}
				note(&st.Full, q.e.g)
				st.Waits = append(st.Waits, fmt.Sprintf("%s waits to send on %s (full, %d of %d)", name, q.name(), q.depth(), q.cap))
			default:
				st.Waits = append(st.Waits, name+" never finished")
			}
		}
	}
	if len(st.Waits) == 0 {
		return nil
	}
	return st
}

// name is the queue as the status line shows it.
func (q *squeue) name() string {
	if len(q.e.queues) == 1 {
		return q.e.g.Name
	}
	return fmt.Sprintf("%s[%d]", q.e.g.Name, q.index())
}

// The deadlock probe's stand-ins.
const (
	probeService  = time.Millisecond // a service time for kinds without a model
	probeMaxItems = 50_000           // at most this many items from a source
)

// probeItems is how many items a source whose total is unknown emits in
// the probe: enough to fill every queue of the graph many times over, so
// that a rotation feeding queues unevenly has overrun them by the end.
func probeItems(g *graph.Graph) int64 {
	n := int64(256)
	for _, e := range g.Edges {
		n += 16 * int64(e.Capacity*len(e.Queues))
	}
	return n
}

// ProbeDeadlock simulates g to see whether its wiring deadlocks: with each
// node's own model where it has one (its sim block otherwise) and
// probeService an item where it has neither, sync steps where the kind
// declares them (nodes.Spec.Sync), and each source emitting its total, or
// probeItems when it cannot say (at most probeMaxItems). Whether a wiring
// deadlocks seldom hangs on service times: a rotation that feeds a sync
// stage's queues unevenly overruns them at any speed. It returns the
// stuck state, or nil when the simulated run ends (or cannot be
// simulated). opts.From, Interval and Observe are ignored.
func ProbeDeadlock(g *graph.Graph, opts Options) *Stuck {
	opts.probe, opts.From, opts.Interval, opts.Observe = true, nil, 0, nil
	s, err := build(g, opts)
	if err != nil {
		return nil
	}
	s.run()
	st, _ := s.err.(*Stuck)
	return st
}
