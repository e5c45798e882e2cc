package monitor

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/report"
)

// Status prints one status line per snapshot (engine.Options.Observe):
//
//	[  5.0s] 42% ETA 7s | q_tokens=16 q_hs=[8 8 0] | reader 60.0/s | target busy=[99% 98% 97% 99% 12%] 60.0/s | drafter busy=[99% 98% 12%] 60.0/s loss=2.31
//
// Busy shares and rates cover the last interval. A line longer than Width
// is wrapped: queues on the first line, one stage per line after it. On a
// terminal (TTY) a progress bar is kept below the lines.
type Status struct {
	W     io.Writer
	Width int  // wrap beyond this many columns; 0 means 160
	TTY   bool // draw a progress bar under the lines
	prev  *report.Snapshot
	bar   bool // a bar is drawn on the last line
}

// Observe prints the line for s.
func (st *Status) Observe(s *report.Snapshot) {
	parts := st.Parts(s)
	st.prev = s
	var b strings.Builder
	if st.bar {
		b.WriteString("\r\033[K")
	}
	width := st.Width
	if width == 0 {
		width = 160
	}
	line := strings.Join(parts, " | ")
	if len(line) <= width {
		b.WriteString(line + "\n")
	} else {
		b.WriteString(parts[0] + " | " + parts[1] + "\n")
		for _, p := range parts[2:] {
			b.WriteString("         " + p + "\n")
		}
	}
	if st.TTY {
		if done, total, ok := progress(s); ok {
			b.WriteString(bar(done, total, 40) + " " + eta(s, done, total))
			st.bar = true
		}
	}
	io.WriteString(st.W, b.String())
}

// Finish clears the progress bar.
func (st *Status) Finish() {
	if st.bar {
		io.WriteString(st.W, "\r\033[K")
		st.bar = false
	}
}

// Parts returns the pieces of the status line: the clock and progress,
// the queues, then one piece per stage.
func (st *Status) Parts(s *report.Snapshot) []string {
	head := fmt.Sprintf("[%6.1fs]", s.Elapsed.Seconds())
	if done, total, ok := progress(s); ok {
		head += fmt.Sprintf(" %3.0f%% %s", 100*float64(done)/float64(total), eta(s, done, total))
	}
	parts := []string{head, queues(s)}
	for i, stg := range s.Stages {
		parts = append(parts, st.stage(s, i, stg))
	}
	return parts
}

// queues formats one figure per edge: a list for round_robin, a number
// for shared, and which producers still hold an edge open once some have
// finished.
func queues(s *report.Snapshot) string {
	var out []string
	for _, e := range s.Edges {
		fig := ""
		if e.Policy == graph.Shared && len(e.Queues) == 1 {
			fig = fmt.Sprint(e.Queues[0].Depth)
		} else {
			d := make([]string, len(e.Queues))
			for i, q := range e.Queues {
				d[i] = fmt.Sprint(q.Depth)
			}
			fig = "[" + strings.Join(d, " ") + "]"
		}
		out = append(out, "q_"+e.Name+"="+fig+awaiting(e))
	}
	return strings.Join(out, " ")
}

// awaiting names the producer replicas still holding an edge open, once
// at least one producer has finished and others have not.
func awaiting(e report.EdgeSnapshot) string {
	open := map[int]bool{}
	all := map[int]bool{}
	for _, q := range e.Queues {
		for _, p := range q.Producers {
			all[p] = true
		}
		for _, p := range q.Open {
			open[p] = true
		}
	}
	if len(open) == 0 || len(open) == len(all) {
		return ""
	}
	ids := make([]int, 0, len(open))
	for p := range open {
		ids = append(ids, p)
	}
	sort.Ints(ids)
	return fmt.Sprintf(" (open: %s%v)", e.From, ids)
}

func (st *Status) stage(s *report.Snapshot, i int, stg report.StageSnapshot) string {
	var b strings.Builder
	b.WriteString(stg.Name)
	if stg.Rebalanced {
		fmt.Fprintf(&b, "×%d", stg.Size()) // a rebalance's split as it stands
	}
	if !stg.Source {
		util := s.Utilization(st.prev, i)
		b.WriteString(" busy=[")
		for j, u := range util {
			if j > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.0f%%", 100*u)
		}
		b.WriteString("]")
	}
	fmt.Fprintf(&b, " %.1f/s", st.rate(s, i))
	names := slices.Sorted(maps.Keys(stg.Metrics))
	for _, k := range names {
		fmt.Fprintf(&b, " %s=%.4g", k, stg.Metrics[k])
	}
	return b.String()
}

// rate is the stage's items per second over the last interval: items out
// for a source, items in otherwise.
func (st *Status) rate(s *report.Snapshot, i int) float64 {
	count := func(snap *report.Snapshot) int64 {
		var n int64
		for _, r := range snap.Stages[i].Replicas {
			if snap.Stages[i].Source {
				n += r.ItemsOut
			} else {
				n += r.ItemsIn
			}
		}
		return n
	}
	n, span := count(s), s.Elapsed
	if st.prev != nil && len(st.prev.Stages) > i {
		n -= count(st.prev)
		span -= st.prev.Elapsed
	}
	if span <= 0 {
		return 0
	}
	return float64(n) / span.Seconds()
}

// progress sums what the sources have emitted against their totals; ok is
// false when any source's total is unknown.
func progress(s *report.Snapshot) (done, total int64, ok bool) {
	for _, stg := range s.Stages {
		if !stg.Source {
			continue
		}
		if stg.Total <= 0 {
			return 0, 0, false
		}
		total += stg.Total
		for _, r := range stg.Replicas {
			done += r.ItemsOut
		}
	}
	return done, total, total > 0
}

// eta extrapolates the time left from the rate so far. During a drain the
// sources are stopped and what is left of their totals will never be
// emitted: the run ends when the items in flight are consumed, so there is
// no ETA to give (one extrapolated from a stalled count would only climb).
func eta(s *report.Snapshot, done, total int64) string {
	if s.Draining {
		return "draining"
	}
	if done == 0 {
		return "ETA ?"
	}
	left := time.Duration(float64(s.Elapsed) * float64(total-done) / float64(done))
	return "ETA " + left.Round(time.Second).String()
}

func bar(done, total int64, width int) string {
	n := int(float64(width) * float64(done) / float64(total))
	n = min(max(n, 0), width)
	return fmt.Sprintf("[%s%s] %3.0f%%", strings.Repeat("=", n), strings.Repeat(" ", width-n), 100*float64(done)/float64(total))
}
