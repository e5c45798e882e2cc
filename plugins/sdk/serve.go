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
	resp := &proto.DescribeResponse{}
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
	resp := &proto.CheckResponse{Ports: PortsToProto(sp.Ports(cfg))}
	if sp.Check != nil {
		for _, e := range sp.Check(cfg) {
			fe := &proto.FieldError{Message: e.Error()}
			var f *graph.FieldError
			if errors.As(e, &f) {
				fe.Field, fe.Message = f.Field, f.Err.Error()
			}
			resp.Errors = append(resp.Errors, fe)
		}
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
	node, err := sp.New(cfg)
	if err != nil {
		return stream.Send(&proto.Message{Msg: &proto.Message_Done{Done: &proto.Done{Error: err.Error()}}})
	}
	r := newRemoteReplica(stream, start, sp.Ports(cfg))
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go r.receive(cancel)
	runErr := node.Run(ctx, r)
	if err := r.failed(); err != nil && errors.Is(runErr, context.Canceled) {
		runErr = err // the node stopped because its input broke
	}
	done := &proto.Done{}
	if runErr != nil {
		done.Error = runErr.Error()
	}
	return r.send(&proto.Message{Msg: &proto.Message_Done{Done: done}})
}

// inputWindow is how many input items a plugin replica holds at most.
const inputWindow = 8

// remoteReplica is nodes.Replica inside a plugin process.
type remoteReplica struct {
	stream  proto.Node_RunServer
	start   *proto.Start
	sendMu  sync.Mutex // one message at a time on the stream
	itemMu  sync.Mutex // one item at a time: its chunks must not interleave with another's
	errMu   sync.Mutex
	err     error // why receiving stopped, when the stream did not simply end
	inputs  map[string]*remoteInput
	outputs map[string]*remoteOutput
	dead    chan struct{} // closed when the stream breaks
}

func newRemoteReplica(stream proto.Node_RunServer, start *proto.Start, ports []graph.PortSpec) *remoteReplica {
	r := &remoteReplica{stream: stream, start: start, inputs: map[string]*remoteInput{},
		outputs: map[string]*remoteOutput{}, dead: make(chan struct{})}
	for _, p := range ports {
		if p.Dir == graph.In {
			r.inputs[p.Name] = &remoteInput{r: r, ch: make(chan any, inputWindow)}
		} else {
			r.outputs[p.Name] = &remoteOutput{r: r, port: p.Name}
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
		r.send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: inputWindow}}})
	}
	for {
		m, err := r.stream.Recv()
		if err != nil {
			cancel()
			return
		}
		switch v := m.Msg.(type) {
		case *proto.Message_Item:
			b, whole := items.Add(v.Item)
			if !whole {
				continue
			}
			item, err := Decode(v.Item.Type, b)
			in := r.inputs[v.Item.Port]
			if err == nil && in == nil {
				err = fmt.Errorf("sdk: an item for input port %q, which the node does not have", v.Item.Port)
			}
			if err != nil {
				r.fail(err)
				cancel()
				return
			}
			in.ch <- item
		case *proto.Message_Eof:
			if in := r.inputs[v.Eof.Port]; in != nil {
				close(in.ch)
			}
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
	r  *remoteReplica
	ch chan any
}

func (in *remoteInput) Recv(ctx context.Context) (any, error) {
	select {
	case item, ok := <-in.ch:
		if !ok {
			return nil, io.EOF
		}
		// The item is taken: grant credit for one more.
		if err := in.r.send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: 1}}}); err != nil {
			return nil, err
		}
		return item, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type remoteOutput struct {
	r    *remoteReplica
	port string
}

// Send streams the item to dflow in chunks; gRPC's flow control blocks it
// while dflow's side of the edge is full.
func (o *remoteOutput) Send(ctx context.Context, item any) error {
	o.r.itemMu.Lock()
	defer o.r.itemMu.Unlock()
	return SendItem(func(m *proto.Message) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return o.r.send(m)
	}, o.port, item)
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
