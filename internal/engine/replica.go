package engine

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// replica is one running replica of a stage. It implements nodes.Replica.
//
// Accounting is built so that an item that does not have to wait costs
// next to nothing: a Recv that finds an item waiting and a Send that finds
// room read no clock and touch only counters of their own (see tally).
// Only a wait that blocks is timed, to the replica's idle or blocked total;
// busy is the rest of its lifetime. Service times are timed on a sample of
// items (see itemClock).
type replica struct {
	stage   *stage
	index   int
	device  string
	inputs  map[string]*input
	outputs map[string]*output
	away    bool     // runs in another engine (placement.go)
	metrics *metrics // the node's own figures, published by this replica
	// remoteSite is the replica's wait at a group across hosts
	remoteSite waitSite

	// ctx is the context the replica's Run is given, done its Done channel.
	ctx    context.Context
	done   <-chan struct{}
	coarse *coarseClock // the run's; nil times every wait exactly
	stop   *stopFlag    // set once ctx may be done (see stopping)
	// own is the node's own account of its time (own.go), nil for a
	// replica measured at its ports
	own atomic.Pointer[ownTimes]
	// delivers: an input of the replica is on a transport or a chain's,
	// so it may hold a delivery (its Recv settles the one in hand)
	delivers bool

	_       linePad
	idle    waitTotal    // ns spent blocked in Recv
	blocked waitTotal    // ns spent blocked in Send or a group collective
	ended   atomic.Int64 // unix ns when Run returned; 0 while running
	clock   itemClock
	// waitOn is what the replica's latest blocking wait needs to end (set
	// as it begins; meaningful while a wait is in progress).
	// countSites: the node is a nodes.Quiescer, whose waits in progress
	// the sites count for the deadlock detector.
	countSites bool
	waitOn     atomic.Pointer[waitSite]
	// hand is the delivery in hand, from a queue on a transport or a
	// chain's (nil: none); sentBare counts what the replica sent on
	// transports and chains' queues with none in hand (a source)
	hand     atomic.Pointer[inHand]
	sentBare atomic.Int64
	// A rebalance's moves (rebalance.go): parked, a spare replica not
	// started yet; begun, when it started; retiring, it leaves at its
	// next Recv, and a replica of the stage successor starts after it;
	// reserved (under the mover's lock), a parked replica chosen to start.
	parked   atomic.Bool
	retiring atomic.Bool
	reserved bool
	released bool // on a cluster, a parked replica that will not start (parked.go)
	gone     bool // on a cluster, a replica a move took away before a restart (parked.go)
	// handedOver: the replica that takes over its device after a move
	// has been started (succeed), at its return or as its node returned
	// (Free)
	handedOver atomic.Bool
	// freed: its node has returned, its runtime still waits (Free)
	freed     atomic.Bool
	begun     atomic.Pointer[time.Time]
	successor atomic.Pointer[stage]
	_         linePad
}

func (r *replica) Stage() string  { return r.stage.g.Name }
func (r *replica) Index() int     { return r.index }
func (r *replica) Device() string { return r.device }

// Replicas is the stage's replica count; a rebalanced stage's counts the
// parked replicas a move may start (rebalance.go).
func (r *replica) Replicas() int {
	if n := r.stage.slots; n > 0 {
		return n
	}
	return r.stage.g.Replicas
}

// Devices lists the devices of every replica of the stage, by index: what
// a plugin group kind's ranks need to number their devices alike
// (plugins/host).
func (r *replica) Devices() []string {
	d := make([]string, r.stage.g.Replicas)
	for i := range d {
		d[i] = r.stage.g.Device(i)
	}
	return d
}

// Restarts is the stage's restarts: how many times a plugin group kind's
// ranks may restart whole in this process (plugins/host).
func (r *replica) Restarts() int { return r.stage.g.Restarts }

func (r *replica) Group() nodes.Group {
	if r.stage.remote != nil {
		return &remoteMember{g: r.stage.remote, r: r}
	}
	return &member{g: r.stage.group, r: r}
}
func (r *replica) Metrics() nodes.Metrics    { return r.metrics }
func (r *replica) Draining() <-chan struct{} { return r.stage.run.draining }
func (r *replica) isSource() bool            { return len(r.inputs) == 0 }

func (r *replica) In(port string) nodes.Input {
	if in, ok := r.inputs[port]; ok {
		return in
	}
	panic(fmt.Sprintf("engine: stage %q (%s) has no input port %q", r.stage.g.Name, r.stage.g.Node, port))
}

func (r *replica) Out(port string) nodes.Output {
	if out, ok := r.outputs[port]; ok {
		return out
	}
	panic(fmt.Sprintf("engine: stage %q (%s) has no output port %q", r.stage.g.Name, r.stage.g.Node, port))
}

// Replica states, as monitoring sees them.
const (
	stateBusy int32 = iota
	stateIdle
	stateBlocked
	stateDone
)

// waitTotals reads the replica's idle and blocked time as of now
// (nanotime, read after the totals, so that every wait in them began
// before it), waits in progress counted up to now, and how many there are.
func (r *replica) waitTotals() (now, idle, blocked int64, inIdle, inBlocked int) {
	vi, vb := r.idle.v.Load(), r.blocked.v.Load()
	now = nanotime()
	idle, inIdle = waitsAt(vi, now)
	blocked, inBlocked = waitsAt(vb, now)
	return now, idle, blocked, inIdle, inBlocked
}

// waits returns the replica's idle and blocked time so far and its state.
func (r *replica) waits() (idle, blocked int64, state int32) {
	_, idle, blocked, inIdle, inBlocked := r.waitTotals()
	switch {
	case r.ended.Load() != 0:
		state = stateDone
	case inBlocked > 0:
		state = stateBlocked
	case inIdle > 0:
		state = stateIdle
	}
	return idle, blocked, state
}

// waited returns the time (nanotime) and the replica's idle and blocked
// time until then.
func (r *replica) waited() (now, waited int64) {
	now, idle, blocked, _, _ := r.waitTotals()
	return now, idle + blocked
}

// itemsIn and itemsOut add up the replica's port counters.
func (r *replica) itemsIn() int64 {
	var n int64
	for _, in := range r.inputs {
		for _, iq := range in.all {
			n += iq.got.load()
		}
	}
	return n
}

func (r *replica) itemsOut() int64 {
	var n int64
	for _, out := range r.outputs {
		if len(out.edges) > 0 {
			for _, oq := range out.edges[0].queues {
				n += oq.sent.load() // every item goes once to each edge
			}
		}
	}
	return n
}

// flush publishes every counter of the replica's ports; called once Run
// has returned, when no port is in use any more.
func (r *replica) flush() {
	for _, in := range r.inputs {
		for _, iq := range in.all {
			iq.got.flush()
		}
	}
	for _, out := range r.outputs {
		for _, oe := range out.edges {
			for _, oq := range oe.queues {
				oq.sent.flush()
			}
		}
	}
}

// input merges the queues of every edge ending on one port, for one
// replica.
//
// What the fast path touches sits in the port and in its queues' port-side
// views (inQueue, outQueue), each on cache lines of its own: a Recv that
// finds an item reads the input, its one inQueue and the channel, and
// writes nothing another goroutine reads per item.
type input struct {
	_ linePad
	// what the fast path reads, on one cache line
	r      *replica
	one    *inQueue // the only queue, when the port has one
	clock  portClock
	retire atomic.Bool // a rebalance moves the replica: its next Recv ends its input

	all   []*inQueue           // every queue feeding this port for this replica
	live  []*inQueue           // those not yet ended
	cases []reflect.SelectCase // used only with fan-in
	next  int                  // fan-in: the live queue poll tries first
	site  waitSite             // waits on this port, for the deadlock detector
	_     linePad
}

// inQueue is one queue as one consumer replica's port sees it.
type inQueue struct {
	_        linePad
	ch       chan any
	capBytes int64
	got      tally
	q        *queue
	remote   bool // on a transport or a chain's: its items may come boxed (*Delivery)
	_        linePad
}

func newInQueue(q *queue) *inQueue {
	return &inQueue{ch: q.ch, capBytes: q.capBytes, q: q, remote: q.t != nil || q.chain != nil}
}

func (in *input) Recv(ctx context.Context) (any, error) {
	if in.clock.inHand(&in.r.clock) {
		in.clock.stop(in.r) // this call ends the work on the timed item
	}
	if in.r.delivers && in.r.hand.Load() != nil {
		in.r.Hand(nil) // the replica has done with its delivery in hand
	}
	if in.retire.Load() {
		in.flush()
		return nil, io.EOF // it leaves for a rebalance, its item in hand done (rebalance.go)
	}
	if iq := in.one; iq != nil {
		// The port's only queue, written out in full for the common cases
		// (an item waiting, or a plain wait with the replica's own
		// context): each call level costs a few ns an item here.
		var item any
		var ok bool
		select {
		case item, ok = <-iq.ch: // fast path: an item is waiting
		default:
			r := in.r
			if ctx != r.ctx || r.stopping() {
				return in.recvSlow(ctx)
			}
			in.flush() // a replica that waits shows exact counts
			w := r.beginWait(&r.idle, &in.site)
			item, ok = <-iq.ch // released on cancellation by a wake token (wake.go)
			r.endWait(w)
		}
		if ok && !isWake(item) {
			if iq.remote {
				item = in.unbox(item)
			}
			in.took(iq, item)
			return item, nil
		}
		// The queue is closed, or the run cancelled: the slow path sorts
		// out which.
	}
	return in.recvSlow(ctx)
}

// recvSlow is Recv when no item waits on the port's only queue: fan-in,
// or a wait.
func (in *input) recvSlow(ctx context.Context) (any, error) {
	r := in.r
	var iq *inQueue
	var item any
	if in.one == nil {
		iq, item = in.poll()
	}
	if iq == nil {
		in.flush() // a replica that waits shows exact counts
		w := r.beginWaitOn(&r.idle, &in.site, ctx == r.ctx)
		var err error
		iq, item, err = in.recv(ctx)
		r.endWait(w)
		if err != nil {
			return nil, err
		}
	}
	if iq.remote {
		item = in.unbox(item)
	}
	in.took(iq, item)
	return item, nil
}

// unbox returns an item taken off a queue on a transport: one that came
// with a receipt (boxed, *Delivery) becomes the replica's delivery in
// hand.
func (in *input) unbox(item any) any {
	if d, ok := item.(*Delivery); ok {
		in.r.Hand(d.Receipt)
		return d.Item
	}
	return item
}

// took does the accounting for an item taken off iq: the count, the bytes
// it held, and whether to time it.
func (in *input) took(iq *inQueue, item any) {
	iq.got.add(in.clock.every)
	if iq.capBytes > 0 {
		iq.q.release(item)
	}
	if in.clock.pick.next() {
		in.clock.picked(in.r)
	}
}

// poll is the fast path of fan-in: it takes an item waiting on any live
// queue, starting from the queue after the one it took from last so that
// no edge is starved.
func (in *input) poll() (*inQueue, any) {
	n := len(in.live)
	for k := range n {
		i := (in.next + k) % n
		select {
		case item, ok := <-in.live[i].ch:
			if !ok || isWake(item) {
				return nil, nil // the slow path drops a closed queue and checks for cancellation
			}
			in.next = i + 1
			return in.live[i], item
		default:
		}
	}
	return nil, nil
}

func (in *input) flush() {
	for _, iq := range in.all {
		iq.got.flush()
	}
}

func (in *input) recv(ctx context.Context) (*inQueue, any, error) {
	for len(in.live) > 0 {
		var iq *inQueue
		var item any
		var ok bool
		if len(in.live) == 1 {
			iq = in.live[0]
			if ctx == in.r.ctx {
				// A plain receive, released on cancellation by a wake
				// token (wake.go).
				if in.r.stopping() {
					return nil, nil, ctx.Err()
				}
				item, ok = <-iq.ch
			} else {
				select {
				case item, ok = <-iq.q.ch:
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
		} else {
			i, v, recvOK := in.selectLive(ctx)
			if i < 0 {
				return nil, nil, ctx.Err()
			}
			iq, ok = in.live[i], recvOK
			if ok {
				item = v.Interface()
			}
		}
		if ok && isWake(item) {
			if isClosed(in.r.done) {
				return nil, nil, in.r.ctx.Err()
			}
			continue
		}
		if ok {
			return iq, item, nil
		}
		in.drop(iq)
	}
	return nil, nil, io.EOF
}

// selectLive waits on every live queue and ctx; it returns -1 when ctx is
// done.
func (in *input) selectLive(ctx context.Context) (int, reflect.Value, bool) {
	in.cases = in.cases[:0]
	for _, iq := range in.live {
		in.cases = append(in.cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(iq.q.ch)})
	}
	in.cases = append(in.cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
	i, v, ok := reflect.Select(in.cases)
	if i == len(in.live) {
		return -1, v, false
	}
	return i, v, ok
}

func (in *input) drop(iq *inQueue) {
	for i, l := range in.live {
		if l == iq {
			in.live = append(in.live[:i], in.live[i+1:]...)
			return
		}
	}
}

// output fans one port out to every edge leaving it; on each edge the
// policy's router (graph.Policy.Router) picks which of the queues the
// replica feeds gets the item. A port with one edge and one queue that
// needs no routing (round_robin, shared) has it in one: Send's fast path
// then never routes.
type output struct {
	_     linePad
	r     *replica
	one   *outQueue // the only queue, when the port feeds one
	edges []*outEdge
	clock portClock // a source's: its Sends delimit its items
	_     linePad
}

// outEdge is one edge of an output port, as one producer replica feeds
// it: its queues (in graph.Edge.ProducerQueues order) and the policy's
// router over them, nil when every item goes to the only queue.
type outEdge struct {
	_      linePad
	queues []*outQueue
	route  graph.Router
	_      linePad
}

// outQueue is one queue as one producer replica's port sees it.
type outQueue struct {
	_        linePad
	ch       chan any
	capBytes int64
	sent     tally
	capacity int          // cap(ch), kept here: reading it from the channel touches its contended cache line
	deepest  int          // the deepest this producer saw the queue
	maxDepth atomic.Int64 // deepest, for monitoring
	q        *queue
	// a wait with the replica's own context for room on the queue, and
	// for its capacity_bytes budget
	full, bytesFull waitSite
	_               linePad
}

func newOutQueue(q *queue) *outQueue {
	oq := &outQueue{ch: q.ch, capBytes: q.capBytes, capacity: cap(q.ch), q: q,
		full: waitSite{kind: waitSend, q: q}, bytesFull: waitSite{kind: waitBytes, q: q}}
	if q.t != nil {
		// No channel on the producers' side: the fast path's send is
		// never ready, and the wait path calls the transport.
		oq.ch, oq.capacity = nil, q.edge.g.Capacity
	}
	return oq
}

// put does the accounting for an item just sent on oq: the count, and the
// depth it left the queue at. Once the producer has seen the queue full,
// the depth is no longer read: under contention the channel's length sits
// on its most contended cache line.
func (o *output) put(oq *outQueue) {
	if oq.sent.add(o.clock.every) && !o.clock.starts {
		// A port that does not pick items to time follows its replica's
		// rate as it publishes (a source's output follows it as it picks).
		o.clock.every = o.r.clock.every.Load()
	}
	if oq.deepest < oq.capacity {
		oq.saw(len(oq.ch))
	}
}

// saw records a depth the producer saw.
func (oq *outQueue) saw(depth int) {
	if depth > oq.deepest {
		oq.deepest = depth
		oq.maxDepth.Store(int64(depth))
	}
}

func (o *output) Send(ctx context.Context, item any) error {
	source := o.clock.starts
	if source && o.clock.inHand(&o.r.clock) {
		o.clock.stop(o.r)
	}
	if oq := o.one; oq != nil && oq.capBytes == 0 {
		// The port's only queue: straight to the wait when it is full,
		// without sendSlow's call level.
		select {
		case oq.ch <- item: // fast path: there is room
			o.put(oq)
		default:
			if err := o.send(ctx, oq, item, true); err != nil {
				return err
			}
		}
		if source && o.clock.pick.next() {
			o.clock.picked(o.r)
		}
		return nil
	}
	return o.sendSlow(ctx, item, false)
}

// sendSlow is Send for fan-out, routing (the edge policy's router:
// rotation over several queues, key_hash), capacity_bytes, or a full
// queue; full says the port's only queue was
// just found full.
func (o *output) sendSlow(ctx context.Context, item any, full bool) error {
	if oq := o.one; oq != nil {
		if err := o.send(ctx, oq, item, full); err != nil {
			return err
		}
	} else {
		for _, e := range o.edges {
			oq := e.queues[0]
			if e.route != nil {
				i, err := e.route.Route(item)
				if err != nil {
					return err
				}
				oq = e.queues[i]
			}
			if err := o.send(ctx, oq, item, false); err != nil {
				return err
			}
		}
	}
	if o.clock.starts && o.clock.pick.next() {
		o.clock.picked(o.r)
	}
	return nil
}

// send pushes an item on one queue, blocking (and timing the wait) only
// when it is full; full says the caller has just found it full, so that
// it is not tried twice.
func (o *output) send(ctx context.Context, oq *outQueue, item any, full bool) error {
	if c := oq.q.chain; c != nil {
		if rc := c.Derive(o.r.origin()); rc != nil {
			if err := o.push(ctx, oq, &Delivery{Item: item, Receipt: rc}, item, full); err != nil {
				c.Unsent(rc)
				return err
			}
			return nil
		}
	}
	return o.push(ctx, oq, item, item, full)
}

// push is send, the item boxed or not; sized is the item as sent, what
// counts against capacity_bytes.
func (o *output) push(ctx context.Context, oq *outQueue, item, sized any, full bool) error {
	if oq.capBytes > 0 {
		if err := o.reserve(ctx, oq, sizeOf(sized)); err != nil {
			return err
		}
	}
	if !full {
		select {
		case oq.ch <- item:
			o.put(oq)
			return nil
		default:
		}
	}
	if oq.ch != nil {
		oq.saw(oq.capacity)
	}
	o.flush() // a replica that waits shows exact counts
	w := o.r.beginWaitOn(&o.r.blocked, &oq.full, ctx == o.r.ctx)
	err := oq.q.sendWait(ctx, o.r, item)
	o.r.endWait(w)
	if err != nil {
		return err
	}
	o.put(oq)
	return nil
}

// reserve waits for n bytes of room on q (capacity_bytes). An item larger
// than the whole budget passes alone once the queue is empty, so it cannot
// deadlock.
func (o *output) reserve(ctx context.Context, oq *outQueue, n int64) error {
	q := oq.q
	if q.tryReserve(n) {
		return nil
	}
	o.flush()
	defer o.r.endWait(o.r.beginWaitOn(&o.r.blocked, &oq.bytesFull, ctx == o.r.ctx))
	for !q.tryReserve(n) {
		select {
		case <-q.room:
		case <-q.gone:
			return q.noConsumers()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (o *output) flush() {
	for _, e := range o.edges {
		for _, oq := range e.queues {
			oq.sent.flush()
		}
	}
}
