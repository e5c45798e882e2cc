package nodes

import (
	"context"
	"encoding"
	"errors"
	"fmt"
)

// Node is a stage's behaviour. The runtime calls Run once per replica, all
// replicas concurrently, each with its own Replica handle; a Node must
// therefore keep per-replica state inside Run (or index it by
// Replica.Index). Run returns nil when the replica is done: for a stage
// with inputs, normally after every input has reported io.EOF; for a
// source, when it has emitted everything. Any error fails the whole run.
//
// ctx is cancelled when the run fails or is aborted. For a stage without
// inputs (a source) it is also cancelled by the first Ctrl-C, the drain:
// the source should then stop producing and return; returning ctx.Err()
// is fine and counts as a clean end during a drain.
type Node interface {
	Run(ctx context.Context, r Replica) error
}

// NodeFunc adapts a function to Node.
type NodeFunc func(ctx context.Context, r Replica) error

// Run calls f.
func (f NodeFunc) Run(ctx context.Context, r Replica) error { return f(ctx, r) }

// Replica is a node replica's view of the runtime. A replica may use its
// ports from more than one goroutine, as long as each port is used by one
// goroutine at a time (receive on one, send on another) and none is used
// once Run has returned: Run waits for the goroutines it started. Metrics
// is safe from any goroutine.
type Replica interface {
	Stage() string  // the stage's name
	Index() int     // this replica, 0 <= Index < Replicas
	Replicas() int  // the stage's replica count (a rebalanced stage's counts the replicas a move may start)
	Device() string // "cpu" or "cuda:N"
	// In returns the input port of that name; Out the output port. Both
	// panic on a name the node kind does not declare.
	In(port string) Input
	Out(port string) Output
	// Group connects the stage's replicas for collectives.
	Group() Group
	// Metrics publishes the node's own figures (loss, tokens/s).
	Metrics() Metrics
	// Draining is closed when the run drains (first Ctrl-C): a node that
	// keeps state may checkpoint when it sees it, or at its end.
	Draining() <-chan struct{}
}

// Input receives the items of one input port. With fan-in it merges every
// edge ending on the port.
type Input interface {
	// Recv returns the next item. It returns io.EOF, exactly once and then
	// on every later call, when every producer replica wired to this
	// replica's queues has finished and the queues are empty. It returns
	// ctx.Err() when ctx is done.
	Recv(ctx context.Context) (any, error)
}

// Output sends items on one output port. With fan-out every edge leaving
// the port gets the same item (the reference, not a copy).
//
// Ownership: once Send is called the item belongs to the consumers; the
// sender must not modify it afterwards. Under fan-out several consumers
// share it and must treat it as read-only; a consumer that needs to mutate
// an item must copy it first. A payload that implements Sizer is counted
// against the edge's capacity_bytes.
type Output interface {
	// Send blocks while the queue is full (backpressure). It fails with an
	// error wrapping ErrNoConsumers once no consumer replica can ever
	// receive the item, and with ctx.Err() when ctx is done. One case
	// completes instead: during a drain, which cancels only the sources'
	// context, a source's Send already waiting for room finishes when the
	// consumers make room, and the item is delivered.
	Send(ctx context.Context, item any) error
}

// Sizer is implemented by payloads that know their size in bytes.
type Sizer interface {
	SizeBytes() int64
}

// ErrNoConsumers is returned by Send when every consumer of the queue has
// returned.
var ErrNoConsumers = errors.New("no consumer is left to receive")

// Group is a replica group: the replicas of one stage acting as one
// data-parallel worker. Members leave when their Run returns (or by
// calling Leave); collectives complete among the members still present,
// so uneven ends never hang. A member whose ctx ends while it waits in a
// collective gets ctx's error and is out of it (the collective completes
// without its vector), unless it had completed: then the member gets its
// result, as the others do. So every member present takes every step,
// and the last to leave (Finish) holds the last step, wherever the
// members run.
type Group interface {
	// Barrier waits until every member still in the group has reached
	// the same barrier.
	Barrier(ctx context.Context) error
	// AllReduce replaces x with the element-wise sum of x over the
	// members taking part in this step, wherever x's values live (a
	// device buffer is summed without a host slice), and returns how
	// many took part (divide by it for a mean). Every member must pass a
	// vector of the same Len; the sum is formed in arrival order.
	AllReduce(ctx context.Context, x Reducible) (int, error)
	// AllReduceSum is AllReduce of Floats(buf), for a host slice.
	AllReduceSum(ctx context.Context, buf []float32) (int, error)
	// Leave removes the replica from the group. It is idempotent.
	Leave()
	// Finish leaves the group, as Leave does, and reports whether this
	// replica was its last member: every other member had left before.
	// Exactly one member of a group gets true, wherever the members run
	// (in one process or on several hosts), so that member does what the
	// group does once per run: write the final checkpoint, run the final
	// evaluation. A member that had already left gets false; a member
	// lost with its host counts as having left.
	Finish(ctx context.Context) (last bool, err error)
	// Keep gives the group the replica's state (its weights, optimizer
	// state and step counter), for a kind whose state moves (Spec.Moves).
	// On a cluster, a member lost with its worker restarts on a live one
	// and takes the group's state over from a member still present: that
	// member marshals st at its next collective (a step boundary: the
	// last step's update applied, the next one's not), and the restarted
	// member's Keep returns once st holds it (unmarshalled). In one
	// process, a member that a rebalance starts during the run (a move)
	// takes the state over the same way, from a member present at its
	// step boundary. Call it once, before the first collective; any other
	// member only records st.
	//
	// A group lost whole (no member left to take the state from) restarts
	// from its last save where it saves (Saves): Keep then returns a
	// *Restore, and the replica loads that save (or, with nothing saved
	// yet, keeps the state it started with). Elsewhere it fails the run.
	Keep(ctx context.Context, st State) error
	// Saves says that the group saves its state every so many steps,
	// each save followed by Saved: the replicas' inputs are then settled
	// only once a save holds what they trained, so that a group lost
	// whole restarts from its last save and the inputs since come back.
	// A replica that has returned keeps its inputs unsettled until the
	// group's last member (Finish) has returned: that member writes the
	// final save before it does. Call it on every replica, before Keep;
	// in one process it does nothing.
	Saves(ctx context.Context) error
	// Saved says that the group's state as of the step just completed is
	// saved (a checkpoint written and closed), as step: a restart from it
	// is told the same step (Restore.Step). One member calls it, between
	// two steps.
	Saved(ctx context.Context, step int) error
}

// Restore is what Keep returns to the restart of a group lost whole that
// saves (Group.Saves): no member is left to take the state from, and
// every replica restores the group's last save, the one Saved named Step,
// and trains again on what came after it. Step < 0: nothing was saved
// yet, and the state each replica started with is the group's.
type Restore struct {
	Step int
}

func (r *Restore) Error() string {
	if r.Step < 0 {
		return "the group was lost whole before its first save: it starts again"
	}
	return fmt.Sprintf("the group was lost whole: it restores its save of step %d", r.Step)
}

// State is a replica's state as a group moves it (Group.Keep): the bytes
// one member's MarshalBinary writes, another's UnmarshalBinary reads.
type State interface {
	encoding.BinaryMarshaler
	encoding.BinaryUnmarshaler
}

// Reducible is a vector of float32 values that a replica group can sum
// without reading it: host memory (Floats) or a kernel backend's buffer,
// on a device or not.
type Reducible interface {
	// Len is the number of values.
	Len() int
	// NewSum returns a zeroed accumulator of Len() values, kept where
	// this vector's memory is.
	NewSum() Sum
	// Scale multiplies every value by f (a mean from a sum).
	Scale(f float32)
}

// Sum accumulates one all-reduce. The group calls Add once per member,
// one at a time, in arrival order; once the last has been added it calls
// Store once per member, possibly concurrently. A Sum serves one
// all-reduce only and is then dropped.
type Sum interface {
	// Add adds x, a member's vector of the same Len, into the sum; it
	// fails if it cannot reach x's memory (another kind of vector).
	Add(x Reducible) error
	// Store writes the sum into x.
	Store(x Reducible) error
}

// HostCopier is a Reducible whose values can be copied to the host and
// back: what a group whose members sit in other processes (a cluster's)
// needs of a vector that lives elsewhere, a kernel backend's buffer say.
// Each copy crosses once.
type HostCopier interface {
	Reducible
	// CopyToHost writes the values into dst (Len() of them).
	CopyToHost(dst []float32)
	// CopyFromHost sets the values from src (Len() of them).
	CopyFromHost(src []float32)
}

// Floats is a host vector as a Reducible: AllReduceSum's buffer.
type Floats []float32

// Len is the number of values.
func (f Floats) Len() int { return len(f) }

// NewSum returns a host accumulator.
func (f Floats) NewSum() Sum { return make(floatSum, len(f)) }

// Scale multiplies every value by s.
func (f Floats) Scale(s float32) {
	for i := range f {
		f[i] *= s
	}
}

type floatSum []float32

func (s floatSum) Add(x Reducible) error {
	f, ok := x.(Floats)
	if !ok {
		return fmt.Errorf("all-reduce of a host vector with a %T", x)
	}
	for i, v := range f {
		s[i] += v
	}
	return nil
}

func (s floatSum) Store(x Reducible) error {
	f, ok := x.(Floats)
	if !ok {
		return fmt.Errorf("all-reduce of a host vector with a %T", x)
	}
	copy(f, s)
	return nil
}

// Metrics publishes a node's figures. Set records a gauge (the latest
// value wins across replicas); Add adds to a counter summed over
// replicas.
type Metrics interface {
	Set(name string, v float64)
	Add(name string, delta float64)
}

// AllReduceMean replaces x with its mean over the replicas of r's stage
// still training (a data-parallel gradient step), and returns how many
// that is; with one replica it leaves x as it is and only marks the step
// (a Barrier: its group counts steps, for Saved). Pass Floats(buf) for a
// host slice.
func AllReduceMean(ctx context.Context, r Replica, x Reducible) (int, error) {
	if r.Replicas() == 1 {
		return 1, r.Group().Barrier(ctx)
	}
	n, err := r.Group().AllReduce(ctx, x)
	if err != nil {
		return 0, err
	}
	x.Scale(1 / float32(n))
	return n, nil
}
