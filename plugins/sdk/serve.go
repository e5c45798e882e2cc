package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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

// Concurrent, set before Serve, says that a node of this plugin may
// compute in goroutines of its own while one of its calls into the SDK
// (a Recv or a Send) waits. The plugin then does not tell dflow when its
// node waits (Waiting), and dflow's deadlock detector treats its stages as
// always able to move: a deadlock through them hangs rather than being
// named. Without it, a node blocked in exactly one SDK call is taken to be
// doing nothing else.
var Concurrent bool

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
	resp := &proto.DescribeResponse{Batches: true, PortCredit: true, OutputCredit: true, SharedMemory: SharedMemoryEnabled(), Waiting: !Concurrent}
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
	if start.Pools != nil {
		// Attached goes first, before any credit: dflow sends items by
		// reference only once it knows the pools are mapped.
		att := &proto.Attached{}
		if !SharedMemoryEnabled() {
			att.Error = "shared memory is off in this plugin (DFLOW_PLUGIN_SHM=off)"
		} else if ps, err := OpenPools(start.Pools); err != nil {
			att.Error = err.Error()
		} else {
			r.pools, r.threshold = ps, max(start.Pools.Threshold, 1)
			defer ps.Close() // after the node and the sender are done with them
		}
		if err := r.send(&proto.Message{Msg: &proto.Message_Attached{Attached: att}}); err != nil {
			return err
		}
	}
	// The first window of input credit, before the node can wait for an
	// item (and the plugin say Waiting): on the stream ahead of it.
	for name, in := range r.inputs {
		n := in.w.Open(firstCredit)
		if err := r.send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: n, Port: name}}}); err != nil {
			return err
		}
	}
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

// outItem is an item a node sent on a port, encoded, or by reference
// (ref), with what to do once it is on the stream (after: drop the hold on
// the received region it lies in).
type outItem struct {
	port  string
	enc   encoded
	ref   *proto.Ref
	after func()
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
	var after []func()
	add := func(it outItem) error {
		if it.after != nil {
			after = append(after, it.after)
		}
		if it.ref != nil {
			return b.AddRef(it.port, it.enc.typ, it.ref)
		}
		return b.addEncoded(it.port, it.enc)
	}
	flush := func() error {
		err := b.Flush()
		for _, f := range after { // the items are on the stream: their regions may go
			f()
		}
		after = after[:0]
		return err
	}
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
		case <-r.look:
		case it, ok := <-r.outq:
			if !ok {
				return
			}
			err = add(it)
		more:
			for n := 1; err == nil && b.Batches && n < maxBatchItems; n++ {
				select {
				case next, ok := <-r.outq:
					if !ok {
						break more
					}
					err = add(next)
				default:
					break more
				}
			}
			if ferr := flush(); err == nil {
				err = ferr
			}
			if err == nil {
				err = grant()
			}
		}
		if err == nil {
			err = r.sayWaiting()
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
	look    chan struct{} // wakes sendItems to look at blocked calls (Waiting)
	errMu   sync.Mutex
	err     error // why receiving stopped, when the stream did not simply end
	sendErr error // why sending stopped
	inputs  map[string]*remoteInput
	outputs map[string]*remoteOutput
	dead    chan struct{} // closed when the stream breaks
	// pools: the shared memory dflow offered and this process mapped
	// (Start.pools), nil without; items of threshold bytes or more go by
	// reference.
	pools     *Pools
	threshold int64

	// Waiting (Start.waiting; see waiter): watch says dflow takes it.
	watch    bool
	recvd    atomic.Uint64 // dflow's messages received and applied, Start included
	nblocked atomic.Int32  // len(waiters)
	wmu      sync.Mutex
	waiters  []*waiter // the node's calls in progress that block
	// the last Waiting sent (sendItems' own)
	saidWaiting bool
	saidSeen    uint64
	waitTimer   atomic.Bool // a look again at a blocked call is scheduled
}

func newRemoteReplica(stream proto.Node_RunServer, start *proto.Start, ports []graph.PortSpec) *remoteReplica {
	r := &remoteReplica{stream: stream, start: start, inputs: map[string]*remoteInput{},
		outputs: map[string]*remoteOutput{}, dead: make(chan struct{}),
		outq: make(chan outItem, outputWindow), sent: make(chan struct{}), kick: make(chan struct{}, 1), look: make(chan struct{}, 1),
		watch: start.Waiting && !Concurrent}
	r.recvd.Store(1) // Start
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
				r.received1()
				continue
			}
			v.Item.Payload = b
			whole = []*proto.Item{v.Item}
		case *proto.Message_Batch:
			whole = v.Batch.Items
		case *proto.Message_Eof:
			if in := r.inputs[v.Eof.Port]; in != nil {
				in.ended.Store(true)
				close(in.ch)
			}
		case *proto.Message_Release:
			for _, ref := range v.Release.Refs {
				var err error
				if r.pools == nil || ref.Pool != 1 {
					err = fmt.Errorf("sdk: dflow released pool %d's region at %d, which the plugin did not send", ref.Pool, ref.Offset)
				} else {
					err = r.pools.Out.Free(ref.Offset)
				}
				if err != nil {
					r.fail(err)
					cancel()
					return
				}
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
			var held *Held
			var item any
			var err error
			size := int64(len(it.Payload))
			if it.Ref != nil {
				held, err = r.received(it.Ref)
				if err == nil {
					size = it.Ref.Length
					// A view of dflow's pool, read-only: valid until the
					// node's next Recv on the port (see Recv).
					item, err = Decode(it.Type, r.pools.In.Bytes(it.Ref.Offset, it.Ref.Length))
				}
			} else {
				item, err = Decode(it.Type, it.Payload)
			}
			in := r.inputs[it.Port]
			if err == nil && in == nil {
				err = fmt.Errorf("sdk: an item for input port %q, which the node does not have", it.Port)
			}
			if err != nil {
				r.fail(err)
				cancel()
				return
			}
			if !in.w.Arrived(size) {
				r.fail(fmt.Errorf("sdk: dflow sent more items on %q than the plugin granted it credit for", it.Port))
				cancel()
				return
			}
			in.ch <- inItem{item, size, held}
		}
		r.received1()
	}
}

// Waiting (Start.waiting): the plugin tells dflow when its node is
// blocked in exactly one SDK call with nothing it can do by itself, so
// that dflow's deadlock detector can judge the stage (docs/runtime.md,
// "Deadlock"). A call that blocks registers a waiter with the condition
// that keeps it blocked; sendItems, which puts everything the node sends
// on the stream in order, says Waiting{seen} once that is all on the
// stream, seen being how many of dflow's messages had been received when
// it found the call still blocked. The receiver counts a message only
// after applying it (an item in its port, an end of input, a grant of
// credit), and the count is read before the condition: so if the
// condition held, nothing counted in seen can release the call, and
// whatever can has not been counted, which dflow sees as its own count
// differing from seen. Only blocking calls register: an item that finds
// its item or its credit waiting costs nothing more.
type waiter struct {
	blocked func() bool // the call is still blocked
	since   time.Time   // when it began to block
}

// WaitingAfter is how long a call must have been blocked before the
// plugin says Waiting: a node that blocks briefly on every item (the
// usual case, items arriving one at a time) then adds no message to the
// stream; the deadlock detector sees a stuck plugin that much later.
var WaitingAfter = 20 * time.Millisecond

// received1 counts one message from dflow applied, and has sendItems
// look again at a blocked call (its seen is now old).
func (r *remoteReplica) received1() {
	r.recvd.Add(1)
	if r.watch && r.nblocked.Load() > 0 {
		r.lookAgain()
	}
}

func (r *remoteReplica) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// lookAgain has sendItems look at the blocked calls again (for Waiting)
// without granting credit: a grant per look would split what is owed
// into one message per item.
func (r *remoteReplica) lookAgain() {
	select {
	case r.look <- struct{}{}:
	default:
	}
}

// block registers a call that is about to block; the returned func
// unregisters it once it no longer waits.
func (r *remoteReplica) block(blocked func() bool) func() {
	if !r.watch {
		return func() {}
	}
	w := &waiter{blocked: blocked, since: time.Now()}
	r.wmu.Lock()
	r.waiters = append(r.waiters, w)
	r.nblocked.Store(int32(len(r.waiters)))
	r.wmu.Unlock()
	r.lookAgain()
	return func() {
		r.wmu.Lock()
		r.waiters = slices.DeleteFunc(r.waiters, func(o *waiter) bool { return o == w })
		r.nblocked.Store(int32(len(r.waiters)))
		r.wmu.Unlock()
		r.lookAgain()
	}
}

// sayWaiting sends Waiting when the node's state has changed since the
// last one sent; called by sendItems with everything before on the stream.
func (r *remoteReplica) sayWaiting() error {
	if !r.watch {
		return nil
	}
	seen := r.recvd.Load() // before the condition: see waiter
	r.wmu.Lock()
	waiting := len(r.waiters) == 1 && r.waiters[0].blocked() && len(r.outq) == 0
	var since time.Time
	if waiting {
		since = r.waiters[0].since
	}
	r.wmu.Unlock()
	if !waiting {
		seen = 0
	}
	if waiting && !r.saidWaiting {
		if wait := WaitingAfter - time.Since(since); wait > 0 {
			// Not yet: look again once the call has been blocked long
			// enough (a call that ends before then says nothing).
			if !r.waitTimer.Swap(true) {
				time.AfterFunc(wait, func() { r.waitTimer.Store(false); r.lookAgain() })
			}
			return nil
		}
	}
	if waiting == r.saidWaiting && seen == r.saidSeen {
		return nil
	}
	r.saidWaiting, r.saidSeen = waiting, seen
	return r.send(&proto.Message{Msg: &proto.Message_Waiting{Waiting: &proto.Waiting{Waiting: waiting, Seen: seen}}})
}

// received checks an input item by reference and records the node's hold
// on its region.
func (r *remoteReplica) received(ref *proto.Ref) (*Held, error) {
	if r.pools == nil || ref.Pool != 0 {
		return nil, fmt.Errorf("sdk: an item by reference to pool %d, which dflow does not send from", ref.Pool)
	}
	if err := r.pools.In.Check(ref); err != nil {
		return nil, fmt.Errorf("sdk: %w", err)
	}
	return r.pools.In.Track(ref.Offset, ref.Length), nil
}

// drop drops a hold on a received region, and releases it to dflow with
// the last.
func (r *remoteReplica) drop(h *Held) {
	if r.pools.In.Drop(h) {
		// A stream that broke shows elsewhere.
		_ = r.send(&proto.Message{Msg: &proto.Message_Release{Release: &proto.Release{Refs: []*proto.Ref{{Pool: 0, Offset: h.Off, Length: h.Len}}}}})
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
	r     *remoteReplica
	port  string
	ch    chan inItem
	ended atomic.Bool // end of input received (set before ch is closed)
	w     Window
	cur   *Held // the region of the item by reference the node last received here
}

// inItem is an item received for the node, with its payload's size, and
// its region when it came by reference.
type inItem struct {
	item any
	size int64
	held *Held
}

// Recv returns the port's next item. An item that came by reference
// (shared memory) is a view of dflow's pool: it is valid until the node's
// next Recv on this port, unless the node sends it (or an item whose
// bytes lie within it) on, when it passes on with the Send. A node that
// keeps an item longer copies it (Detach).
func (in *remoteInput) Recv(ctx context.Context) (any, error) {
	if in.cur != nil {
		in.r.drop(in.cur)
		in.cur = nil
	}
	select {
	case it, ok := <-in.ch:
		return in.took(it, ok)
	default:
	}
	defer in.r.block(func() bool { return len(in.ch) == 0 && !in.ended.Load() })()
	select {
	case it, ok := <-in.ch:
		return in.took(it, ok)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (in *remoteInput) took(it inItem, ok bool) (any, error) {
	if !ok {
		return nil, io.EOF
	}
	// The item is taken: credit for one more, which the sender grants
	// (several in one message when items come fast).
	in.w.Taken(it.size)
	in.cur = it.held
	in.r.wake()
	return it.item, nil
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
	if o.held && !o.credit.tryTake() {
		unblock := o.r.block(func() bool { return o.credit.n.Load() <= 0 })
		err := o.credit.Take(ctx, o.r.dead)
		unblock()
		if err != nil {
			return err
		}
	}
	it, err := o.r.prepare(o.port, item)
	if err != nil {
		return fmt.Errorf("sdk: output %q: %w", o.port, err)
	}
	select {
	case o.r.outq <- it:
		return nil
	case <-o.r.sent:
		o.r.discard(it)
		return o.r.sendFailed()
	case <-ctx.Done():
		o.r.discard(it)
		return ctx.Err()
	}
}

// prepare encodes an item the node sends, and, with pools, sends a large
// one by reference: where it already lies (an item received, sent on),
// holding its region until the reference is on the stream; otherwise
// copied once into a region of the plugin's pool. It goes as bytes when
// it is small or no region is free.
func (r *remoteReplica) prepare(port string, item any) (outItem, error) {
	e, err := encodeItem(item)
	if err != nil {
		return outItem{}, err
	}
	it := outItem{port: port, enc: e}
	size := int64(e.size)
	if r.pools == nil || size < r.threshold {
		return it, nil
	}
	if off, ok := r.pools.In.Contiguous(e.pieces, size); ok {
		h := r.pools.In.Containing(off, size)
		if h == nil {
			return outItem{}, errors.New("the item lies in the memory of an item received by reference that the node no longer holds (such an item is valid until the next Recv on its port: copy what you keep, sdk.Detach)")
		}
		r.pools.In.Hold(h)
		it.ref = &proto.Ref{Pool: 0, Offset: off, Length: size}
		it.after = func() { r.drop(h) }
		return it, nil
	}
	if h, ok := r.pools.Out.Write(e.pieces, size, nil, e.typ); ok {
		it.ref = &proto.Ref{Pool: 1, Offset: h.Off, Length: size}
	}
	return it, nil
}

// discard lets go of the region of an item that will not be sent.
func (r *remoteReplica) discard(it outItem) {
	if it.after != nil {
		it.after()
	} else if it.ref != nil && it.ref.Pool == 1 {
		r.pools.Out.Free(it.ref.Offset)
	}
}

// Detach returns an item that owns its memory: the item itself, or, for
// one received by reference (a view of shared memory, valid until the
// next Recv on its port), a copy that the node may keep as long as it
// likes.
func Detach(item any) (any, error) {
	typ, pieces, err := encode(item)
	if err != nil {
		return nil, err
	}
	return Decode(typ, slices.Concat(pieces...))
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

func (noGroup) Barrier(context.Context) error                           { return errNoGroup }
func (noGroup) AllReduceSum(context.Context, []float32) (int, error)    { return 0, errNoGroup }
func (noGroup) AllReduce(context.Context, nodes.Reducible) (int, error) { return 0, errNoGroup }
func (noGroup) Leave()                                                  {}
func (noGroup) Finish(context.Context) (bool, error)                    { return false, errNoGroup }
