package sim

import (
	"fmt"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/hashicorp/hcl/v2"
)

// DeadlockWarnings simulates g's wiring (ProbeDeadlock) and, where it
// deadlocks, returns a warning at the edge whose policy would fix it,
// listing each replica's wait: what `dflow validate` prints.
func DeadlockWarnings(g *graph.Graph, opts Options) hcl.Diagnostics {
	st := ProbeDeadlock(g, opts)
	if st == nil {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Simulated, this pipeline stops after %.3fs with every replica waiting for another, for ever:\n    %s\n  ",
		st.At.Seconds(), strings.Join(st.Waits, "\n    "))
	var subject *hcl.Range
	edge := func(name string) *graph.Edge {
		for _, ed := range g.Edges {
			if ed.Name == name {
				return ed
			}
		}
		return nil
	}
	switch {
	case len(st.RoundRobin) > 0:
		last := st.RoundRobin[len(st.RoundRobin)-1]
		fmt.Fprintf(&b, "round_robin ties each queue of %s to fixed replicas, so one starved replica holds up the rest: "+
			"policy = \"shared\" on %s lets any replica take any item (--set edge.%s.policy=shared); "+
			"a larger capacity only postpones it while the queues are fed unevenly", quoted(st.RoundRobin), either(len(st.RoundRobin)), last)
		subject = rangeOf(edge(last), true)
	case len(st.Full) > 0:
		fmt.Fprintf(&b, "a larger capacity on %s gives the replicas room to get out of step (--set edge.%s.capacity=N)",
			quoted(st.Full), st.Full[0])
		subject = rangeOf(edge(st.Full[0]), false)
	default:
		b.WriteString("no queue is full: check the stages' own ends")
	}
	if plugins := pluginStages(g, st); len(plugins) > 0 {
		fmt.Fprintf(&b, ". The waits run through plugin stage %s: dflow run stops such a run within seconds, naming the cycle, "+
			"when the plugin says when its node waits (the Go SDK and the Python module do, unless set concurrent); "+
			"through an older plugin the run would hang, not stop.",
			strings.Join(plugins, ", "))
	} else {
		b.WriteString(". dflow run stops such a run within seconds, naming the cycle of waits.")
	}
	return hcl.Diagnostics{{Severity: hcl.DiagWarning, Summary: "the wiring can deadlock", Detail: b.String(), Subject: subject}}
}

// rangeOf is where to point at an edge: its policy (or capacity)
// attribute when the spec sets it, else its block.
func rangeOf(ed *graph.Edge, policy bool) *hcl.Range {
	if ed == nil {
		return nil
	}
	r := ed.CapacityRange
	if policy {
		r = ed.PolicyRange
	}
	if r.Filename == "" {
		r = ed.DeclRange
	}
	if r.Filename == "" {
		return nil
	}
	return &r
}

func either(n int) string {
	if n == 1 {
		return "it"
	}
	return "either"
}

func quoted(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("edge %q", n)
	}
	return strings.Join(q, " and ")
}

// pluginStages names the plugin stages (node "PLUGIN/KIND") with a
// replica among the stuck ones.
func pluginStages(g *graph.Graph, st *Stuck) []string {
	var out []string
	for _, s := range g.Stages {
		if !strings.Contains(s.Node, "/") {
			continue
		}
		for _, w := range st.Waits {
			if strings.HasPrefix(w, s.Name+"[") {
				out = append(out, fmt.Sprintf("%q", s.Name))
				break
			}
		}
	}
	return out
}
