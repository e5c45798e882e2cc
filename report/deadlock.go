package report

import "strings"

// Deadlock is the error of a run in which no replica can move: each one
// waits on a full queue, an empty queue or its group's step, for replicas
// that wait too. The runtime detects it exactly, in one process or across
// a cluster's workers (docs/runtime.md), and ends the run "failed", or
// "aborted" when it stopped a drain; the report's Error is its message.
// (package run calls it run.Deadlock.)
type Deadlock struct {
	// Cycle is the loop of waits, each "STAGE[I] waits ...": the replica
	// of each line waits for the one on the next, the last for the first.
	Cycle []string
	// Others are the other replicas' waits, in stage order.
	Others []string
	// Fix says what would break the cycle.
	Fix string
	// Draining is set when the deadlock stopped a drain (the run then
	// ends aborted).
	Draining bool
}

func (d *Deadlock) Error() string {
	var b strings.Builder
	if d.Draining {
		b.WriteString("drain cannot complete: ")
	}
	b.WriteString("deadlock: no replica can move; each waits for the next, round a cycle:")
	for _, c := range d.Cycle {
		b.WriteString("\n    " + c)
	}
	if len(d.Others) > 0 {
		b.WriteString("\n  also waiting:")
		for _, o := range d.Others {
			b.WriteString("\n    " + o)
		}
	}
	if d.Fix != "" {
		b.WriteString("\n  " + d.Fix)
	}
	return b.String()
}
