package follow

import (
	"context"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/cluster/settle"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Env is what the replicas a share follows have of their share, set once
// as the share starts.
type Env struct {
	NC       *nats.Conn
	Job      *wire.Job // the share's own copy, its timings defaulted
	Graph    *graph.Graph
	Instance string             // the share's name
	Ends     jetstream.KeyValue // the run's end bucket: replicas' settled records
	// Ledger settles the receipts of what the replicas take, and keeps
	// resuming sources' positions
	Ledger *settle.Ledger
	// Stop is done once the share's background group stops
	Stop  context.Context
	Share Share
}

// Share is what the replicas a share follows ask of it as they run.
type Share interface {
	// Worker is the name of the share's worker, for its log.
	Worker() string
	// Aborting says the share is being aborted or was counted lost: its
	// replicas restart, and nothing of theirs is recorded settled.
	Aborting() bool
	// Restartable says whether a stage's replicas restart elsewhere when
	// their worker is lost; only theirs are followed.
	Restartable(s *graph.Stage) bool
	// Syncs says whether a stage's replicas step together, Summing
	// whether they are a group of a kind that moves whose members sum in
	// this process (a local group).
	Syncs(s *graph.Stage) bool
	Summing(s *graph.Stage) bool
	// Log is the worker's log.
	Log() io.Writer
	// AfterSend is called after every item a followed replica has sent,
	// before the item it came from is settled (tests crash a worker
	// there).
	AfterSend(stage string)
	// Fail fails the share with err: a replica's item that can be
	// neither handed on nor settled (untold).
	Fail(err error)
	// Go starts f in the share's background group, unless the group's
	// close has begun: then f does not run.
	Go(f func())
}

// Replicas are the restartable replicas a share follows, and the share's
// side of their groups: those across workers (group.Member), hooked to
// the replicas, and those summing in this process (localGroup).
type Replicas struct {
	env Env

	mu       sync.Mutex
	replicas map[replicaKey]*tracked
	locals   map[string]*localGroup
	remotes  map[string]*group.Member // its groups across workers, by stage
}

// New is the share's record of the replicas it follows.
func New(env Env) *Replicas {
	return &Replicas{env: env, replicas: map[replicaKey]*tracked{}}
}

// replicaKey names a replica of a stage.
type replicaKey struct {
	stage string
	i     int
}

// Wrap wraps the node of a restartable stage so that what its replicas
// take and send is followed (the engine's Wrap).
func (f *Replicas) Wrap(s *graph.Stage, n nodes.Node) nodes.Node {
	sh := f.env.Share
	if !sh.Restartable(s) {
		return n
	}
	if len(s.Inputs) == 0 {
		return f.resume(s, n) // a source that resumes
	}
	run := nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
		tr := &tracked{clocked: clocked{r}, f: f, steps: sh.Syncs(s)}
		if sh.Summing(s) {
			tr.local = f.localGroupFor(s)
		}
		f.mu.Lock()
		f.replicas[replicaKey{s.Name, r.Index()}] = tr
		f.mu.Unlock()
		err := n.Run(ctx, tr)
		if err == nil {
			tr.handsOff() // a failed item is not finished: the run fails anyway
			if !tr.ended(ctx, s) {
				return nil // the share is over: what it kept comes back to a restart
			}
			tr.returned(wire.KeySettled(wire.StageIndex(f.env.Graph, s), r.Index()))
		}
		return err
	})
	return engine.Wrapped(n, run) // the deadlock detector still asks n
}

// trackedReplica is replica i of stage, as the share follows it.
func (f *Replicas) trackedReplica(stage string, i int) *tracked {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.replicas[replicaKey{stage, i}]
}

// Group is the share's side of s's group across workers, hooked to the
// replicas it follows.
func (f *Replicas) Group(s *graph.Stage, restart bool) *group.Member {
	find := func(i int) *tracked { return f.trackedReplica(s.Name, i) }
	with := func(i int, fn func(t *tracked)) {
		if t := find(i); t != nil {
			t.mu.Lock()
			fn(t)
			t.mu.Unlock()
		}
	}
	env := f.env
	g := &group.Member{NC: env.NC, Subject: wire.SubjGroup(env.Job.Run, s.Name), Share: env.Instance, Restart: restart, Lone: s.Replicas == 1,
		Held: func(i int) string {
			if t := find(i); t != nil {
				t.mu.Lock()
				defer t.mu.Unlock()
				if len(t.took) > 0 {
					return strings.Join(t.took, ",")
				}
				if t.cur != nil {
					return t.cur.ID()
				}
			}
			return ""
		},
		Settle: env.Ledger.Settle,
		Skip: func(i int, lines []string) {
			with(i, func(t *tracked) {
				t.skip = map[string]uint32{}
				for _, line := range lines {
					id, round, _ := strings.Cut(line, "\t")
					r, _ := strconv.ParseUint(round, 10, 32)
					t.skip[id] = uint32(r)
				}
			})
		},
		Hold: func(i int) { with(i, func(t *tracked) { t.hold = true }) },
		Stepped: func(i int, round uint32) {
			with(i, func(t *tracked) { t.round, t.last, t.took = round, round, nil })
		},
		Durable: func(i int, round uint32) {
			if t := find(i); t != nil {
				t.saved(round)
			}
		},
	}
	f.mu.Lock()
	if f.remotes == nil {
		f.remotes = map[string]*group.Member{}
	}
	f.remotes[s.Name] = g
	f.mu.Unlock()
	return g
}

// groupOf is the share's side of stage's group across workers (nil:
// none).
func (f *Replicas) groupOf(stage string) *group.Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.remotes[stage]
}
