package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/internal/wire"
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

// Options tune how a plugin serves its node kinds (ServeWith). The zero
// value is what Serve uses.
type Options struct {
	// Concurrent says that a node of this plugin may compute in
	// goroutines of its own while one of its calls into the SDK (a Recv
	// or a Send) waits. The plugin then does not tell dflow when its node
	// waits (Waiting), and dflow's deadlock detector treats its stages as
	// always able to move: a deadlock through them hangs rather than
	// being named. Without it, a node blocked in exactly one SDK call is
	// taken to be doing nothing else.
	Concurrent bool
	// WaitingAfter is how long a call must have been blocked before the
	// plugin says Waiting (0: 20 ms): a node that blocks briefly on every
	// item (the usual case, items arriving one at a time) then adds no
	// message to the stream; the deadlock detector sees a stuck plugin
	// that much later.
	WaitingAfter time.Duration
	// InputBytes bounds, per input port, what the plugin holds and has
	// granted credit for, counted at the last item's size (0: 64 MiB);
	// an item larger than that passes alone.
	InputBytes int64
}

const (
	defaultWaitingAfter       = 20 * time.Millisecond
	defaultInputBytes   int64 = 64 << 20
)

func (o Options) withDefaults() Options {
	if o.WaitingAfter <= 0 {
		o.WaitingAfter = defaultWaitingAfter
	}
	if o.InputBytes <= 0 {
		o.InputBytes = defaultInputBytes
	}
	return o
}

// Serve runs the plugin process: it serves the given node kinds to dflow
// until dflow closes it. Call it from main.
func Serve(specs ...nodes.Spec) { ServeWith(Options{}, specs...) }

// ServeWith is Serve with options.
func ServeWith(o Options, specs ...nodes.Spec) {
	Stderr = os.Stderr // before go-plugin swaps it
	watchParent()
	srv := newServer(o, specs...)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: wire.Handshake,
		Plugins:         wire.PluginMap(srv),
		// Version 2 where dflow offers it (group kinds), else 1.
		VersionedPlugins: wire.Versions(srv),
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, wire.ServerOptions()...)...)
		},
		// go-plugin's own chatter stays quiet; the plugin's stderr is its own.
		Logger: hclog.New(&hclog.LoggerOptions{Name: "dflow-plugin", Level: hclog.Error, Output: os.Stderr}),
	})
}

// server implements the protocol's plugin side over node specs: Describe
// and Check here, Run (one replica) in session.go.
type server struct {
	proto.UnimplementedNodeServer
	opts  Options
	specs map[string]nodes.Spec
	order []string
	// onSession, for tests, sees each replica's session before it runs.
	onSession func(*session)
}

// newServer serves specs (their Kind.Name is the KIND of PLUGIN/KIND).
func newServer(o Options, specs ...nodes.Spec) *server {
	s := &server{opts: o.withDefaults(), specs: map[string]nodes.Spec{}}
	for _, sp := range specs {
		s.specs[sp.Name] = sp
		s.order = append(s.order, sp.Name)
	}
	return s
}

// Describe implements proto.NodeServer.
func (s *server) Describe(context.Context, *proto.DescribeRequest) (*proto.DescribeResponse, error) {
	resp := &proto.DescribeResponse{Batches: true, PortCredit: true, OutputCredit: true, SharedMemory: wire.SharedMemoryEnabled(), Waiting: !s.opts.Concurrent, Times: timesEnabled()}
	for _, name := range s.order {
		sp := s.specs[name]
		// A kind with Sync steps together: a group kind (protocol
		// version 2), whatever its config says; with Moves as well, its
		// group saves and restores its state (Kind.restores).
		resp.Kinds = append(resp.Kinds, &proto.Kind{Name: name, Doc: sp.Doc, Config: wire.FieldsToProto(sp.Config),
			Group: sp.Sync != nil, Restores: sp.Sync != nil && sp.Moves})
	}
	return resp, nil
}

// Check implements proto.NodeServer.
func (s *server) Check(_ context.Context, req *proto.CheckRequest) (*proto.CheckResponse, error) {
	sp, ok := s.specs[req.Kind]
	if !ok {
		return nil, fmt.Errorf("no node kind %q", req.Kind)
	}
	cfg, err := wire.ConfigFromJSON(req.ConfigJson, sp.Config)
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
	resp := &proto.CheckResponse{Ports: wire.PortsToProto(ports)}
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

// Run implements proto.NodeServer: one replica (session.go).
func (s *server) Run(stream proto.Node_RunServer) error {
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
	cfg, err := wire.ConfigFromJSON(start.ConfigJson, sp.Config)
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
	ss := newSession(stream, start, ports, s.opts)
	if sp.Sync != nil && sp.Moves {
		ss.restores = true
		for _, in := range ss.inputs {
			in.asked, in.w.Items = true, 1
		}
	}
	if s.onSession != nil {
		s.onSession(ss)
	}
	return ss.run(node)
}
