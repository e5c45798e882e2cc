package sdk

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// shm is a session's shared memory: the pools dflow offered
// (Start.pools) as this process mapped them, nil without; items of
// threshold bytes or more go by reference.
//
// Both the handler (sending, through the node's Sends and the sender) and
// the receiver (items by reference, Release) use the pools, and the
// receiver may outlive the handler (session): users counts the two, and
// the last to let go unmaps them, so that no goroutine reads a pool after
// it is unmapped.
type shm struct {
	pools     *wire.Pools
	threshold int64
	users     atomic.Int32
	closed    func() // for tests: called once the pools are unmapped
}

// attach maps the pools dflow offered and says how that went (Attached);
// the handler holds them from then on (let).
func (s *session) attach(m *proto.Pools) *proto.Attached {
	att := &proto.Attached{}
	if !wire.SharedMemoryEnabled() {
		att.Error = "shared memory is off in this plugin (DFLOW_PLUGIN_SHM=off)"
	} else if ps, err := wire.OpenPools(m); err != nil {
		att.Error = err.Error()
	} else {
		s.pools, s.threshold = ps, max(m.Threshold, 1)
		s.users.Store(1)
	}
	return att
}

// use adds a user of the pools (the receiver), if there are pools.
func (sh *shm) use() {
	if sh.pools != nil {
		sh.users.Add(1)
	}
}

// let lets go of the pools; the last user unmaps them.
func (sh *shm) let() {
	if sh.pools != nil && sh.users.Add(-1) == 0 {
		sh.pools.Close()
		if sh.closed != nil {
			sh.closed()
		}
	}
}

// received checks an input item by reference and records the node's hold
// on its region.
func (s *session) received(ref *proto.Ref) (*wire.Held, error) {
	if s.pools == nil || ref.Pool != 0 {
		return nil, fmt.Errorf("sdk: an item by reference to pool %d, which dflow does not send from", ref.Pool)
	}
	if err := s.pools.In.Check(ref); err != nil {
		return nil, fmt.Errorf("sdk: %w", err)
	}
	return s.pools.In.Track(ref.Offset, ref.Length), nil
}

// release frees regions of pool 1 that dflow is done with.
func (s *session) release(refs []*proto.Ref) error {
	for _, ref := range refs {
		if s.pools == nil || ref.Pool != 1 {
			return fmt.Errorf("sdk: dflow released pool %d's region at %d, which the plugin did not send", ref.Pool, ref.Offset)
		}
		if err := s.pools.Out.Free(ref.Offset); err != nil {
			return err
		}
	}
	return nil
}

// drop drops a hold on a received region, and releases it to dflow with
// the last.
func (s *session) drop(h *wire.Held) {
	if s.pools.In.Drop(h) {
		// A stream that broke shows elsewhere.
		_ = s.send(&proto.Message{Msg: &proto.Message_Release{Release: &proto.Release{Refs: []*proto.Ref{{Pool: 0, Offset: h.Off, Length: h.Len}}}}})
	}
}

// prepare encodes an item the node sends, and, with pools, sends a large
// one by reference: where it already lies (an item received, sent on),
// holding its region until the reference is on the stream; otherwise
// copied once into a region of the plugin's pool. It goes as bytes when
// it is small or no region is free.
func (s *session) prepare(port string, item any) (outItem, error) {
	e, err := wire.EncodeItem(item)
	if err != nil {
		return outItem{}, err
	}
	it := outItem{port: port, enc: e}
	size := int64(e.Size)
	if s.pools == nil || size < s.threshold {
		return it, nil
	}
	if off, ok := s.pools.In.Contiguous(e.Pieces, size); ok {
		// In no region the node holds: an item kept past its lifetime,
		// whose region rests, is free, or holds a later item dflow sent
		// that the node has not received yet.
		h := s.pools.In.Containing(off, size)
		if h == nil || !s.pools.In.Given(h) {
			return outItem{}, errKept
		}
		s.pools.In.Hold(h)
		it.ref = &proto.Ref{Pool: 0, Offset: off, Length: size}
		it.after = func() { s.drop(h) }
		return it, nil
	}
	if h, ok := s.pools.Out.Write(e.Pieces, size, nil, e.Type); ok {
		it.ref = &proto.Ref{Pool: 1, Offset: h.Off, Length: size}
	}
	return it, nil
}

var errKept = errors.New("the item lies in the memory of an item received by reference that the node no longer holds (such an item is valid until the next Recv on its port: copy what you keep, sdk.Detach)")

// discard lets go of the region of an item that will not be sent.
func (s *session) discard(it outItem) {
	if it.after != nil {
		it.after()
	} else if it.ref != nil && it.ref.Pool == 1 {
		s.pools.Out.Free(it.ref.Offset)
	}
}
