package figures

// The books of a run across hosts: the merged report's counts, checked as
// in one process (engine.CheckBooks) before a run ends ok. Where each
// figure comes from, and so which are counted apart from which
// (figures.go):
//
//   - An edge whose queues all ride a stream, in a run that completed:
//     produced is what the stream stored (every item once: a duplicate
//     sent again after a loss is dropped by its id), consumed what of that
//     is no longer in it (acked). Once every share is done, Unread fails
//     the run where a stream still holds an item, so in a run that would
//     end ok these two are one figure, the broker's, equal by
//     construction.
//   - Any other edge: produced and consumed add up the engines' port
//     counters over the shares (a lost share's as of its last snapshot),
//     the producers' sends and the consumers' receives: counted apart.
//   - A stage's items in and out: the engines' port counters, each
//     replica's from the report of the share that ran it, counted apart
//     from the streams. The check sets them against the edges: what a
//     stage took against what its edges consumed, what it sent against
//     what they produced. Where a replica of a restartable stage was
//     lost, settleLost gives the lost shares' part of the stage what its
//     edges say less what the live shares counted: the stage's totals
//     then equal its edges' by construction, and what the check still
//     sees there is a correction that could not be made (it never takes a
//     lost part below nothing, so live shares that alone counted more
//     than the stream holds stay unbalanced).
//   - A source's total (nodes.Spec.Total), from its config, as every
//     share's snapshot carries it: counted apart from everything, and set
//     against what its out edge produced (the stream's figure, where it
//     rides one), lost shares or not.
//
// The books are per edge: a stage may send fewer items than it takes, so
// an item taken, settled and never sent, by a stage whose counts were all
// settled after a loss, is beyond them.

import (
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/report"
)

// checkBooks fails rep, the merged report of a run that would end ok,
// where its books do not balance (engine.CheckBooks); it returns the run's
// error: err, or the books'.
func checkBooks(r *Run, rep *report.Report, err error) error {
	if err != nil || rep.Status != report.OK {
		return err
	}
	if err := engine.CheckBooksThrough(r.Graph, rep, sourceTotals(r), oneForOne(r)); err != nil {
		rep.Status, rep.Error = report.Failed, err.Error()
		return err
	}
	return nil
}

// oneForOne is which stages' kinds send one item on each output for each
// they take (nodes.Spec.OneForOne): the books carry through them, their
// in edges' figures (a stream's, where one carries the edge) against their
// out edges'.
func oneForOne(r *Run) map[string]bool {
	out := map[string]bool{}
	for _, s := range r.Graph.Stages {
		if spec, ok := r.Registry.Spec(s.Node); ok && spec.OneForOne {
			out[s.Name] = true
		}
	}
	return out
}

// sourceTotals is how many items each source emits in all, by stage,
// where its kind says, as the shares' snapshots have it.
func sourceTotals(r *Run) map[string]int64 {
	out := map[string]int64{}
	for _, in := range r.Shares {
		if in.Last == nil {
			continue
		}
		for _, st := range in.Last.Stages {
			if st.Source && st.Total > 0 {
				out[st.Name] = st.Total
			}
		}
	}
	return out
}
