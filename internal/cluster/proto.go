package cluster

import (
	"fmt"
	"regexp"
	"time"

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
	// carrying receipts derived from their producers' (chain.go).
	Chained map[string]bool `json:"chained,omitempty"`
	// Recount are the heads of chains that lost shares recorded last
	// (chainRecord.Last): one that comes back is counted apart.
	Recount chainHeads    `json:"recount"`
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
	// worker from its last save (saves.go).
	Restore map[string]*Restore `json:"restore,omitempty"`
}

// hello is a worker's announcement.
type hello struct {
	Name string `json:"name"`
	Busy bool   `json:"busy"`
}

// done is an instance's report at the end of its share.
type done struct {
	Instance string `json:"instance"`
	Report   []byte `json:"report"`
	// Snapshot is the share's last snapshot, taken as it ended: the
	// replicas' node metrics, which the coordinator merges by each
	// metric's rule.
	Snapshot []byte `json:"snapshot,omitempty"`
	Err      string `json:"err,omitempty"`
	Failed   bool   `json:"failed"`
}

// reply is the answer to a request: empty Err means accepted.
type reply struct {
	Err string `json:"err,omitempty"`
}

func subjHello(name string) string           { return "dflow.hello." + name }
func subjRun(worker string) string           { return "dflow.w." + worker + ".run" }
func subjExit(worker string) string          { return "dflow.w." + worker + ".exit" }
func subjHB(run string) string               { return "dflow.r." + run + ".hb" }
func subjAlive(run string) string            { return "dflow.r." + run + ".alive" }
func subjAbort(run string) string            { return "dflow.r." + run + ".abort" }
func subjDrain(run string) string            { return "dflow.r." + run + ".drain" }
func subjAbortShare(run, inst string) string { return "dflow.r." + run + ".abort." + token(inst) }
func subjDone(run string) string             { return "dflow.r." + run + ".done" }
func subjSnap(run, inst string) string       { return "dflow.r." + run + ".snap." + token(inst) }
func subjGroup(run, stage string) string     { return "dflow.r." + run + ".grp." + token(stage) }
func subjQueue(run string, e, q int) string  { return fmt.Sprintf("dflow.q.%s.%d.%d", run, e, q) }

// subjRoom is where a queue's consumer side says it has fetched, which
// makes room, to the producers on other workers waiting for it
// (publish.go); apart from the queue's subject, which its stream stores.
func subjRoom(run string, e, q int) string { return fmt.Sprintf("dflow.r.%s.room.%d.%d", run, e, q) }

// streamEdge is an edge's stream: every remote queue of the edge is a
// subject of it (subjQueue) read by a consumer of its own (consumerQueue),
// and its ids are one namespace, so a duplicate is dropped whichever queue
// it is sent to.
func streamEdge(run string, e int) string { return fmt.Sprintf("DFQ_%s_%d", run, e) }
func consumerQueue(q int) string          { return fmt.Sprintf("q%d", q) }
func bucketEnds(run string) string        { return "DFE_" + run }
func bucketHolders(run string) string     { return "DFH_" + run }
func bucketPositions(run string) string   { return "DFP_" + run }
func keyEnd(e, q, producer int) string {
	return fmt.Sprintf("e%d.q%d.p%d", e, q, producer)
}

// keySettled says replica i of stage si, a followed one, has returned and
// everything it took is settled (tracked.ended); its value is the
// instance that ran it.
func keySettled(si, i int) string {
	return fmt.Sprintf("s%d.r%d.settled", si, i)
}

// keyGone says a consumer replica of a queue has returned.
func keyGone(e, q, consumer int) string {
	return fmt.Sprintf("e%d.q%d.c%d", e, q, consumer)
}

// token makes a name safe as one subject token.
func token(s string) string { return badToken.ReplaceAllString(s, "_") }

var badToken = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// validName is a worker name: letters, digits, - and _.
var validName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Intervals of the control plane.
const (
	helloEvery = 250 * time.Millisecond
	hbEvery    = control.Beat
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

// withDefaults fills what is unset.
func (t Timings) withDefaults() Timings {
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

// restartGuard is how long a share taking over a lost one's replicas
// waits before it may end a queue: the lost one's items are redelivered
// within AckWait of when it stopped keeping them.
func (t Timings) restartGuard() time.Duration { return t.AckWait + 2*time.Second }
