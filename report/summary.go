package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// Summarize prints the end-of-run figures for people: the status and
// wall time, a line per stage (items in and out, each replica's busy
// share, the node's metrics, the share of its steps spent waiting for
// data where its members measure their steps) and per edge (policy, produced and consumed,
// each queue's mean depth), in the spec's order, why counts differ where
// they do, and the diagnosis.
func (r *Report) Summarize(w io.Writer) {
	if r.Simulated {
		fmt.Fprintf(w, "simulation %s: %.2fs of simulated time\n", r.Status, r.WallSeconds)
	} else {
		fmt.Fprintf(w, "run %s in %.2fs\n", r.Status, r.WallSeconds)
	}
	for _, name := range r.StageNames() {
		st := r.Stages[name]
		var in, out int64
		util := make([]string, len(st.Replicas))
		for i, rp := range st.Replicas {
			in += rp.ItemsIn
			out += rp.ItemsOut
			util[i] = fmt.Sprintf("%.0f%%", 100*rp.Utilization)
		}
		steps := ""
		if share, ok := st.DataWaitShare(); ok {
			steps = fmt.Sprintf(" (its steps %.1f%% waiting for data)", 100*share)
		}
		fmt.Fprintf(w, "  stage %-10s in=%-6d out=%-6d busy=%v%s%s\n", name, in, out, util, metricList(st.Metrics), steps)
	}
	for _, name := range r.EdgeNames() {
		ed := r.Edges[name]
		depth := make([]string, len(ed.Queues))
		for i, q := range ed.Queues {
			depth[i] = fmt.Sprintf("%.1f", q.MeanDepth)
		}
		left := ""
		switch {
		case ed.Produced > ed.Consumed:
			left = fmt.Sprintf(" (%d never consumed)", ed.Produced-ed.Consumed)
		case ed.Produced < ed.Consumed:
			// only across hosts: a worker lost in a failed run counts as of
			// its last snapshot
			left = fmt.Sprintf(" (%d more consumed than produced: a lost worker's figures are as of its last snapshot)", ed.Consumed-ed.Produced)
		}
		carried := ""
		if ed.Carried != "" {
			carried = " [" + ed.Carried + "]"
		}
		fmt.Fprintf(w, "  edge  %-10s %-11s produced=%d consumed=%d%s mean depth=%v%s\n",
			name, ed.Policy, ed.Produced, ed.Consumed, left, depth, carried)
	}
	if note := r.unconsumed(); note != "" {
		fmt.Fprintln(w, note)
	}
	if len(r.Diagnosis) > 0 {
		fmt.Fprintln(w, "diagnosis:")
		for _, d := range r.Diagnosis {
			fmt.Fprintf(w, "  - %s\n", d)
		}
	}
}

// unconsumed explains why an edge's produced and consumed counts differ:
// a drain or a clean run consumes every item produced, an abort or a
// failure stops the consumers with items still queued, and those are
// dropped.
func (r *Report) unconsumed() string {
	var edges []string
	var n int64
	for _, name := range r.EdgeNames() {
		if ed := r.Edges[name]; ed.Produced > ed.Consumed {
			edges = append(edges, name)
			n += ed.Produced - ed.Consumed
		}
	}
	if n <= 0 {
		return ""
	}
	why := "the run stopped"
	switch r.Status {
	case Aborted:
		why = "the abort stopped the run"
	case Failed:
		why = "the failure stopped the run"
	}
	items := fmt.Sprintf("%d items", n)
	if n == 1 {
		items = "1 item"
	}
	hint := " (a drain, one Ctrl-C, finishes the items in flight instead)"
	switch {
	case r.Simulated:
		hint = ""
	case strings.Contains(r.Error, "deadlock: "):
		hint = " (no drain could have finished them: nothing could move)"
	}
	return fmt.Sprintf("  %s with %s still in the queues of edge %s, never consumed and dropped; "+
		"produced and consumed differ by them%s", why, items, strings.Join(edges, ", "), hint)
}

// metricList formats node metrics as " name=value ..." in name order.
func metricList(m map[string]float64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, " %s=%.4g", k, m[k])
	}
	return b.String()
}
