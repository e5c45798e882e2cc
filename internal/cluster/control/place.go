package control

import "github.com/dflow-dev/dflow/graph"

// Place spreads every stage's replicas evenly over the workers, stage
// after stage (replica i of the k-th replica in the spec's order goes to
// worker k mod W), and says which queues ride JetStream (RemoteQueues);
// restartable says which stages restart elsewhere after a loss.
func Place(g *graph.Graph, workers []string, restartable func(*graph.Stage) bool) (place map[string][]string, remote map[string][]bool) {
	place, remote = map[string][]string{}, map[string][]bool{}
	k := 0
	for _, s := range g.Stages {
		for range s.Replicas {
			place[s.Name] = append(place[s.Name], workers[k%len(workers)])
			k++
		}
	}
	return place, RemoteQueues(g, place, restartable)
}

// RemoteQueues says which queues ride JetStream under a placement: those
// whose producers and consumers are not all in one worker; those that
// feed a stage that restarts elsewhere after a loss, so that what it has
// not finished outlives its worker (package cluster's ledger.go); and every queue of an edge
// of several queues that such a stage feeds, so that an item it sends
// again, from whichever replica, meets the first in one stream, which
// drops it.
func RemoteQueues(g *graph.Graph, place map[string][]string, restartable func(*graph.Stage) bool) (remote map[string][]bool) {
	remote = map[string][]bool{}
	for _, e := range g.Edges {
		durable := restartable != nil && (restartable(e.To.Stage) || restartable(e.From.Stage) && len(e.Queues) > 1)
		for _, q := range e.Queues {
			at := map[string]bool{}
			for _, p := range q.Producers {
				at[place[e.From.Stage.Name][p]] = true
			}
			for _, cr := range q.Consumers {
				at[place[e.To.Stage.Name][cr]] = true
			}
			remote[e.Name] = append(remote[e.Name], len(at) > 1 || durable)
		}
	}
	return remote
}
