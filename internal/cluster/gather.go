package cluster

// The coordinator's side of the run's figures: it gathers the shares'
// snapshots and reports, and what the streams and records say as the run
// ends; package figures merges them into the run's, and keeps its books.

import (
	"encoding/json"
	"sort"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/figures"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/report"
)

// Snapshot is the cluster's live snapshot: every instance's, merged, as
// a user sees it (a rebalance's slots that have not started left out).
func (c *Coordinator) Snapshot() *report.Snapshot { return c.visible(c.snapshotAll()) }

// snapshotAll is every instance's snapshot merged, every replica in its
// place, a rebalance's parked slots included.
func (c *Coordinator) snapshotAll() *report.Snapshot {
	c.mu.Lock()
	if c.snap != nil && time.Since(c.snapAt) < 100*time.Millisecond {
		s := c.snap
		c.mu.Unlock()
		return s
	}
	var ask []*instance
	for _, in := range c.instances {
		if !in.done && !in.lost {
			ask = append(ask, in)
		}
	}
	run := c.run
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, in := range ask {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := c.o.Conn.Request(wire.SubjSnap(run, in.name), nil, time.Second)
			if err != nil {
				return
			}
			s := &report.Snapshot{}
			if json.Unmarshal(m.Data, s) == nil {
				c.mu.Lock()
				in.last, in.lastAt = s, time.Now()
				c.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	s := c.merge(time.Now())
	c.mu.Lock()
	c.snap, c.snapAt = s, time.Now()
	c.mu.Unlock()
	return s
}

// merge builds one snapshot from the instances' latest (figures.Snapshot).
func (c *Coordinator) merge(now time.Time) *report.Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return figures.Snapshot(c.figures(), now)
}

// merged is the run's report and its error (figures.Report): a run that
// completed (or drained) is counted by its streams and chain records,
// read first.
func (c *Coordinator) merged(status string, err error) (*report.Report, error) {
	if err == nil && status != report.Aborted {
		var names []string // the shares whose chain records count
		c.mu.Lock()
		for _, in := range c.sortedInstances() {
			if len(c.chained) > 0 {
				names = append(names, in.name)
			}
		}
		c.mu.Unlock()
		streams := c.streams().Totals()
		recs, twice := c.streams().Chains(names, c.o.Log)
		c.mu.Lock()
		c.end.Streams, c.end.Chains, c.end.Twice = streams, recs, twice
		c.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rep, err := figures.Report(c.figures(), status, err)
	if c.moves != nil {
		c.moves.Report(rep) // a rebalance's slots that never ran left out
	}
	return rep, err
}

// failed is the report of a run that could not start.
func (c *Coordinator) failed(err error) *report.Report {
	rep, _ := c.merged(report.Failed, err)
	return rep
}

// figures is what package figures reads of the run (c.mu held).
func (c *Coordinator) figures() *figures.Run {
	r := &figures.Run{Graph: c.g, Registry: c.o.Registry, Place: c.place, Remote: c.remote, Chained: c.chained,
		Start: c.start, Series: c.series, End: c.end}
	for _, in := range c.sortedInstances() {
		r.Shares = append(r.Shares, &figures.Share{Name: in.name, Worker: in.worker, Lost: in.lost,
			Report: in.rep, Last: in.last, LastAt: in.lastAt, Ran: in.ran})
	}
	return r
}

// streams is where package figures reads the run's streams and records.
func (c *Coordinator) streams() figures.Streams {
	return figures.Streams{JS: c.js, Run: c.run, Graph: c.g, Remote: c.remote}
}

func (c *Coordinator) sortedInstances() []*instance {
	var out []*instance
	for _, in := range c.instances {
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}
