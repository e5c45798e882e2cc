package nodes

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
)

// Spec registers a node kind: the part the loader checks (graph.Kind: config
// schema, ports) and the constructor the runtime calls.
type Spec struct {
	graph.Kind
	// New builds the stage's node from its decoded config, once per stage;
	// the runtime then calls Run once per replica, concurrently.
	New func(cfg *graph.Config) (Node, error)
	// Total, if set, says how many items the stage will emit in all (over
	// its replicas) for a config, so progress and ETA can be shown; 0
	// means unknown.
	Total func(cfg *graph.Config) int64
	// Sim, if set, models the node for the simulator (`dflow sim`). Kinds
	// without one are simulated from the stage's sim block or from a
	// measured report.
	Sim func(cfg *graph.Config) (*SimModel, error)
	// Outputs, if set, lists the files the stage writes for a config
	// (models, checkpoints), so a run can say where they go.
	Outputs func(cfg *graph.Config) []string
	// Sync, if set, says whether the stage's replicas step together: each
	// item is one step of a group collective (Barrier or AllReduceSum)
	// that every replica still in the group must reach, as a
	// data-parallel training step does. The simulator models such a stage
	// with a barrier per item, and the deadlock check of `dflow validate`
	// relies on it, also for kinds without a simulation model.
	Sync func(cfg *graph.Config) bool
	// Stateless says that a replica keeps nothing between items that a
	// restart would lose: on a cluster, a replica of such a kind lost with
	// its worker is restarted on a live one and its unfinished items are
	// redelivered (docs/cluster.md); a lost replica of any other kind
	// fails the run. A stateless kind handles one item at a time, its
	// ports used from one goroutine: what a replica sends between two
	// Recvs derives from the item the first returned, and the same item gives the same sends (a restart sends
	// them again and the cluster drops the duplicates). A source is never
	// restarted for it (see Resumes).
	Stateless bool
	// Resumes says that a source emits the same items in the same order
	// on every start with the same config: on a cluster, a replica lost
	// with its worker restarts on a live one and resumes after the items
	// of its that were stored (those it emits before are dropped, and the
	// cluster drops what it sends again after). A source without it fails
	// the run when its worker is lost.
	Resumes bool
	// Moves says that the replicas of a kind that step together (Sync)
	// hand their state to a member restarted elsewhere: each replica gives
	// it to its group (Group.Keep) before its first step, and takes one
	// item per step. On a cluster, a member lost with its worker restarts
	// on a live one; its unfinished step is not counted, its item comes
	// back to the restart, which takes the group's state over from a
	// member still present at that member's next step (docs/cluster.md).
	// In one process, a rebalance moves such a stage's members (one
	// leaves at a step boundary, one joins by taking the state over), as
	// it moves a Stateless kind's replicas; not a Whole kind's.
	// A lost member of a group with no member left fails the run, as does
	// a lost replica of a kind that keeps state without Moves.
	Moves bool
	// Whole says that a kind that moves (Moves) and whose group saves
	// (Group.Saves) cannot go on without any of its members: a member
	// lost with its worker loses the group whole (a torch process group
	// cannot shrink), so on a cluster the other members are stopped too,
	// and every member restarts and restores the group's last save (Keep
	// returns *Restore), the inputs after it coming back. A plugin's
	// group kind that says it restores (Kind.restores) is Whole.
	Whole bool
	// OneForOne says that a replica sends exactly one item on each of its
	// output ports for every item it takes, whatever its config (a map
	// over its input): a run's books then carry through the stage (what
	// its out edges produced equals what its in edges consumed), and a run
	// where they do not fails, as one whose edges do not balance.
	OneForOne bool
}

// Always is a Spec.Sync for kinds whose replicas always step together.
func Always(*graph.Config) bool { return true }

// OutputFile is a file a stage writes.
type OutputFile struct {
	Stage, Path string
	// the file's modification time and size when listed (zero: absent),
	// to tell after the run whether it was written
	mod  time.Time
	size int64
}

// Outputs lists the files g's stages write (Spec.Outputs), in stage
// order, noting each file's state as it is now.
func (r *Registry) Outputs(g *graph.Graph) []OutputFile {
	var out []OutputFile
	for _, s := range g.Stages {
		spec, ok := r.Spec(s.Node)
		if !ok || spec.Outputs == nil {
			continue
		}
		for _, p := range spec.Outputs(s.Config) {
			o := OutputFile{Stage: s.Name, Path: p}
			if st, err := os.Stat(p); err == nil {
				o.mod, o.size = st.ModTime(), st.Size()
			}
			out = append(out, o)
		}
	}
	return out
}

// PrintOutputs says where each output goes, one line each: before a run
// "stage S writes PATH", after it "stage S wrote PATH", or "stage S wrote
// nothing to PATH" when the file is as Outputs found it.
func PrintOutputs(w io.Writer, outs []OutputFile, after bool) {
	for _, o := range outs {
		where := o.Path
		if abs, err := filepath.Abs(o.Path); err == nil && abs != o.Path {
			where += " (" + abs + ")"
		}
		switch st, err := os.Stat(o.Path); {
		case !after:
			fmt.Fprintf(w, "dflow: stage %s writes %s\n", o.Stage, where)
		case err == nil && (!st.ModTime().Equal(o.mod) || st.Size() != o.size):
			fmt.Fprintf(w, "dflow: stage %s wrote %s\n", o.Stage, where)
		default:
			fmt.Fprintf(w, "dflow: stage %s wrote nothing to %s\n", o.Stage, where)
		}
	}
}

// SimModel is how a node behaves in virtual time: each item takes one
// service time; a stage with outputs emits one item per item received (a
// source emits Spec.Total items in all).
type SimModel struct {
	// Service returns the stream of service times of one replica of a
	// stage. The synthetic nodes return the very stream their replicas
	// sleep, so a simulation replays a real run's draws.
	Service func(stage string, replica int) func() time.Duration
	// ServiceAt, if set, is used instead of Service by a node whose cost
	// changes during a run (synthetic_work's change_after, change_at):
	// the stream of one replica's service times, each drawn knowing when
	// the item starts (the time since the run's start) and how many
	// items the stage's replicas started before it.
	ServiceAt func(stage string, replica int) func(elapsed time.Duration, started int64) time.Duration
	// Sync makes the replicas step together: a barrier per item, as
	// synthetic_work's sync does.
	Sync bool
	// FailAfter makes each replica fail after that many items (0: never).
	FailAfter int
	// ItemBytes is the size of each item a source emits, for edges with
	// a capacity_bytes (0: items have no size).
	ItemBytes int64
	// Keys, if set, gives the keys of the items a source's replicas emit
	// (for key_hash edges): Keys(replicas)(replica, seq) is the key of the
	// seq-th item of that replica, the very key a run gives it. Nil: the
	// items have no key.
	Keys func(replicas int) func(replica int, seq int64) string
	// Share, if set, says how many of a source's total items (Spec.Total)
	// replica i of n emits; nil splits them evenly, the first total%n
	// replicas one more.
	Share func(total int64, i, n int) int64
}

// Registry maps node kind names to their specs. It implements
// graph.Catalog. The zero value is not usable; call NewRegistry.
type Registry struct {
	mu    sync.RWMutex
	specs map[string]*Spec
}

// NewRegistry returns an empty registry; tests use their own so they see
// exactly the kinds they register.
func NewRegistry() *Registry { return &Registry{specs: map[string]*Spec{}} }

// Default is the registry the built-in nodes add themselves to in init.
// Only cmd/dflow imports every built-in package.
var Default = NewRegistry()

// Register adds a kind to Default.
func Register(s Spec) { Default.Register(s) }

// Register adds a kind. Registering a name twice, or a spec without a name
// or ports, is a programming error and panics.
func (r *Registry) Register(s Spec) {
	if s.Name == "" || s.Ports == nil {
		panic("nodes: Register needs a name and a Ports function")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.specs[s.Name]; dup {
		panic(fmt.Sprintf("nodes: kind %q registered twice", s.Name))
	}
	r.specs[s.Name] = &s
}

// Spec returns the registered spec of a kind.
func (r *Registry) Spec(name string) (*Spec, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.specs[name]
	return s, ok
}

// Kind implements graph.Catalog.
func (r *Registry) Kind(name string) (*graph.Kind, bool) {
	s, ok := r.Spec(name)
	if !ok {
		return nil, false
	}
	return &s.Kind, true
}

// KindNames implements graph.Catalog: every kind, sorted.
func (r *Registry) KindNames() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := slices.Sorted(maps.Keys(r.specs))
	return names
}

// Clone returns a registry holding the same kinds, to which more can be
// added without touching r (plugin kinds per run, in tests).
func (r *Registry) Clone() *Registry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c := NewRegistry()
	for k, s := range r.specs {
		c.specs[k] = s
	}
	return c
}
