package sim

import (
	"fmt"
	"strings"

	"github.com/dflow-dev/dflow/graph"
)

// workShare is the least share of the busiest movable stage's work a
// stage must carry to be rebalanced by RebalanceStages: a stage that does
// next to nothing (a sink) gains nothing from replicas and gives the
// budget none worth moving.
const workShare = 0.1

// rateItems is the most items a source emits in the simulations that
// predict a split's rate (its total scaled down, as for Predictor):
// enough for the steady state.
const rateItems = 2000

// RebalanceStages chooses the stages `dflow run --rebalance` moves
// replicas between, for a spec without a rebalance block: of the stages
// whose replicas can move (graph.Movable), those the simulation of g with
// opts' models finds carrying the work, their replicas' busy time summed
// at least a tenth of the busiest such stage's (the stages a diagnosis
// names as the bottleneck and its feeders, not a sink that costs
// nothing). Where g cannot be simulated (a kind with no model), every
// movable stage. Fewer than two is an error saying why the other stages
// cannot move.
func RebalanceStages(g *graph.Graph, opts Options) ([]string, error) {
	movable, whyNot := graph.Movable(g)
	if len(movable) >= 2 {
		opts.Interval, opts.Observe, opts.maxItems = 0, nil, rateItems
		if s, err := build(g, opts); err == nil {
			if s.run(); s.err == nil {
				work := map[string]float64{}
				most := 0.0
				for _, st := range s.stages {
					for _, p := range st.procs {
						work[st.g.Name] += p.acc[busy].Seconds()
					}
				}
				for _, name := range movable {
					most = max(most, work[name])
				}
				var chosen []string
				for _, name := range movable {
					if work[name] >= workShare*most {
						chosen = append(chosen, name)
					} else {
						whyNot = append(whyNot, fmt.Sprintf("stage %q does %.0f%% of the work of stage %q", name, 100*work[name]/most, busiest(work, movable)))
					}
				}
				if most > 0 {
					movable = chosen
				}
			}
		}
	}
	if len(movable) < 2 {
		what := fmt.Sprintf("%q", g.Name)
		if g.Filename != "" {
			what = g.Filename
		}
		detail := fmt.Sprintf("no two stages of %s can move replicas between them", what)
		if len(whyNot) > 0 {
			detail += " (" + strings.Join(whyNot, "; ") + ")"
		}
		return nil, fmt.Errorf("%s; a stage whose replicas move is not a source, and every edge into or out of it is shared (--set edge.NAME.policy=shared)", detail)
	}
	return movable, nil
}

func busiest(work map[string]float64, names []string) string {
	best := ""
	for _, n := range names {
		if best == "" || work[n] > work[best] {
			best = n
		}
	}
	return best
}
