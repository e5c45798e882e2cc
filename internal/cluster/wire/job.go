package wire

import (
	"fmt"
	"regexp"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/nodes"
)

// Job is what the coordinator sends a worker: the spec as the coordinator
// loaded it (source and overrides, so every worker builds the same graph)
// and where every replica runs.
type Job struct {
	Run      string            `json:"run"`
	Filename string            `json:"filename"`
	Src      []byte            `json:"src"`
	Vars     map[string]string `json:"vars,omitempty"`
	VarFiles []string          `json:"var_files,omitempty"`
	Sets     []string          `json:"sets,omitempty"`
	// Place[stage][i] is the instance that runs replica i of stage.
	Place map[string][]string `json:"place"`
	// Remote[edge][i] says whether queue i of edge rides JetStream.
	Remote map[string][]bool `json:"remote"`
	// Chained says which edges are chains': in process, their items
	// carrying receipts derived from their producers' (package
	// settle's chain.go).
	Chained map[string]bool `json:"chained,omitempty"`
	// Recount are the heads of chains that lost shares recorded last
	// (ChainRecord.Last): one that comes back is counted apart.
	Recount ChainHeads    `json:"recount"`
	Grace   time.Duration `json:"grace"`
	// Instance names the share of the job this request starts: the
	// worker's name, or a restart's name (worker/rN) for replicas moved
	// from a lost worker.
	Instance string `json:"instance"`
	// Restart says the share takes over replicas of a lost worker.
	Restart bool `json:"restart,omitempty"`
	// Provenance is the run that files written by the job's stages
	// record (the coordinator's): the replicas of a stage on several
	// workers write and overwrite one run's checkpoint.
	Provenance nodes.Run `json:"provenance"`
	// Timings are the run's lease and ack wait (the coordinator's).
	Timings Timings `json:"timings"`
	// DataKey is the run's key to the workers' data planes (package dataplane),
	// made up by the coordinator: only a holder of the job has it.
	DataKey string `json:"data_key"`
	// DataThreshold is the size past which an item's bytes go over the
	// data plane (0: 256 KiB).
	DataThreshold int `json:"data_threshold,omitempty"`
	// Restore, by stage, restarts a group lost whole that summed on one
	// worker from its last save (package follow's saves.go).
	Restore map[string]*Restore `json:"restore,omitempty"`
	// Attempt, by stage, counts the times a group that starts distributed
	// ranks was lost whole and started again: its ranks meet at the rank 0
	// of their attempt (the share that runs rank 0 records where it
	// listens under the attempt), never at an earlier attempt's, whatever
	// placement a member's job was sent with.
	Attempt map[string]int `json:"attempt,omitempty"`
	// Parked, by stage, are a rebalance's spare slots: the last Parked[s]
	// replicas of each rebalanced stage, placed as Place says and parked
	// until a move starts one (WithSlots; package engine's parked.go).
	Parked map[string]int `json:"parked,omitempty"`
	// Started are the slots a move has started, by stage, and Released
	// the stages whose slots were released, as the job is sent: a share
	// taking over a lost worker's replicas runs a slot that had started
	// as a replica, and lets go at once those of a released stage.
	Started  map[string][]int `json:"started,omitempty"`
	Released []string         `json:"released,omitempty"`
	// Left are the replicas a move took away, by stage: a share taking
	// over a lost worker's does not run them again.
	Left map[string][]int `json:"left,omitempty"`
}

// WithSlots is g with each rebalanced stage's parked slots added to its
// replicas (Job.Parked): the graph every worker of a run that moves
// replicas builds, and its coordinator.
func WithSlots(g *graph.Graph, parked map[string]int) (*graph.Graph, error) {
	if len(parked) == 0 {
		return g, nil
	}
	var changes []graph.Change
	for _, s := range g.Stages {
		if n := parked[s.Name]; n > 0 {
			changes = append(changes, graph.SetReplicas(s.Name, s.Replicas+n))
		}
	}
	out, diags := g.With(changes...)
	if diags.HasErrors() {
		return nil, fmt.Errorf("a rebalance's spare slots: %s", diags.Error())
	}
	if out.Rebalance == nil {
		// `dflow run --rebalance` on a spec without the block: the
		// workers load the spec without it, so the slots name the stages
		rb := &graph.Rebalance{FromFlag: true}
		for _, s := range out.Stages {
			if parked[s.Name] > 0 {
				rb.Stages = append(rb.Stages, s.Name)
			}
		}
		out.Rebalance = rb
	}
	return out, nil
}

// Move is a move the coordinator asks of a share (SubjMove): replica
// Leave of stage From leaves after its item in hand, and the parked
// replica Start of stage To starts on its device once it has; or, with
// Release set, the stage's parked replicas that have not started will
// not (package engine's parked.go).
type Move struct {
	From    string `json:"from,omitempty"`
	Leave   int    `json:"leave,omitempty"`
	To      string `json:"to,omitempty"`
	Start   int    `json:"start,omitempty"`
	Release string `json:"release,omitempty"`
}

// Hello is a worker's announcement.
type Hello struct {
	Name string `json:"name"`
	Busy bool   `json:"busy"`
}

// Done is an instance's report at the end of its share.
type Done struct {
	Instance string `json:"instance"`
	Report   []byte `json:"report"`
	// Snapshot is the share's last snapshot, taken as it ended: the
	// replicas' node metrics, which the coordinator merges by each
	// metric's rule.
	Snapshot []byte `json:"snapshot,omitempty"`
	Err      string `json:"err,omitempty"`
	Failed   bool   `json:"failed"`
}

// Reply is the answer to a request: empty Err means accepted.
type Reply struct {
	Err string `json:"err,omitempty"`
}

func SubjHello(name string) string           { return "dflow.hello." + name }
func SubjRun(worker string) string           { return "dflow.w." + worker + ".run" }
func SubjExit(worker string) string          { return "dflow.w." + worker + ".exit" }
func SubjHB(run string) string               { return "dflow.r." + run + ".hb" }
func SubjAlive(run string) string            { return "dflow.r." + run + ".alive" }
func SubjAbort(run string) string            { return "dflow.r." + run + ".abort" }
func SubjDrain(run string) string            { return "dflow.r." + run + ".drain" }
func SubjAbortShare(run, inst string) string { return "dflow.r." + run + ".abort." + Token(inst) }
func SubjDone(run string) string             { return "dflow.r." + run + ".done" }
func SubjSnap(run, inst string) string       { return "dflow.r." + run + ".snap." + Token(inst) }
func SubjMove(run, inst string) string       { return "dflow.r." + run + ".move." + Token(inst) }
func SubjGroup(run, stage string) string     { return "dflow.r." + run + ".grp." + Token(stage) }
func SubjQueue(run string, e, q int) string  { return fmt.Sprintf("dflow.q.%s.%d.%d", run, e, q) }

// SubjRoom is where a queue's consumer side says it has fetched, which
// makes room, to the producers on other workers waiting for it
// (publish.go); apart from the queue's subject, which its stream stores.
func SubjRoom(run string, e, q int) string { return fmt.Sprintf("dflow.r.%s.room.%d.%d", run, e, q) }

// StreamEdge is an edge's stream: every remote queue of the edge is a
// subject of it (SubjQueue) read by a consumer of its own (ConsumerQueue),
// and its ids are one namespace, so a duplicate is dropped whichever queue
// it is sent to.
func StreamEdge(run string, e int) string { return fmt.Sprintf("DFQ_%s_%d", run, e) }
func ConsumerQueue(q int) string          { return fmt.Sprintf("q%d", q) }
func BucketEnds(run string) string        { return "DFE_" + run }
func BucketHolders(run string) string     { return "DFH_" + run }
func BucketPositions(run string) string   { return "DFP_" + run }
func KeyEnd(e, q, producer int) string {
	return fmt.Sprintf("e%d.q%d.p%d", e, q, producer)
}

// KeySettled says replica i of stage si, a followed one, has returned and
// everything it took is settled (tracked.ended); its value is the
// instance that ran it.
func KeySettled(si, i int) string {
	return fmt.Sprintf("s%d.r%d.settled", si, i)
}

// KeyGone says a consumer replica of a queue has returned.
func KeyGone(e, q, consumer int) string {
	return fmt.Sprintf("e%d.q%d.c%d", e, q, consumer)
}

// Token makes a name safe as one subject token.
func Token(s string) string { return badToken.ReplaceAllString(s, "_") }

var badToken = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// ValidName is a worker name: letters, digits, - and _.
var ValidName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Intervals of the control plane.
const (
	HelloEvery = 250 * time.Millisecond
	HBEvery    = control.Beat
)

// Timings are a run's lease and ack wait across hosts. The coordinator
// sends them in the job, so that every share of a run keeps the same.
type Timings struct {
	// Lease is how long a worker may stay silent before the coordinator
	// counts it lost (and its replicas restart elsewhere), and the
	// coordinator before a worker aborts its share. Heartbeats go every
	// 250ms, on goroutines of their own, so only a pause of the whole
	// process (a GC pause, a host too loaded to schedule it) or a cut
	// network is that long. Default DefaultLease.
	Lease time.Duration `json:"lease"`
	// AckWait is how long an item delivered to a worker may stay unacked
	// before JetStream redelivers it; the worker renews what it holds
	// every AckWait/4, so after a loss the lost worker's items come back
	// within it. Default DefaultAckWait.
	AckWait time.Duration `json:"ack_wait"`
	// Answer bounds a request to the server on an item's way: a read of a
	// queue's room, a pipelined publish's answer (a connection's publishes
	// are answered within the default, DefaultAnswer, whatever a job says).
	// A wait for room has no bound.
	Answer time.Duration `json:"answer,omitempty"`
	// DeadlockConfirm is how long a stuck state across workers must hold,
	// unchanged and seen three times, before the coordinator judges it a
	// deadlock. Default DefaultDeadlockConfirm.
	DeadlockConfirm time.Duration `json:"deadlock_confirm,omitempty"`
}

// The defaults: long enough that a GC pause or a loaded host does not
// count a working worker lost, short enough that a lost one's work moves
// within seconds.
const (
	DefaultLease           = 5 * time.Second
	DefaultAckWait         = 5 * time.Second
	DefaultDeadlockConfirm = 2 * time.Second
)

// WithDefaults fills what is unset.
func (t Timings) WithDefaults() Timings {
	if t.DeadlockConfirm <= 0 {
		t.DeadlockConfirm = DefaultDeadlockConfirm
	}
	if t.Lease <= 0 {
		t.Lease = DefaultLease
	}
	if t.AckWait <= 0 {
		t.AckWait = DefaultAckWait
	}
	if t.Answer <= 0 {
		t.Answer = DefaultAnswer
	}
	return t
}

// RestartGuard is how long a share taking over a lost one's replicas
// waits before it may end a queue: the lost one's items are redelivered
// within AckWait of when it stopped keeping them.
func (t Timings) RestartGuard() time.Duration { return t.AckWait + 2*time.Second }
