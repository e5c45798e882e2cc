package engine

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/nodes"
)

// replica is one running replica of a stage. It implements nodes.Replica.
// Its counters are atomics so monitoring can read them while it runs.
type replica struct {
	stage   *stage
	index   int
	device  string
	inputs  map[string]*input
	outputs map[string]*output

	// Time accounting. Busy is whatever is not idle (in Recv) or blocked
	// (in Send or a group collective). mark is when the current busy
	// segment began; itemBusy accumulates the busy time of the current
	// item for the service-time histogram.
	mu       sync.Mutex // guards mark, itemBusy, pending
	mark     time.Time
	itemBusy time.Duration
	pending  bool         // an item has been received and not yet finished
	idle     atomic.Int64 // ns
	blocked  atomic.Int64 // ns
	itemsIn  atomic.Int64
	itemsOut atomic.Int64
	service  histogram
	ended    atomic.Int64 // unix ns when Run returned; 0 while running
	// state and waitStart let monitoring count a wait in progress.
	state     atomic.Int32
	waitStart atomic.Int64
}

func (r *replica) Stage() string             { return r.stage.g.Name }
func (r *replica) Index() int                { return r.index }
func (r *replica) Replicas() int             { return r.stage.g.Replicas }
func (r *replica) Device() string            { return r.device }
func (r *replica) Group() nodes.Group        { return &member{g: r.stage.group, r: r} }
func (r *replica) Metrics() nodes.Metrics    { return r.stage.metrics }
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

// enter closes the current busy segment at the start of a wait of the
// given state and returns the time the wait began. With endItem, the wait
// also ends the work on the current item (a Recv after an item, a
// source's Send), whose service time is recorded.
//
// A node may use its ports from more than one goroutine (the plugin host
// receives and sends concurrently), so the few fields a wait updates sit
// behind an uncontended mutex.
func (r *replica) enter(state int32, endItem bool) time.Time {
	now := time.Now()
	r.mu.Lock()
	r.itemBusy += now.Sub(r.mark)
	if endItem && (r.pending || r.isSource()) {
		r.itemDone()
	}
	r.mu.Unlock()
	r.waitStart.Store(now.UnixNano())
	r.state.Store(state)
	return now
}

// leave ends a wait that began at t, charging it to acc; gotItem starts
// the work on a received item.
func (r *replica) leave(t time.Time, acc *atomic.Int64, gotItem bool) {
	now := time.Now()
	r.mu.Lock()
	r.mark = now
	if gotItem {
		r.pending = true
	}
	r.mu.Unlock()
	acc.Add(int64(now.Sub(t)))
	r.state.Store(stateBusy)
}

// itemDone records the service time of the item just finished; r.mu is
// held.
func (r *replica) itemDone() {
	r.service.observe(r.itemBusy)
	r.itemBusy = 0
	r.pending = false
}

// input merges the queues of every edge ending on one port, for one
// replica.
type input struct {
	r     *replica
	all   []*queue             // every queue feeding this port for this replica
	live  []*queue             // those not yet ended
	cases []reflect.SelectCase // used only with fan-in
	eof   bool
}

func (in *input) Recv(ctx context.Context) (any, error) {
	r := in.r
	t := r.enter(stateIdle, true) // this call ends the work on the previous item
	item, err := in.recv(ctx)
	r.leave(t, &r.idle, err == nil)
	if err == nil {
		r.itemsIn.Add(1)
	}
	return item, err
}

func (in *input) recv(ctx context.Context) (any, error) {
	for len(in.live) > 0 {
		var q *queue
		var item any
		var ok bool
		if len(in.live) == 1 {
			q = in.live[0]
			select {
			case item, ok = <-q.ch: // fast path: an item is waiting
			default:
				select {
				case item, ok = <-q.ch:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		} else {
			i, v, recvOK := in.selectLive(ctx)
			if i < 0 {
				return nil, ctx.Err()
			}
			q, ok = in.live[i], recvOK
			if ok {
				item = v.Interface()
			}
		}
		if ok {
			q.received(item)
			return item, nil
		}
		in.drop(q)
	}
	in.eof = true
	return nil, io.EOF
}

// selectLive waits on every live queue and ctx; it returns -1 when ctx is
// done.
func (in *input) selectLive(ctx context.Context) (int, reflect.Value, bool) {
	in.cases = in.cases[:0]
	for _, q := range in.live {
		in.cases = append(in.cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(q.ch)})
	}
	in.cases = append(in.cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
	i, v, ok := reflect.Select(in.cases)
	if i == len(in.live) {
		return -1, v, false
	}
	return i, v, ok
}

func (in *input) drop(q *queue) {
	for i, l := range in.live {
		if l == q {
			in.live = append(in.live[:i], in.live[i+1:]...)
			return
		}
	}
}

// output fans one port out to every edge leaving it; on each edge the
// replica rotates over the queues it feeds.
type output struct {
	r     *replica
	edges []*outEdge
}

type outEdge struct {
	queues []*queue
	next   int
}

func (o *output) Send(ctx context.Context, item any) error {
	r := o.r
	t := r.enter(stateBlocked, r.isSource())
	var err error
	for _, e := range o.edges {
		q := e.queues[e.next]
		e.next = (e.next + 1) % len(e.queues)
		if err = q.send(ctx, item); err != nil {
			break
		}
	}
	r.leave(t, &r.blocked, false)
	if err == nil {
		r.itemsOut.Add(1)
	}
	return err
}
