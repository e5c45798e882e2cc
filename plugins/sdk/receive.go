package sdk

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// receiver takes dflow's messages off the stream (receive) for the
// node's inputs, its output credit and the pools.
type receiver struct {
	dead chan struct{} // closed when receive has returned: the stream ended or broke

	errMu sync.Mutex
	err   error // why receiving stopped, when the stream did not simply end
}

func (rc *receiver) init() { rc.dead = make(chan struct{}) }

func (rc *receiver) fail(err error) {
	rc.errMu.Lock()
	defer rc.errMu.Unlock()
	if rc.err == nil {
		rc.err = err
	}
}

func (rc *receiver) failed() error {
	rc.errMu.Lock()
	defer rc.errMu.Unlock()
	return rc.err
}

// receive is the receiver's goroutine (see session): it reads dflow's
// messages, items (reassembled and decoded) to the inputs, end-of-input,
// credit, releases, until the stream ends or a message is wrong (then it
// cancels the node's context). It lets go of the pools as it returns.
func (s *session) receive(cancel context.CancelFunc) {
	defer s.let()
	defer close(s.dead)
	var items wire.Assembler
	for {
		m, err := s.stream.Recv()
		if err != nil {
			cancel()
			return
		}
		if err := s.apply(m, &items); err != nil {
			s.fail(err)
			cancel()
			return
		}
	}
}

// apply applies one message from dflow.
func (s *session) apply(m *proto.Message, items *wire.Assembler) error {
	var whole []*proto.Item // items complete with this message
	switch v := m.Msg.(type) {
	case *proto.Message_Item:
		b, done := items.Add(v.Item)
		if !done {
			s.received1()
			return nil
		}
		v.Item.Payload = b
		whole = []*proto.Item{v.Item}
	case *proto.Message_Batch:
		whole = v.Batch.Items
	case *proto.Message_Eof:
		if in := s.inputs[v.Eof.Port]; in != nil {
			in.ended.Store(true)
			close(in.ch)
		}
	case *proto.Message_Release:
		if err := s.release(v.Release.Refs); err != nil {
			return err
		}
	case *proto.Message_Credit:
		out := s.outputs[v.Credit.Port]
		if out == nil || !out.held {
			return fmt.Errorf("sdk: credit from dflow on %q, which is not an output port held to credit", v.Credit.Port)
		}
		out.credit.Grant(v.Credit.N)
	case *proto.Message_CollectiveResult:
		if s.group == nil {
			return fmt.Errorf("sdk: a collective's result from dflow, for a replica that has no group")
		}
		s.group.result(v.CollectiveResult)
	}
	for _, it := range whole {
		if err := s.deliver(it); err != nil {
			return err
		}
	}
	s.received1()
	return nil
}

// deliver decodes a whole item and puts it in its input port.
func (s *session) deliver(it *proto.Item) error {
	var held *wire.Held
	var item any
	var err error
	size := int64(len(it.Payload))
	if it.Ref != nil {
		held, err = s.received(it.Ref)
		if err == nil {
			size = it.Ref.Length
			// A view of dflow's pool, read-only: valid until the
			// node's next Recv on the port (see Recv).
			item, err = wire.Decode(it.Type, s.pools.In.Bytes(it.Ref.Offset, it.Ref.Length))
		}
	} else {
		item, err = wire.Decode(it.Type, it.Payload)
	}
	in := s.inputs[it.Port]
	if err == nil && in == nil {
		err = fmt.Errorf("sdk: an item for input port %q, which the node does not have", it.Port)
	}
	if err != nil {
		return err
	}
	if !in.w.Arrived(size) {
		return fmt.Errorf("sdk: dflow sent more items on %q than the plugin granted it credit for", it.Port)
	}
	in.ch <- inItem{item, size, held} // never full: the credit bounds what comes
	return nil
}

// input is a node's input port.
type input struct {
	s     *session
	port  string
	ch    chan inItem
	ended atomic.Bool // end of input received (set before ch is closed)
	w     wire.Window
	cur   *wire.Held // the region of the item by reference the node last received here
	// asked: credit goes one item at a time, as the node asks for one (a
	// kind that restores: the item dflow holds in hand is then the one the
	// node trains in its group's step, which settles it at that step's
	// save)
	asked bool
}

// inItem is an item received for the node, with its payload's size, and
// its region when it came by reference.
type inItem struct {
	item any
	size int64
	held *wire.Held
}

// Recv returns the port's next item. An item that came by reference
// (shared memory) is a view of dflow's pool: it is valid until the node's
// next Recv on this port, unless the node sends it (or an item whose
// bytes lie within it) on, when it passes on with the Send. A node that
// keeps an item longer copies it (Detach).
func (in *input) Recv(ctx context.Context) (any, error) {
	in.s.times.next()
	if in.cur != nil {
		in.s.drop(in.cur)
		in.cur = nil
	}
	select {
	case it, ok := <-in.ch:
		return in.took(it, ok)
	default:
	}
	if in.asked && !in.ended.Load() && in.w.Lent() == 0 {
		// credit for the one item the node asks for (a kind that
		// restores: session.restores), unless an earlier ask's is still
		// out (its Recv ended before the item came)
		in.w.Lend()
		if err := in.s.send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: 1, Port: in.port}}}); err != nil {
			return nil, err
		}
	}
	defer in.s.block(func() bool { return len(in.ch) == 0 && !in.ended.Load() })()
	defer in.s.times.wait(waitIdle)()
	select {
	case it, ok := <-in.ch:
		return in.took(it, ok)
	case <-ctx.Done():
		in.s.times.none()
		return nil, ctx.Err()
	}
}

func (in *input) took(it inItem, ok bool) (any, error) {
	if !ok {
		in.s.times.none()
		return nil, io.EOF
	}
	// The item is taken: credit for one more, which the sender grants
	// (several in one message when items come fast), or, asked for one
	// at a time, the next Recv asks.
	if in.asked {
		in.w.TakenAsked(it.size)
	} else {
		in.w.Taken(it.size)
	}
	in.cur = it.held
	if it.held != nil {
		in.s.pools.In.Give(it.held)
	}
	in.s.wake()
	return it.item, nil
}

// grant sends the credit the node's Recvs on this port owe, as much of it
// as the port's byte budget allows, in one message (from sendItems).
func (in *input) grant() error {
	n := in.w.Grant()
	if n == 0 {
		return nil // granted as the node takes what is held
	}
	return in.s.send(&proto.Message{Msg: &proto.Message_Credit{Credit: &proto.Credit{N: n, Port: in.port}}})
}
