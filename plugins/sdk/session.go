package sdk

import (
	"context"
	"errors"
	"fmt"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// session is one replica inside the plugin process: the Run stream that
// began with a Start, the node it runs, its ports. Its parts, each in a
// file of its own: sender (send.go) puts what the node sends on the
// stream, receiver (receive.go) takes dflow's messages off it, waits
// (waiting.go) tells dflow when the node is blocked, times (times.go)
// measures where the node's time goes, shm (pools.go) is the shared
// memory dflow offered.
//
// Its goroutines, who starts them and what ends them:
//
//   - the handler's (gRPC's goroutine for the stream, in run) runs the
//     node; it ends the session: once the node has returned and the
//     sender has ended, it sends Done and returns, and gRPC then ends the
//     stream;
//   - the sender (sendItems), started by run before the node: it ends
//     when the node has returned (run closes outq) or the stream fails;
//     run waits for it (sent) before Done;
//   - the receiver (receive), started by run before the node: it ends
//     when the stream does (dflow closes or cancels it after Done, gRPC
//     ends it when the handler returns, or it breaks); nothing waits for
//     it, so what it uses outlives the handler: the pools are unmapped by
//     whichever of the two is done with them last (shm.let);
//   - a timer (waits.sayWaiting) that wakes the sender once a call has
//     been blocked for Options.WaitingAfter; it only signals a buffered
//     channel, so it may fire after the session has ended.
type session struct {
	stream  proto.Node_RunServer
	start   *proto.Start
	opts    Options
	inputs  map[string]*input
	outputs map[string]*output
	times   times
	group   *member // the replica's group (Start.group), nil when it has none
	// restores: the kind's group saves and restores its state
	// (Kind.restores), so its member's Keep says a restart's restore
	restores bool

	sender
	receiver
	waits
	shm
}

// Input credit, per input port (DescribeResponse.port_credit, so that dflow
// feeds each input as it comes and a node may read them in any order): a
// port's Window holds at most inputWindow items within Options.InputBytes,
// and starts with firstCredit, before it has seen an item's size.
// outputWindow is how many items its node may have sent that are not yet
// on the stream. With output credit (Start.output_credit) a node's Send on
// a port also waits for dflow's credit on that port, so that the items on
// the stream are all items dflow has room for.
//
// A group member (Start.group) holds at most groupWindow items per port:
// the members share their input edges, and a member that held credit for
// many would take items the others are waiting for, its steps full while
// theirs are empty.
const (
	inputWindow  = 32
	firstCredit  = 8
	outputWindow = 64
	groupWindow  = 2
)

func newSession(stream proto.Node_RunServer, start *proto.Start, ports []graph.PortSpec, o Options) *session {
	s := &session{stream: stream, start: start, opts: o, inputs: map[string]*input{}, outputs: map[string]*output{}}
	s.sender.init()
	s.receiver.init()
	s.waits.init(start.Waiting && !o.Concurrent, o.WaitingAfter)
	window := inputWindow
	if start.Group {
		window = groupWindow
	}
	for _, p := range ports {
		if p.Dir == graph.In {
			s.inputs[p.Name] = &input{s: s, port: p.Name, ch: make(chan inItem, window),
				w: wire.Window{Items: int32(window), Bytes: o.InputBytes}}
		} else {
			s.outputs[p.Name] = &output{s: s, port: p.Name, typ: p.Type, credit: wire.NewCredit(), held: start.OutputCredit}
		}
	}
	s.times.init(start.Times, len(s.inputs) == 0)
	if start.Group {
		s.group = newMember(s)
	}
	return s
}

// run runs the replica to its end: Attached (with pools), the first
// input credit, then the node with the sender and the receiver, and Done.
func (s *session) run(node nodes.Node) error {
	if s.start.Pools != nil {
		// Attached goes first, before any credit: dflow sends items by
		// reference only once it knows the pools are mapped.
		att := s.attach(s.start.Pools)
		defer s.let() // the handler's use of the pools: see shm
		if err := s.send(&proto.Message{Msg: &proto.Message_Attached{Attached: att}}); err != nil {
			return err
		}
	}
	// The first window of input credit, before the node can wait for an
	// item (and the plugin say Waiting): on the stream ahead of it.
	for name, in := range s.inputs {
		if in.asked {
			continue // credit as the node asks (input.asked)
		}
		n := in.w.Open(firstCredit)
		if err := s.send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: n, Port: name}}}); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(s.stream.Context())
	defer cancel()
	s.use() // the receiver's use of the pools, let go as it ends
	go s.receive(cancel)
	go s.sendItems()
	// A panic in the node ends this replica with the panic's message, as
	// in process, not the plugin process (and the stream with it).
	var runErr error
	if perr := recovered(func() { runErr = node.Run(ctx, s) }); perr != nil {
		runErr = perr
	}
	if len(s.inputs) > 0 {
		s.times.next() // the item in hand, if the node left before the end of its input
	}
	close(s.outq) // the node is done with its ports: send what it left
	<-s.sent
	if err := s.sayTimes(true); err != nil && runErr == nil {
		runErr = err
	}
	if err := s.sendFailed(); err != nil && runErr == nil {
		runErr = err
	}
	if err := s.failed(); err != nil && errors.Is(runErr, context.Canceled) {
		runErr = err // the node stopped because its input broke
	}
	done := &proto.Done{}
	if runErr != nil {
		done.Error = runErr.Error()
	}
	return s.send(&proto.Message{Msg: &proto.Message_Done{Done: done}})
}

// The session is the node's nodes.Replica.

func (s *session) Stage() string             { return s.start.Stage }
func (s *session) Index() int                { return int(s.start.Replica) }
func (s *session) Replicas() int             { return int(s.start.Replicas) }
func (s *session) Device() string            { return s.start.Device }
func (s *session) Metrics() nodes.Metrics    { return metrics{s} }
func (s *session) Draining() <-chan struct{} { return nil }

// Group is the replica's group when its kind is a group kind (a Spec
// with Sync, served at protocol version 2), else a group whose every
// collective fails.
func (s *session) Group() nodes.Group {
	if s.group != nil {
		return s.group
	}
	return noGroup{}
}

func (s *session) In(port string) nodes.Input {
	if in, ok := s.inputs[port]; ok {
		return in
	}
	panic(fmt.Sprintf("sdk: no input port %q", port))
}

func (s *session) Out(port string) nodes.Output {
	if out, ok := s.outputs[port]; ok {
		return out
	}
	panic(fmt.Sprintf("sdk: no output port %q", port))
}

type metrics struct{ s *session }

func (m metrics) Set(name string, v float64) {
	m.s.send(&proto.Message{Msg: &proto.Message_Metric{Metric: &proto.Metric{Name: name, Value: v}}})
}

func (m metrics) Add(name string, d float64) {
	m.s.send(&proto.Message{Msg: &proto.Message_Metric{Metric: &proto.Metric{Name: name, Value: d, Counter: true}}})
}

// noGroup: the replica of a kind that is not a group kind (no Spec.Sync),
// or of a dflow that speaks protocol version 1.
type noGroup struct{}

var errNoGroup = errors.New("sdk: this replica has no group: its kind is not a group kind (nodes.Spec.Sync), or dflow speaks protocol version 1")

func (noGroup) Barrier(context.Context) error                           { return errNoGroup }
func (noGroup) AllReduceSum(context.Context, []float32) (int, error)    { return 0, errNoGroup }
func (noGroup) AllReduce(context.Context, nodes.Reducible) (int, error) { return 0, errNoGroup }
func (noGroup) Leave()                                                  {}
func (noGroup) Finish(context.Context) (bool, error)                    { return false, errNoGroup }
func (noGroup) Keep(context.Context, nodes.State) error                 { return errNoGroup }
func (noGroup) Saves(context.Context) error                             { return errNoGroup }
func (noGroup) Saved(context.Context, int) error                        { return errNoGroup }
