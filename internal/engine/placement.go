package engine

import (
	"context"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// Placement: running part of a graph, the rest elsewhere.
//
// A run across hosts gives every host's engine the whole graph and
// Options.Here, which says which replicas run on this one. The others are
// away: built (so the report and the snapshots list the whole graph) but
// never started, and counted as returned from the start. A queue then
// counts only its local producers and consumers: the last local producer
// to return calls its transport's Close, which means "every producer on
// this host is done"; the transport counts those ends against the
// producers the graph wires to the queue, on every host, before its Recv
// reports the end (termination from the topology, across hosts). A queue
// with no local consumer gets no pump (its items are for other hosts), and
// one whose producers and consumers are all local stays an in-process
// channel when the transport says so (TransportFor returning nil).
//
// Options.Group gives a stage whose replicas sit on several hosts a group
// of its own (a RemoteGroup): the replicas' collectives and leaves go to
// it instead of the in-process group, charged to their blocked time as
// waits the deadlock detector does not judge.

// PlaceFor says whether replica i of stage s runs in this engine.
type PlaceFor func(s *graph.Stage, replica int) bool

// GroupFor returns the group of stage s's replicas, or nil to keep the
// in-process one.
type GroupFor func(s *graph.Stage) RemoteGroup

// RemoteGroup is a replica group whose members may run in other engines.
// It follows the in-process group's rules: a collective completes when
// every member still present has arrived, and a member that leaves (its
// Run returned or it called Leave) is no longer waited for.
type RemoteGroup interface {
	Barrier(ctx context.Context, replica int) error
	// AllReduce sums x over the members present, stores the sum into x and
	// returns how many contributed.
	AllReduce(ctx context.Context, replica int, x nodes.Reducible) (int, error)
	// Leave removes the replica and reports whether it was the last
	// member present; idempotent (false once it has left).
	Leave(ctx context.Context, replica int) (last bool, err error)
	// Keep records the replica's state, handed to a member restarted
	// elsewhere; on a restarted member it first loads the group's.
	Keep(ctx context.Context, replica int, st nodes.State) error
	// Saves and Saved are nodes.Group's, for the replica.
	Saves(ctx context.Context, replica int) error
	Saved(ctx context.Context, replica, step int) error
}

// place applies Options.Here and Options.Group once the queues are wired.
func (r *run) place() {
	for _, s := range r.stages {
		if r.opts.Group != nil {
			s.remote = r.opts.Group(s.g)
		}
	}
	if r.opts.Here == nil {
		return
	}
	for _, s := range r.stages {
		for _, rep := range s.replicas {
			rep.away = !r.opts.Here(s.g, rep.index)
		}
	}
	for _, e := range r.edges {
		from, to := r.stage(e.g.From.Stage.Name), r.stage(e.g.To.Stage.Name)
		for i, q := range e.queues {
			gq := e.g.Queues[i]
			var prod, cons int32
			for j, p := range gq.Producers {
				if from.replicas[p].away {
					q.live[j].Store(false)
				} else {
					prod++
				}
			}
			for _, c := range gq.Consumers {
				if !to.replicas[c].away {
					cons++
				}
			}
			q.producersLeft.Store(prod)
			q.consumersLeft.Store(cons)
			q.noLocalConsumers = cons == 0
		}
	}
}

// Away reports whether replica i of stage s runs in another engine.
func (p *Pipeline) Away(stage string, i int) bool {
	s := p.r.stage(stage)
	return s != nil && i < len(s.replicas) && s.replicas[i].away
}

// markAway counts an away replica as returned at the start of the run.
func (rep *replica) markAway(now time.Time) {
	rep.ended.Store(now.UnixNano())
}

// leave takes replica i out of its stage's group, and out of the remote
// group when it has one.
func (s *stage) leave(i int) {
	s.group.leave(i)
	if s.remote != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.remote.Leave(ctx, i)
	}
}

// remoteMember is a replica's handle on a RemoteGroup.
type remoteMember struct {
	g RemoteGroup
	r *replica
}

// begin begins a collective's wait, on the replica's remote-group site
// (the coordinator judges it) when ctx is the replica's own.
func (m *remoteMember) begin(ctx context.Context) wait {
	return m.r.beginWaitOn(&m.r.blocked, &m.r.remoteSite, ctx == m.r.ctx)
}

func (m *remoteMember) Barrier(ctx context.Context) error {
	defer m.r.endWait(m.begin(ctx))
	return m.g.Barrier(ctx, m.r.index)
}

func (m *remoteMember) AllReduce(ctx context.Context, x nodes.Reducible) (int, error) {
	defer m.r.endWait(m.begin(ctx))
	return m.g.AllReduce(ctx, m.r.index, x)
}

func (m *remoteMember) AllReduceSum(ctx context.Context, buf []float32) (int, error) {
	return m.AllReduce(ctx, nodes.Floats(buf))
}

func (m *remoteMember) Leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.g.Leave(ctx, m.r.index)
}

// Keep implements nodes.Group.Keep.
func (m *remoteMember) Keep(ctx context.Context, st nodes.State) error {
	defer m.r.endWait(m.begin(ctx))
	return m.g.Keep(ctx, m.r.index, st)
}

// Saves implements nodes.Group.Saves.
func (m *remoteMember) Saves(ctx context.Context) error { return m.g.Saves(ctx, m.r.index) }

// Saved implements nodes.Group.Saved.
func (m *remoteMember) Saved(ctx context.Context, step int) error {
	return m.g.Saved(ctx, m.r.index, step)
}

// Finish implements nodes.Group.Finish: the group across hosts says
// whether this replica was its last member. It is asked even when ctx is
// done (a replica saving on its way out of a cancelled run), for a few
// seconds.
func (m *remoteMember) Finish(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return m.g.Leave(ctx, m.r.index)
}
