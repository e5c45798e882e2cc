package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/proto"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// Stderr is the plugin process's own standard error. go-plugin redirects
// os.Stderr through the RPC connection once serving starts, and whatever
// is in flight there is lost if the process dies abruptly; writes to
// Stderr reach dflow directly, so a plugin's last words survive a crash.
// dflow forwards both, prefixed with the stage and replica.
var Stderr io.Writer = os.Stderr

// Serve runs the plugin process: it serves the given node kinds to dflow
// until dflow closes it. Call it from main.
func Serve(specs ...nodes.Spec) {
	Stderr = os.Stderr // before go-plugin swaps it
	watchParent()
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         PluginMap(NewServer(specs...)),
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, ServerOptions()...)...)
		},
		// go-plugin's own chatter stays quiet; the plugin's stderr is its own.
		Logger: hclog.New(&hclog.LoggerOptions{Name: "dflow-plugin", Level: hclog.Error, Output: os.Stderr}),
	})
}

// Server implements the protocol's plugin side over node specs.
type Server struct {
	proto.UnimplementedNodeServer
	specs map[string]nodes.Spec
	order []string
}

// NewServer serves specs (their Kind.Name is the KIND of PLUGIN/KIND).
func NewServer(specs ...nodes.Spec) *Server {
	s := &Server{specs: map[string]nodes.Spec{}}
	for _, sp := range specs {
		s.specs[sp.Name] = sp
		s.order = append(s.order, sp.Name)
	}
	return s
}

// Describe implements proto.NodeServer.
func (s *Server) Describe(context.Context, *proto.DescribeRequest) (*proto.DescribeResponse, error) {
	resp := &proto.DescribeResponse{Batches: true, PortCredit: true, OutputCredit: true}
	for _, name := range s.order {
		sp := s.specs[name]
		resp.Kinds = append(resp.Kinds, &proto.Kind{Name: name, Doc: sp.Doc, Config: FieldsToProto(sp.Config)})
	}
	return resp, nil
}

// Check implements proto.NodeServer.
func (s *Server) Check(_ context.Context, req *proto.CheckRequest) (*proto.CheckResponse, error) {
	sp, ok := s.specs[req.Kind]
	if !ok {
		return nil, fmt.Errorf("no node kind %q", req.Kind)
	}
	cfg, err := ConfigFromJSON(req.ConfigJson, sp.Config)
	if err != nil {
		return &proto.CheckResponse{Errors: []*proto.FieldError{{Message: err.Error()}}}, nil
	}
	var ports []graph.PortSpec
	var errs []error
	if err := recovered(func() {
		ports = sp.Ports(cfg)
		if sp.Check != nil {
			errs = sp.Check(cfg)
		}
	}); err != nil {
		return &proto.CheckResponse{Errors: []*proto.FieldError{{Message: "checking the config: " + err.Error()}}}, nil
	}
	resp := &proto.CheckResponse{Ports: PortsToProto(ports)}
	for _, e := range errs {
		fe := &proto.FieldError{Message: e.Error()}
		var f *graph.FieldError
		if errors.As(e, &f) {
			fe.Field, fe.Message = f.Field, f.Err.Error()
		}
		resp.Errors = append(resp.Errors, fe)
	}
	return resp, nil
}

// Run implements proto.NodeServer: one replica.
func (s *Server) Run(stream proto.Node_RunServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return errors.New("the first message of a replica must be Start")
	}
	sp, ok := s.specs[start.Kind]
	if !ok {
		return fmt.Errorf("no node kind %q", start.Kind)
	}
	cfg, err := ConfigFromJSON(start.ConfigJson, sp.Config)
	if err != nil {
		return err
	}
	var node nodes.Node
	var ports []graph.PortSpec
	if perr := recovered(func() {
		if node, err = sp.New(cfg); err == nil {
			ports = sp.Ports(cfg)
		}
	}); perr != nil {
		err = perr
	}
	if err != nil {
		return stream.Send(&proto.Message{Msg: &proto.Message_Done{Done: &proto.Done{Error: err.Error()}}})
	}
	r := newRemoteReplica(stream, start, ports)
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go r.receive(cancel)
	go r.sendItems()
	// A panic in the node ends this replica with the panic's message, as
	// in process, not the plugin process (and the stream with it).
	var runErr error
	if perr := recovered(func() { runErr = node.Run(ctx, r) }); perr != nil {
		runErr = perr
	}
	close(r.outq) // the node is done with its ports: send what it left
	<-r.sent
	if err := r.sendFailed(); err != nil && runErr == nil {
		runErr = err
	}
	if err := r.failed(); err != nil && errors.Is(runErr, context.Canceled) {
		runErr = err // the node stopped because its input broke
	}
	done := &proto.Done{}
	if runErr != nil {
		done.Error = runErr.Error()
	}
	return r.send(&proto.Message{Msg: &proto.Message_Done{Done: done}})
}

// Input credit, per input port (DescribeResponse.port_credit, so that dflow
// feeds each input as it comes and a node may read them in any order): a
// port's Window holds at most inputWindow items within inputBytes, and
// starts with firstCredit, before it has seen an item's size.
// outputWindow is how many items its node may have sent that are not yet
// on the stream. With output credit (Start.output_credit) a node's Send on
// a port also waits for dflow's credit on that port, so that the items on
// the stream are all items dflow has room for.
const (
	inputWindow  = 32
	firstCredit  = 8
	outputWindow = 64
)

var inputBytes int64 = 64 << 20 // a variable for tests

// outItem is an item a node sent on a port.
type outItem struct {
	port string
	item any
}

// grant sends the credit the node's Recvs on this port owe, as much of it
// as the port's byte budget allows, in one message.
func (in *remoteInput) grant() error {
	n := in.w.Grant()
	if n == 0 {
		return nil // granted as the node takes what is held
	}
	return in.r.send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: n, Port: in.port}}})
}

// sendItems puts the items the node sends on the stream, in order, from
// one goroutine (so one item's chunks never interleave with another's):
// with each it takes the others already waiting, to go as one Batch when
// dflow takes them (Start.batches). It also grants the input credit the
// node's Recvs owe, all that is owed on a port in one message: with
// credit coming back a few items at a time, dflow batches its items too.
func (r *remoteReplica) sendItems() {
	defer close(r.sent)
	b := Batcher{Send: r.send, Batches: r.start.Batches}
	grant := func() error {
		for _, in := range r.inputs {
			if err := in.grant(); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		var err error
		select {
		case <-r.kick:
			err = grant()
		case it, ok := <-r.outq:
			if !ok {
				return
			}
			err = b.Add(it.port, it.item)
		more:
			for n := 1; err == nil && b.Batches && n < maxBatchItems; n++ {
				select {
				case next, ok := <-r.outq:
					if !ok {
						break more
					}
					err = b.Add(next.port, next.item)
				default:
					break more
				}
			}
			if err == nil {
				err = b.Flush()
			}
			if err == nil {
				err = grant()
			}
		}
		if err != nil {
			r.errMu.Lock()
			r.sendErr = err
			r.errMu.Unlock()
			for range r.outq { // let the node's Sends through; they fail from now on
			}
			return
		}
	}
}

func (r *remoteReplica) sendFailed() error {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return r.sendErr
}

// remoteReplica is nodes.Replica inside a plugin process.
type remoteReplica struct {
	stream  proto.Node_RunServer
	start   *proto.Start
	sendMu  sync.Mutex    // one message at a time on the stream
	outq    chan outItem  // items the node sent, for sendItems
	sent    chan struct{} // closed when sendItems is done
	kick    chan struct{} // wakes sendItems to grant what is owed
	errMu   sync.Mutex
	err     error // why receiving stopped, when the stream did not simply end
	sendErr error // why sending stopped
	inputs  map[string]*remoteInput
	outputs map[string]*remoteOutput
	dead    chan struct{} // closed when the stream breaks
}

func newRemoteReplica(stream proto.Node_RunServer, start *proto.Start, ports []graph.PortSpec) *remoteReplica {
	r := &remoteReplica{stream: stream, start: start, inputs: map[string]*remoteInput{},
		outputs: map[string]*remoteOutput{}, dead: make(chan struct{}),
		outq: make(chan outItem, outputWindow), sent: make(chan struct{}), kick: make(chan struct{}, 1)}
	for _, p := range ports {
		if p.Dir == graph.In {
			r.inputs[p.Name] = &remoteInput{r: r, port: p.Name, ch: make(chan inItem, inputWindow),
				w: Window{Items: inputWindow, Bytes: inputBytes}}
		} else {
			r.outputs[p.Name] = &remoteOutput{r: r, port: p.Name, typ: p.Type, credit: NewCredit(), held: start.OutputCredit}
		}
	}
	return r
}

func (r *remoteReplica) send(m *proto.Message) error {
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	return r.stream.Send(m)
}

// receive reads dflow's messages: items (reassembled and decoded) to the
// inputs, end-of-input, until the stream ends.
func (r *remoteReplica) receive(cancel context.CancelFunc) {
	defer close(r.dead)
	var items Assembler
	// Grant the first window of input credit.
	if len(r.inputs) > 0 {
		for name, in := range r.inputs {
			n := in.w.Open(firstCredit)
			r.send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: n, Port: name}}})
		}
	}
	for {
		m, err := r.stream.Recv()
		if err != nil {
			cancel()
			return
		}
		var whole []*proto.Item // items complete with this message
		switch v := m.Msg.(type) {
		case *proto.Message_Item:
			b, done := items.Add(v.Item)
			if !done {
				continue
			}
			v.Item.Payload = b
			whole = []*proto.Item{v.Item}
		case *proto.Message_Batch:
			whole = v.Batch.Items
		case *proto.Message_Eof:
			if in := r.inputs[v.Eof.Port]; in != nil {
				close(in.ch)
			}
		case *proto.Message_Credit:
			out := r.outputs[v.Credit.Port]
			if out == nil || !out.held {
				r.fail(fmt.Errorf("sdk: credit from dflow on %q, which is not an output port held to credit", v.Credit.Port))
				cancel()
				return
			}
			out.credit.Grant(v.Credit.N)
		}
		for _, it := range whole {
			item, err := Decode(it.Type, it.Payload)
			in := r.inputs[it.Port]
			if err == nil && in == nil {
				err = fmt.Errorf("sdk: an item for input port %q, which the node does not have", it.Port)
			}
			if err != nil {
				r.fail(err)
				cancel()
				return
			}
			size := int64(len(it.Payload))
			if !in.w.Arrived(size) {
				r.fail(fmt.Errorf("sdk: dflow sent more items on %q than the plugin granted it credit for", it.Port))
				cancel()
				return
			}
			in.ch <- inItem{item, size}
		}
	}
}

func (r *remoteReplica) fail(err error) {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

func (r *remoteReplica) failed() error {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	return r.err
}

func (r *remoteReplica) Stage() string             { return r.start.Stage }
func (r *remoteReplica) Index() int                { return int(r.start.Replica) }
func (r *remoteReplica) Replicas() int             { return int(r.start.Replicas) }
func (r *remoteReplica) Device() string            { return r.start.Device }
func (r *remoteReplica) Group() nodes.Group        { return noGroup{} }
func (r *remoteReplica) Metrics() nodes.Metrics    { return remoteMetrics{r} }
func (r *remoteReplica) Draining() <-chan struct{} { return nil }

func (r *remoteReplica) In(port string) nodes.Input {
	if in, ok := r.inputs[port]; ok {
		return in
	}
	panic(fmt.Sprintf("sdk: no input port %q", port))
}

func (r *remoteReplica) Out(port string) nodes.Output {
	if out, ok := r.outputs[port]; ok {
		return out
	}
	panic(fmt.Sprintf("sdk: no output port %q", port))
}

type remoteInput struct {
	r    *remoteReplica
	port string
	ch   chan inItem
	w    Window
}

// inItem is an item received for the node, with its payload's size.
type inItem struct {
	item any
	size int64
}

func (in *remoteInput) Recv(ctx context.Context) (any, error) {
	select {
	case it, ok := <-in.ch:
		if !ok {
			return nil, io.EOF
		}
		// The item is taken: credit for one more, which the sender grants
		// (several in one message when items come fast).
		in.w.Taken(it.size)
		select {
		case in.r.kick <- struct{}{}:
		default:
		}
		return it.item, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type remoteOutput struct {
	r      *remoteReplica
	port   string
	typ    string // the port's type: its items must be of the Go type it means
	held   bool   // to dflow's credit on this port (Start.output_credit)
	credit *Credit
}

// Send hands the item to the replica's sender (sendItems), which streams
// it to dflow. Held to dflow's credit, it first waits for credit on its
// port, so that a full edge holds back this port's Sends and no other's.
// It also waits while outputWindow items are queued (without credit, the
// only wait: gRPC's flow control holds the sender while dflow's side of
// any edge is full, and so every Send). A failure of the stream shows at
// the next Send, and in Done.
func (o *remoteOutput) Send(ctx context.Context, item any) error {
	if err := o.r.sendFailed(); err != nil {
		return err
	}
	if err := CheckPortItem(o.typ, item); err != nil {
		return fmt.Errorf("sdk: output %q: %w", o.port, err)
	}
	if o.held {
		if err := o.credit.Take(ctx, o.r.dead); err != nil {
			return err
		}
	}
	select {
	case o.r.outq <- outItem{o.port, item}:
		return nil
	case <-o.r.sent:
		return o.r.sendFailed()
	case <-ctx.Done():
		return ctx.Err()
	}
}

type remoteMetrics struct{ r *remoteReplica }

func (m remoteMetrics) Set(name string, v float64) {
	m.r.send(&proto.Message{Msg: &proto.Message_Metric{Metric: &proto.Metric{Name: name, Value: v}}})
}

func (m remoteMetrics) Add(name string, d float64) {
	m.r.send(&proto.Message{Msg: &proto.Message_Metric{Metric: &proto.Metric{Name: name, Value: d, Counter: true}}})
}

// noGroup: collectives do not cross plugin processes in protocol v1.
type noGroup struct{}

var errNoGroup = errors.New("sdk: replica groups are not available to plugin nodes (protocol v1)")

func (noGroup) Barrier(context.Context) error                        { return errNoGroup }
func (noGroup) AllReduceSum(context.Context, []float32) (int, error) { return 0, errNoGroup }
func (noGroup) Leave()                                               {}
