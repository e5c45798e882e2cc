package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// remoteNode runs a plugin stage: each replica gets its own plugin
// process, so a replica's stderr is prefixed with its stage and index and
// a crash names exactly that replica.
type remoteNode struct {
	k      *remoteKind
	config string
	mu     sync.Mutex
	quiet  map[int]*quiet // the running replicas' (with k.waiting), by index
	master int            // a group kind's MASTER_PORT for this run of the stage (group.go), once chosen
	// restarts: the stage's restarts in this process, for a group kind
	// that restores (restart.go); made by its first member to start
	restarts *restarter
}

func (n *remoteNode) Run(ctx context.Context, r nodes.Replica) error {
	k := n.k
	if rs := n.restarterFor(ctx, r); rs != nil {
		return n.runRestarting(ctx, r, rs)
	}
	var env []string
	var restore *int64
	var peerLoss time.Duration
	device := r.Device()
	if k.restores {
		// A member of a group that restores: told its group's last save
		// where it is a restart of the group lost whole (group.go).
		var err error
		if restore, err = restoreStep(ctx, r); err != nil {
			return fmt.Errorf("plugin %s (%s): rank %d of %d: %w", k.plugin, k.path, r.Index(), r.Replicas(), err)
		}
	}
	if k.group {
		// A rank: the environment torchrun gives one, its device bound
		// before the process starts (group.go).
		place, err := n.place(ctx, r)
		if err != nil {
			return fmt.Errorf("plugin %s (%s): %w", k.plugin, k.path, err)
		}
		env, device = rankEnv(r, place)
		peerLoss = place.PeerLoss
	}
	p, err := k.host.start(k.path, fmt.Sprintf("[%s/%d] ", r.Stage(), r.Index()), env...)
	if err != nil {
		return err
	}
	err = n.stream(ctx, r, p, device, restore, nil)
	// Kill waits for the process and for its stderr to be copied, so the
	// message below has the plugin's last words.
	k.host.kill(p.client)
	if err != nil && ctx.Err() == nil && peerLoss > 0 {
		// A rank of a group that restarts whole fails at once when a
		// peer's host is lost (its collective's connection closed); the
		// runtime counts that host lost within its lease, and then stops
		// this rank too and starts the group again: its failure is the
		// run's only if that does not come.
		fmt.Fprintf(k.host.log(), "[%s/%d] rank %d of %d failed (%v); waiting up to %v for its group to restart, in case a peer's host was lost\n",
			r.Stage(), r.Index(), r.Index(), r.Replicas(), err, peerLoss)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(peerLoss):
		}
	}
	if err != nil && ctx.Err() == nil {
		who := fmt.Sprintf("plugin %s (%s)", k.plugin, k.path)
		if k.group {
			who += fmt.Sprintf(": rank %d of %d", r.Index(), r.Replicas())
		}
		if p.stderr.empty() {
			return fmt.Errorf("%s: %w", who, err)
		}
		return fmt.Errorf("%s: %w; %s", who, err, p.stderr.last())
	}
	return err
}

// stream pumps one replica: inputs to the plugin as it grants credit,
// outputs and metrics back, until the plugin says Done.
//
// att is the member's attempt in a group that restarts whole in this
// process (restart.go), nil elsewhere.
func (n *remoteNode) stream(ctx context.Context, r nodes.Replica, p *process, device string, restore *int64, att *attempt) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rst, err := p.node.Run(sctx)
	if err != nil {
		return err
	}
	q := &quiet{}
	var st proto.Node_RunClient = countedStream{rst, q}
	var mu sync.Mutex // one message (or one item's messages) at a time on the stream
	locked := func(f func() error) error {
		mu.Lock()
		defer mu.Unlock()
		return f()
	}
	start := &proto.Start{Kind: n.k.kind, ConfigJson: n.config, Stage: r.Stage(),
		Replica: int32(r.Index()), Replicas: int32(r.Replicas()), Device: device, Batches: true,
		OutputCredit: n.k.outputCredit, Waiting: n.k.waiting, Group: n.k.group, RestoreStep: restore}
	clock := att.carry(r.Index(), ownClockOf(r, n.k.times))
	start.Times = clock.begin() // the plugin's figures for the replica's (times.go)
	send := func(m *proto.Message) error { return locked(func() error { return st.Send(m) }) }
	sh := &shared{send: send}
	var coll *collectives
	if n.k.group {
		coll = &collectives{r: r, send: send}
	}
	if n.k.sharedMemory && wire.SharedMemoryEnabled() {
		// Shared memory for large items: created per replica, unmapped
		// once the replica's stream, its feeders and its outlets are done
		// (the deferred calls run after all of them). Without (no memfd
		// here), items go as bytes.
		if ps, err := wire.CreatePools(n.k.host.poolBytes(), n.k.host.poolBytes()); err == nil {
			sh.pools = ps
			start.Pools = ps.Proto()
			defer func() {
				if poolsClosing != nil {
					poolsClosing(ps)
				}
				ps.Close()
			}()
		}
	}
	if err := st.Send(&proto.Message{Msg: &proto.Message_Start{Start: start}}); sendFailed(err) {
		return err
	}
	if startSent != nil {
		startSent()
	}
	inputs, inTypes, outputs := n.ports(r)
	if !n.k.outputCredit {
		// An older plugin: its items are handed on as they come, and an
		// output whose edges are full holds back the whole stream.
		return n.pump(sctx, cancel, r, st, locked, sh, q, coll, clock, att, inputs, inTypes, func(it *proto.Item) error {
			return n.deliver(ctx, r, sh, outputs, it)
		})
	}
	outs, err := newOutlets(ctx, r, sh, outputs, send, cancel)
	if err != nil {
		return err
	}
	if n.k.waiting {
		q.outlets = slices.Collect(maps.Values(outs.ports))
		n.watch(r.Index(), q)
		defer n.watch(r.Index(), nil)
	}
	return outs.finish(n.pump(sctx, cancel, r, st, locked, sh, q, coll, clock, att, inputs, inTypes, outs.put))
}

// sendFailed says whether a Send's error is dflow's side's. A Send that
// fails with io.EOF found the stream ended by the plugin's side: why it
// ended (a protocol error in what the plugin sent, its Done, its status)
// is the reader's to find and say, so the replica goes on to read.
func sendFailed(err error) bool { return err != nil && !errors.Is(err, io.EOF) }

// startSent, when set (by tests), runs once a replica's Start is on the
// stream, before dflow grants the plugin credit on its outputs.
var startSent func()

// poolsClosing, when set (by tests), sees a replica's pools as its
// stream ends, before they are unmapped.
var poolsClosing func(*wire.Pools)

// shared is a replica's shared memory, dflow's side: the pools offered
// to the plugin (nil when none were), attached once the plugin says it
// mapped them.
type shared struct {
	pools    *wire.Pools
	attached atomic.Bool
	send     func(*proto.Message) error // on the stream, locked
}

// in is the pool items go to the plugin in, nil until the plugin has
// attached.
func (sh *shared) in() *wire.Pool {
	if sh.attached.Load() {
		return sh.pools.In
	}
	return nil
}

// attach takes the plugin's answer to the pools.
func (sh *shared) attach(a *proto.Attached) error {
	if sh.pools == nil {
		return errors.New("the plugin said it attached shared memory that dflow did not offer")
	}
	sh.pools.Attached() // dflow's descriptors: the mappings hold the memory now
	if a.Error == "" {
		sh.attached.Store(true)
	}
	return nil
}

// release frees the regions of pool 0 that the plugin is done with.
func (sh *shared) release(rel *proto.Release) error {
	for _, ref := range rel.Refs {
		if in := sh.in(); in == nil || ref.Pool != 0 {
			return fmt.Errorf("the plugin released a region of pool %d, which dflow did not send it", ref.Pool)
		} else if err := in.Free(ref.Offset); err != nil {
			return fmt.Errorf("the plugin released a region dflow did not send it: %v", err)
		}
	}
	return nil
}

// payload is an output item's bytes and size. An item by reference to a
// region of pool 0 (dflow's) that is exactly an item dflow sent is that
// item again, with no copy (item non-nil): the plugin maps pool 0
// read-only, so the bytes are the same. Otherwise the bytes are copied
// out of the pool once, and a region of pool 1 is released to the plugin
// at once.
func (sh *shared) payload(it *proto.Item) (b []byte, item any, size int64, err error) {
	ref := it.Ref
	if ref == nil {
		return it.Payload, nil, int64(len(it.Payload)), nil
	}
	if !sh.attached.Load() {
		return nil, nil, 0, errors.New("the plugin sent an item by reference without shared memory")
	}
	p := sh.pools.Pool(ref.Pool)
	if p == nil {
		return nil, nil, 0, fmt.Errorf("the plugin sent an item by reference to pool %d, which does not exist", ref.Pool)
	}
	if err := p.Check(ref); err != nil {
		return nil, nil, 0, fmt.Errorf("the plugin sent %v", err)
	}
	if ref.Pool == 0 {
		h := p.Containing(ref.Offset, ref.Length)
		if h == nil {
			return nil, nil, 0, fmt.Errorf("the plugin sent an item by reference to bytes %d-%d of pool 0, which hold no item it was sent", ref.Offset, ref.Offset+ref.Length)
		}
		if h.Off == ref.Offset && h.Len == ref.Length && h.Wire == it.Type && h.Origin != nil {
			return nil, h.Origin, ref.Length, nil
		}
		return bytes.Clone(p.Bytes(ref.Offset, ref.Length)), nil, ref.Length, nil
	}
	b = bytes.Clone(p.Bytes(ref.Offset, ref.Length))
	// The plugin may have finished already (the item came just before its
	// Done): a stream that broke is the reader's to report.
	_ = sh.send(&proto.Message{Msg: &proto.Message_Release{Release: &proto.Release{Refs: []*proto.Ref{ref}}}})
	return b, nil, ref.Length, nil
}

// decode is an output item, checked against its port's type.
func (sh *shared) decode(port, typ string, it *proto.Item) (any, int64, error) {
	if err := wire.CheckPortWire(typ, it.Type); err != nil {
		return nil, 0, fmt.Errorf("output %q: the plugin sent %w", port, err)
	}
	b, item, size, err := sh.payload(it)
	if err != nil {
		return nil, 0, fmt.Errorf("output %q: %w", port, err)
	}
	if item == nil {
		item, err = wire.Decode(it.Type, b)
	}
	return item, size, err
}

// pump feeds the replica's inputs to the plugin and reads what it sends,
// handing each whole output item to put, until the plugin says Done.
func (n *remoteNode) pump(sctx context.Context, cancel context.CancelFunc, r nodes.Replica, st proto.Node_RunClient,
	locked func(func() error) error, sh *shared, q *quiet, coll *collectives, clock *pluginClock, att *attempt, inputs []string, inTypes map[string]string, put func(*proto.Item) error) error {
	// Credit: per input port when the plugin grants it so (port_credit);
	// otherwise one pool, under "".
	credits := map[string]*wire.Credit{"": wire.NewCredit()}
	if n.k.portCredit {
		credits = map[string]*wire.Credit{}
		for _, port := range inputs {
			credits[port] = wire.NewCredit()
		}
	}
	sendErr := make(chan error, 1)
	fed := make(chan struct{})
	var feedFailed atomic.Pointer[error] // an input that failed the replica
	go func() {
		defer close(fed)
		err := n.feed(sctx, r, st, locked, sh, q, att, inputs, inTypes, credits)
		if sendFailed(err) && !errors.Is(err, context.Canceled) && sctx.Err() == nil {
			feedFailed.Store(&err)
			cancel() // the stream, which the reader below then sees end
		}
		sendErr <- err
	}()
	// The feeding goroutine uses the replica's input ports: it must be
	// done before Run returns, whichever way it returns.
	defer func() {
		cancel()
		<-fed
		if coll != nil {
			coll.wg.Wait() // their waits end with sctx
		}
	}()

	var items wire.Assembler
	for {
		m, err := st.Recv()
		if err != nil {
			if ferr := feedFailed.Load(); ferr != nil {
				return *ferr
			}
			if errors.Is(err, io.EOF) {
				err = errors.New("the plugin closed the stream without saying it was done")
			} else {
				err = fmt.Errorf("the plugin process failed: %v", err)
			}
			if sctx.Err() != nil {
				return err // dflow ended the stream: its cause is elsewhere
			}
			return &processDied{err} // restart.go
		}
		if err := chunked(m); err != nil {
			return err
		}
		switch v := m.Msg.(type) {
		case *proto.Message_Item:
			b, whole := items.Add(v.Item)
			if !whole {
				continue
			}
			v.Item.Payload = b
			if err := put(v.Item); err != nil {
				return err
			}
		case *proto.Message_Batch:
			for _, it := range v.Batch.Items {
				if err := put(it); err != nil {
					return err
				}
			}
		case *proto.Message_Attached:
			if err := sh.attach(v.Attached); err != nil {
				return err
			}
		case *proto.Message_Release:
			if err := sh.release(v.Release); err != nil {
				return err
			}
		case *proto.Message_Credit:
			port := v.Credit.Port
			if !n.k.portCredit {
				port = ""
			}
			c, ok := credits[port]
			if !ok {
				return fmt.Errorf("the plugin granted credit on %q, which is not an input port", port)
			}
			if n.k.restores && (v.Credit.N != 1 || c.Available() > 0) {
				// its items settle at the save of the step that holds
				// them: an item sent ahead would count as trained a step
				// early (plugin-protocol.md, "A kind that restores")
				return fmt.Errorf("the plugin granted credit for %d items on %q with %d not yet used; a member of a kind that restores asks for one item at a time, as it takes it for a step",
					v.Credit.N, port, c.Available())
			}
			c.Grant(v.Credit.N)
		case *proto.Message_Metric:
			if v.Metric.Counter {
				r.Metrics().Add(v.Metric.Name, v.Metric.Value)
			} else {
				r.Metrics().Set(v.Metric.Name, v.Metric.Value)
			}
		case *proto.Message_Waiting:
			q.said(v.Waiting)
		case *proto.Message_Collective:
			if coll == nil {
				return errors.New("the plugin sent a Collective, but its kind is not a group kind (Kind.group)")
			}
			att.collective(r.Index(), v.Collective.Op, v.Collective.Step)
			coll.do(sctx, v.Collective)
		case *proto.Message_Times:
			if err := clock.take(v.Times); err != nil {
				return err
			}
		case *proto.Message_Done:
			q.said(nil)
			cancel()
			if v.Done.Error != "" {
				return errors.New(v.Done.Error)
			}
			if len(inputs) > 0 {
				// Cancelled, or the plugin's end of the stream met: either
				// way the plugin's Done came first.
				if err := <-sendErr; sendFailed(err) && !errors.Is(err, context.Canceled) {
					return err
				}
			}
			return nil
		}
	}
}

// chunked checks the protocol's bound on a message's payload: an Item
// carries at most wire.ChunkSize bytes (a larger item goes in chunks), a
// Batch at most that in all. gRPC would take more (go-plugin lifts its
// message limit), so without this check a plugin that ignored the rule
// worked with dflow and failed with another host.
func chunked(m *proto.Message) error {
	switch v := m.Msg.(type) {
	case *proto.Message_Item:
		if n := len(v.Item.Payload); n > wire.ChunkSize {
			return fmt.Errorf("the plugin sent an Item of %d payload bytes on %q; the protocol's limit is %d (1 MiB): a larger item goes in chunks (more = true on all but the last)", n, v.Item.Port, wire.ChunkSize)
		}
	case *proto.Message_Batch:
		n := 0
		for _, it := range v.Batch.Items {
			n += len(it.Payload)
		}
		if n > wire.ChunkSize {
			return fmt.Errorf("the plugin sent a Batch of %d payload bytes; the protocol's limit is %d (1 MiB) in all", n, wire.ChunkSize)
		}
	}
	return nil
}

// deliver decodes a whole item from the plugin and sends it on.
func (n *remoteNode) deliver(ctx context.Context, r nodes.Replica, sh *shared, outputs map[string]string, it *proto.Item) error {
	typ, ok := outputs[it.Port]
	if !ok {
		return fmt.Errorf("the plugin sent an item on %q, which is not an output port of %s", it.Port, n.k.kind)
	}
	item, _, err := sh.decode(it.Port, typ, it)
	if err != nil {
		return err
	}
	return r.Out(it.Port).Send(ctx, item)
}

// outlets hand a plugin replica's output items on, each output port from
// a goroutine of its own (Start.output_credit), so that a full edge holds
// back the items of its own port only, as it would hold back only the
// Sends on that port of a node in process. The stream's reader puts each
// item in its port's buffer and never waits: the credit dflow grants on
// the port keeps the buffer from overflowing.
type outlets struct {
	sh     *shared
	ports  map[string]*outlet
	ctx    context.Context // the deliveries', cancelled if the replica fails
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error // the first delivery that failed
}

type outlet struct {
	port string
	typ  string // the port's type, which its items' encoding must match
	out  nodes.Output
	ch   chan outItem
	w    wire.Window
	// for quiet: items in ch, and whether the outlet is in a Send
	pending atomic.Int64
	sending atomic.Bool
}

type outItem struct {
	item any
	size int64
}

// An output port's buffer holds at most outletItems items, within
// outletBytes once it has seen an item's size. It starts with outletFirst
// of credit, before it has seen an item's size: little, since the items
// may be large (four of 16 MiB hidden states are already 64 MiB).
const (
	outletItems       = 64
	outletFirst       = 4
	outletBytes int64 = 64 << 20
)

// newOutlets grants each output port its first credit and starts handing
// items on; a delivery that fails calls stopStream, so that the stream's
// reader stops too.
func newOutlets(ctx context.Context, r nodes.Replica, sh *shared, outputs map[string]string, send func(*proto.Message) error, stopStream context.CancelFunc) (*outlets, error) {
	o := &outlets{sh: sh, ports: map[string]*outlet{}}
	o.ctx, o.cancel = context.WithCancel(ctx)
	for port, typ := range outputs {
		p := &outlet{port: port, typ: typ, out: r.Out(port), ch: make(chan outItem, outletItems),
			w: wire.Window{Items: outletItems, Bytes: outletBytes}}
		first := p.w.Open(outletFirst)
		if err := send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: first, Port: port}}}); sendFailed(err) {
			o.cancel()
			return nil, err
		}
		o.ports[port] = p
	}
	for _, p := range o.ports {
		o.wg.Go(func() {
			if err := p.run(o.ctx, send); err != nil {
				o.mu.Lock()
				if o.err == nil {
					o.err = err
				}
				o.mu.Unlock()
				stopStream()
			}
		})
	}
	return o, nil
}

// put takes a whole item from the stream's reader.
func (o *outlets) put(it *proto.Item) error {
	p := o.ports[it.Port]
	if p == nil {
		return fmt.Errorf("the plugin sent an item on %q, which is not an output port", it.Port)
	}
	item, size, err := o.sh.decode(it.Port, p.typ, it)
	if err != nil {
		return err
	}
	if !p.w.Arrived(size) {
		return fmt.Errorf("the plugin sent more items on %q than dflow granted it credit for", it.Port)
	}
	p.pending.Add(1)            // before it is in the buffer: see quiet
	p.ch <- outItem{item, size} // never full: the buffer holds all the credit
	return nil
}

// finish ends the deliveries once the stream has ended with err: after
// handing on every item received if the plugin said Done without error,
// at once otherwise (the replica has failed). A delivery that failed
// before is the cause of whatever error the stream then ended with (it
// stopped the stream).
func (o *outlets) finish(err error) error {
	if first := o.failed(); first != nil {
		err = first
	}
	if err != nil {
		o.cancel()
	}
	for _, p := range o.ports {
		close(p.ch)
	}
	o.wg.Wait()
	o.cancel()
	if err == nil {
		err = o.failed() // while handing on what was left
	}
	return err
}

func (o *outlets) failed() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// run hands the port's items on, granting credit back as they go: in one
// message when the buffer has run dry or a quarter of it is owed, so that
// small items do not cost a message each.
func (p *outlet) run(ctx context.Context, send func(*proto.Message) error) error {
	for it := range p.ch {
		// In the Send before the item leaves the count: a wait there is
		// the detector's to read (see quiet).
		p.sending.Store(true)
		p.pending.Add(-1)
		err := p.out.Send(ctx, it.item)
		p.sending.Store(false)
		if err != nil {
			return err
		}
		p.w.Taken(it.size)
		if len(p.ch) == 0 || p.w.Owed() >= outletItems/4 {
			if n := p.w.Grant(); n > 0 {
				// A stream that broke is the reader's to report.
				_ = send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: n, Port: p.port}}})
			}
		}
	}
	return nil
}

// ports are the node's input port names, sorted, and its output ports,
// each with its type (SameAs outputs: "", unchecked).
func (n *remoteNode) ports(r nodes.Replica) (inputs []string, inTypes, outputs map[string]string) {
	cfg, _ := wire.ConfigFromJSON(n.config, n.k.fields)
	inTypes, outputs = map[string]string{}, map[string]string{}
	for _, p := range n.k.portsFor(cfg) {
		if p.Dir == graph.In {
			inputs = append(inputs, p.Name)
			inTypes[p.Name] = p.Type
		} else {
			outputs[p.Name] = p.Type
		}
	}
	sort.Strings(inputs)
	return inputs, inTypes, outputs
}

// feed sends the replica's input items to the plugin, one per credit, then
// end-of-input per port: with credit per port, each port from a goroutine
// of its own, so that a node may read its inputs in any order; with one
// pool of credit (an older plugin), the ports one after the other.
func (n *remoteNode) feed(ctx context.Context, r nodes.Replica, st proto.Node_RunClient, locked func(func() error) error, sh *shared, q *quiet, att *attempt, ports []string, types map[string]string, credits map[string]*wire.Credit) error {
	if !n.k.portCredit {
		return n.feedPorts(ctx, r, st, locked, sh, q, att, ports, types, credits[""])
	}
	errs := make([]error, len(ports))
	var wg sync.WaitGroup
	for i, port := range ports {
		wg.Go(func() { errs[i] = n.feedPorts(ctx, r, st, locked, sh, q, att, []string{port}, types, credits[port]) })
	}
	wg.Wait()
	for _, err := range errs { // the cause, not the cancellations it led to
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return errors.Join(errs...)
}

// feedPorts feeds ports one after the other, as credit comes. To a plugin
// that takes batches, it sends with each item the others already waiting
// (as much as the credit allows), so that small items do not cost a
// message each.
//
// From the moment a Recv returns until what it returned is on the stream,
// the feeder counts in q.feeding: it holds something the plugin has not
// seen, so the replica is not quiescent (quiet.go).
func (n *remoteNode) feedPorts(ctx context.Context, r nodes.Replica, st proto.Node_RunClient, locked func(func() error) error, sh *shared, q *quiet, att *attempt, ports []string, types map[string]string, credit *wire.Credit) error {
	var have int32
	out := wire.Batcher{Send: st.Send, Batches: n.k.batches}
	waiting, stop := context.WithCancel(ctx)
	stop() // Recv(waiting) takes an item only if one is there
	for _, port := range ports {
		in := att.input(r, port) // r.In(port), or what a group that restarts whole keeps (restart.go)
		for eof := false; !eof; {
			for have == 0 {
				if have = credit.TakeAll(); have > 0 {
					break
				}
				select {
				case <-credit.More():
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			item, err := in.Recv(ctx)
			q.feeding.Add(1)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			for {
				// Validation matched the port types; a node upstream that
				// sent items other than its port's type is caught here, not
				// by the plugin's node.
				if err := wire.CheckPortItem(types[port], item); err != nil {
					return fmt.Errorf("input %q: %w", port, err)
				}
				// A large item goes by reference once the plugin has
				// mapped the pools: copied into pool 0 here, outside the
				// stream's lock, then named in a small message.
				prep, err := wire.Prepare(sh.in(), wire.Threshold, item)
				if err != nil {
					return err
				}
				if err := locked(func() error { return out.AddPrepared(port, prep) }); err != nil {
					return err
				}
				if have--; have == 0 || !out.Batches {
					break
				}
				if item, err = in.Recv(waiting); err != nil {
					eof = err == io.EOF
					break
				}
			}
			if err := locked(out.Flush); err != nil {
				return err
			}
			if !eof {
				q.feeding.Add(-1)
			}
		}
		eof := &proto.Message{Msg: &proto.Message_Eof{Eof: &proto.Eof{Port: port}}}
		if err := locked(func() error { return st.Send(eof) }); err != nil {
			return err
		}
		q.feeding.Add(-1)
	}
	return nil
}
