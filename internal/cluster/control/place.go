package control

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/report"
)

// Kinds says what the stages' kinds allow placement to do with them.
type Kinds struct {
	// Restartable says whether a stage's replicas restart elsewhere after
	// their worker is lost (nil: none does).
	Restartable func(*graph.Stage) bool
	// Chainable says whether a stage may be part of a chain: it restarts
	// elsewhere, and nothing of it outlives an item (no group, no state
	// that moves). Nil: none may.
	Chainable func(*graph.Stage) bool
}

// Place puts the pinned stages' replicas where pins say (replica i on
// the i-th worker named, round the list), and spreads the others evenly
// over the workers, stage after stage (the k-th replica in the spec's
// order goes to worker k mod W, pinned ones counted), except that a replica
// joined to one placed before it by a chainable edge (Chainable) goes
// where that one went: a chain's replicas sit together. It says which
// queues ride JetStream and which edges are chains (Queues).
func Place(g *graph.Graph, workers []string, kinds Kinds, pins map[string][]string) (place map[string][]string, remote map[string][]bool, chained map[string]bool) {
	place = map[string][]string{}
	for _, s := range g.Stages {
		if ws := pins[s.Name]; len(ws) > 0 {
			for i := range s.Replicas {
				place[s.Name] = append(place[s.Name], ws[i%len(ws)])
			}
		}
	}
	links := chainLinks(g, kinds)
	k := 0
	for _, s := range g.Stages {
		if len(pins[s.Name]) > 0 {
			k += s.Replicas // the others go where they would without the pin
			continue
		}
		for i := range s.Replicas {
			w := ""
			for _, o := range links[replica{s.Name, i}] {
				if ps := place[o.stage]; o.i < len(ps) {
					w = ps[o.i] // placed before: the chain stays together
					break
				}
			}
			if w == "" {
				w = workers[k%len(workers)]
				k++
			}
			place[s.Name] = append(place[s.Name], w)
		}
	}
	remote, chained = Queues(g, place, kinds)
	return place, remote, chained
}

type replica struct {
	stage string
	i     int
}

// chainLinks lists, for every replica, the replicas a chainable edge joins
// it to.
func chainLinks(g *graph.Graph, kinds Kinds) map[replica][]replica {
	out := map[replica][]replica{}
	for _, e := range g.Edges {
		if !chainable(e, kinds) {
			continue
		}
		for _, q := range e.Queues {
			p, c := replica{e.From.Stage.Name, q.Producers[0]}, replica{e.To.Stage.Name, q.Consumers[0]}
			out[p] = append(out[p], c)
			out[c] = append(out[c], p)
		}
	}
	return out
}

// chainable reports whether edge e may be a chain's: both its stages
// chainable, and every queue of it one producer's to one consumer, the
// only queue that producer feeds (a replica restarted after a loss sends
// what it sends again to the same queue, so what it sent before, lost
// with the chain, is sent once; and a producer's consumers are not all
// drawn to its worker).
func chainable(e *graph.Edge, kinds Kinds) bool {
	if kinds.Chainable == nil || !kinds.Chainable(e.From.Stage) || !kinds.Chainable(e.To.Stage) {
		return false
	}
	for _, q := range e.Queues {
		if len(q.Producers) != 1 || len(q.Consumers) != 1 || len(e.ProducerQueues(q.Producers[0])) != 1 {
			return false // several consumers, or a producer that picks among queues
		}
	}
	return len(e.Queues) > 0
}

// Queues says, under a placement, which edges are chains and which queues
// ride JetStream.
//
// An edge is a chain's where it is chainable and each of its queues has
// its producer and its consumer on one worker: its items stay in
// process, each with a receipt that derives from the one its producer
// had in hand, and the input at the chain's head is settled once what
// the chain sent on is stored (package settle's chain.go). A lost worker
// restarts its chains whole, from their inputs.
//
// A queue of any other edge rides a stream where its producers and
// consumers are not all on one worker; where it feeds a stage that
// restarts elsewhere after a loss, so that what that stage has not
// finished outlives its worker (package settle's ledger.go); and, on an
// edge of several queues that such a stage feeds, every queue, so that an
// item it sends again, from whichever replica, meets the first in one
// stream, which drops it.
func Queues(g *graph.Graph, place map[string][]string, kinds Kinds) (remote map[string][]bool, chained map[string]bool) {
	remote, chained = map[string][]bool{}, map[string]bool{}
	restartable := kinds.Restartable
	for _, e := range g.Edges {
		together := func(q graph.Queue) bool { return !crosses(e, q, place) }
		if chainable(e, kinds) && allOf(e.Queues, together) {
			chained[e.Name] = true
			remote[e.Name] = make([]bool, len(e.Queues))
			continue
		}
		durable := restartable != nil && (restartable(e.To.Stage) || restartable(e.From.Stage) && len(e.Queues) > 1)
		for _, q := range e.Queues {
			remote[e.Name] = append(remote[e.Name], !together(q) || durable)
		}
	}
	return remote, chained
}

func allOf[T any](xs []T, f func(T) bool) bool {
	for _, x := range xs {
		if !f(x) {
			return false
		}
	}
	return true
}

// Carried says how an edge is carried under a placement, in the report's
// words (report.Edge.Carried), given its queues' remote (Queues) and
// whether it is a chain's.
func Carried(e *graph.Edge, place map[string][]string, remote []bool, chained bool) string {
	across, stream := false, false
	for qi, q := range e.Queues {
		across = across || crosses(e, q, place)
		stream = stream || qi < len(remote) && remote[qi]
	}
	switch {
	case across:
		return report.CarriedCrosses
	case stream:
		return report.CarriedStream
	case chained:
		return report.CarriedChain
	}
	return report.CarriedProcess
}

// crosses reports whether queue q of edge e has producers and consumers
// on more than one worker under a placement.
func crosses(e *graph.Edge, q graph.Queue, place map[string][]string) bool {
	at := map[string]bool{}
	for _, p := range q.Producers {
		at[place[e.From.Stage.Name][p]] = true
	}
	for _, c := range q.Consumers {
		at[place[e.To.Stage.Name][c]] = true
	}
	return len(at) > 1
}

// Pins are the spec's placement attributes with the --place flags (pin)
// over them, checked against the graph and the workers.
func Pins(g *graph.Graph, pin map[string][]string, workers []string) (map[string][]string, error) {
	pins := map[string][]string{}
	for _, s := range g.Stages {
		if len(s.Placement) > 0 {
			pins[s.Name] = s.Placement
		}
	}
	maps.Copy(pins, pin)
	for _, stage := range slices.Sorted(maps.Keys(pins)) {
		if g.Stage(stage) == nil {
			return nil, fmt.Errorf("--place %s: no stage %q in the spec", stage, stage)
		}
		for _, w := range pins[stage] {
			if !slices.Contains(workers, w) {
				return nil, fmt.Errorf("--place %s: no worker %q in the cluster (workers: %s)", stage, w, strings.Join(workers, ", "))
			}
		}
	}
	return pins, nil
}
