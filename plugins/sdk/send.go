package sdk

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// sender puts what the node sends on the stream. Every message goes
// through send, one at a time (mu); the node's items go through outq to
// sendItems, one goroutine, so that one item's chunks never interleave
// with another's.
type sender struct {
	mu   sync.Mutex    // one message at a time on the stream
	outq chan outItem  // items the node sent, for sendItems; closed by run when the node has returned
	sent chan struct{} // closed when sendItems has returned
	kick chan struct{} // wakes sendItems to grant the input credit owed
	look chan struct{} // wakes sendItems to look at blocked calls (Waiting)

	errMu sync.Mutex
	err   error // why sending stopped
}

func (sn *sender) init() {
	sn.outq = make(chan outItem, outputWindow)
	sn.sent = make(chan struct{})
	sn.kick = make(chan struct{}, 1)
	sn.look = make(chan struct{}, 1)
}

// outItem is an item a node sent on a port, encoded, or by reference
// (ref), with what to do once it is on the stream (after: drop the hold on
// the received region it lies in).
type outItem struct {
	port  string
	enc   wire.Encoded
	ref   *proto.Ref
	after func()
}

func (s *session) send(m *proto.Message) error {
	s.sender.mu.Lock()
	defer s.sender.mu.Unlock()
	return s.stream.Send(m)
}

func (sn *sender) sendFailed() error {
	sn.errMu.Lock()
	defer sn.errMu.Unlock()
	return sn.err
}

// wake has sendItems grant the credit the node's Recvs owe.
func (sn *sender) wake() {
	select {
	case sn.kick <- struct{}{}:
	default:
	}
}

// lookAgain has sendItems look at the blocked calls again (for Waiting)
// without granting credit: a grant per look would split what is owed
// into one message per item.
func (sn *sender) lookAgain() {
	select {
	case sn.look <- struct{}{}:
	default:
	}
}

// sendItems is the sender's goroutine (see session): it puts the items
// the node sends on the stream, in order: with each it takes the others
// already waiting, to go as one Batch when dflow takes them
// (Start.batches). It also grants the input credit the node's Recvs owe,
// all that is owed on a port in one message: with credit coming back a
// few items at a time, dflow batches its items too. With Start.times it
// says Times every timesEvery while the node's times change (times.go).
// It returns when run
// closes outq, or when the stream fails (then it lets the node's Sends
// through, failing, until outq is closed).
func (s *session) sendItems() {
	defer close(s.sent)
	b := wire.Batcher{Send: s.send, Batches: s.start.Batches}
	var after []func()
	add := func(it outItem) error {
		if it.after != nil {
			after = append(after, it.after)
		}
		if it.ref != nil {
			return b.AddRef(it.port, it.enc.Type, it.ref)
		}
		return b.AddEncoded(it.port, it.enc)
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
		for _, in := range s.inputs {
			if err := in.grant(); err != nil {
				return err
			}
		}
		return nil
	}
	var tick <-chan time.Time // Times, every timesEvery while anything changes
	if s.times.on {
		t := time.NewTicker(timesEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		var err error
		select {
		case <-tick:
			err = s.sayTimes(false)
		case <-s.kick:
			err = grant()
		case <-s.look:
		case it, ok := <-s.outq:
			if !ok {
				return
			}
			err = add(it)
		more:
			for n := 1; err == nil && b.Batches && n < wire.MaxBatchItems; n++ {
				select {
				case next, ok := <-s.outq:
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
			err = s.sayWaiting()
		}
		if err != nil {
			s.sender.errMu.Lock()
			s.sender.err = err
			s.sender.errMu.Unlock()
			for range s.outq { // let the node's Sends through; they fail from now on
			}
			return
		}
	}
}

// output is a node's output port.
type output struct {
	s      *session
	port   string
	typ    string // the port's type: its items must be of the Go type it means
	held   bool   // to dflow's credit on this port (Start.output_credit)
	credit *wire.Credit
}

// Send hands the item to the replica's sender (sendItems), which streams
// it to dflow. Held to dflow's credit, it first waits for credit on its
// port, so that a full edge holds back this port's Sends and no other's.
// It also waits while outputWindow items are queued (without credit, the
// only wait: gRPC's flow control holds the sender while dflow's side of
// any edge is full, and so every Send). A failure of the stream shows at
// the next Send, and in Done.
func (o *output) Send(ctx context.Context, item any) error {
	s := o.s
	if err := s.sendFailed(); err != nil {
		return err
	}
	if err := wire.CheckPortItem(o.typ, item); err != nil {
		return fmt.Errorf("sdk: output %q: %w", o.port, err)
	}
	if len(s.inputs) == 0 {
		s.times.next() // a source's Sends delimit its items
	}
	if o.held && !o.credit.TryTake() {
		unblock := s.block(func() bool { return o.credit.Available() <= 0 })
		waited := s.times.wait(waitBlocked)
		err := o.credit.Take(ctx, s.dead)
		waited()
		unblock()
		if err != nil {
			return err
		}
	}
	it, err := s.prepare(o.port, item)
	if err != nil {
		return fmt.Errorf("sdk: output %q: %w", o.port, err)
	}
	if s.times.on {
		select {
		case s.outq <- it:
			return nil
		default: // outq is full: a wait, timed
			defer s.times.wait(waitBlocked)()
		}
	}
	select {
	case s.outq <- it:
		return nil
	case <-s.sent:
		s.discard(it)
		return s.sendFailed()
	case <-ctx.Done():
		s.discard(it)
		return ctx.Err()
	}
}
