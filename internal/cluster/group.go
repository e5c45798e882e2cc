package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// A group across workers is hosted by the coordinator: each member's
// collective is a request on dflow.r.RUN.grp.STAGE, answered when every
// member still present has arrived; a leave is a request too, and can
// itself complete the round the others wait in (the uneven-ends rule, as
// in process).
//
// A request is one op byte and the replica as a uint32. An all-reduce
// sends its vector in parts that each fit in a message (a model's
// gradients are megabytes; a NATS message is 1 MiB by default): each part
// adds the vector's total length and the part's offset as uint32s, then
// its values as little-endian float32s; the last part (offset + values =
// total) is the member's arrival. An answer is a status byte (0 ok, 1
// error), then the error's text, or: for a part before the last, nothing
// more; for an arrival, the contributors and the round as uint32s, then
// the sum when it fits in the answer (or nothing: the member then fetches
// it in parts, opFetch with the round, an offset and a count); for a
// leave, 1 as a uint32 when the member was the group's last.
const (
	opBarrier byte = iota
	opReduce
	opLeave
	opFetch
)

// groupHost is the coordinator's side of one stage's group.
type groupHost struct {
	mu      sync.Mutex
	stage   string
	members int
	left    []bool
	// the round in progress: open once a member has sent anything for it
	open    bool
	waiting []*nats.Msg
	reduce  bool
	sum     []float64
	n       int
	err     string
	round   uint32
	// partial holds, by member, the parts of a vector not yet whole: a
	// member's vector joins the sum only with its last part, so that one
	// that leaves (or is cancelled) mid-vector adds nothing
	partial map[int][]float32
	// last is the sum of the round completed last, as float32s, kept for
	// members fetching it in parts until the next round completes (which
	// needs every member present, so none is still fetching this one)
	last []float32
	// maxAnswer is the largest sum answered inline, in values
	maxAnswer int
}

func newGroupHost(stage string, replicas int, maxPayload int64) *groupHost {
	return &groupHost{stage: stage, members: replicas, left: make([]bool, replicas), maxAnswer: partValues(maxPayload)}
}

// partValues is how many float32s a message of maxPayload bytes carries
// besides a group request's or answer's header.
func partValues(maxPayload int64) int {
	return max(int(maxPayload-256)/4, 1)
}

func (h *groupHost) handle(m *nats.Msg) {
	if len(m.Data) < 5 {
		m.Respond(errAnswer("malformed group request"))
		return
	}
	op, replica := m.Data[0], int(binary.LittleEndian.Uint32(m.Data[1:5]))
	h.mu.Lock()
	defer h.mu.Unlock()
	if replica >= len(h.left) {
		m.Respond(errAnswer(fmt.Sprintf("replica %d: no such member", replica)))
		return
	}
	switch op {
	case opLeave:
		ans := []byte{0, 0, 0, 0, 0}
		if h.leaveLocked(replica) {
			ans[1] = 1 // the last member: the group's once-per-run work is its
		}
		m.Respond(ans)
		return
	case opFetch:
		h.fetchLocked(m)
		return
	}
	if h.left[replica] {
		m.Respond(errAnswer("replica has left its group"))
		return
	}
	if !h.open {
		h.open, h.reduce, h.n, h.err, h.sum = true, op == opReduce, 0, "", nil
	}
	if op == opReduce {
		if !h.addPartLocked(replica, m.Data[5:]) {
			m.Respond([]byte{0}) // a part before the last: the member sends the next
			return
		}
	} else if h.reduce {
		h.err = "replicas mixed Barrier and AllReduceSum in one step"
	}
	h.waiting = append(h.waiting, m)
	h.completeLocked()
}

// addPartLocked takes one part of a member's vector and reports whether
// it was the member's last: then the whole vector joins the round's sum.
func (h *groupHost) addPartLocked(replica int, b []byte) (last bool) {
	if len(b) < 8 {
		h.err = "malformed all-reduce part"
		return true
	}
	total, off := int(binary.LittleEndian.Uint32(b)), int(binary.LittleEndian.Uint32(b[4:]))
	vec := b[8:]
	n := len(vec) / 4
	switch {
	case !h.reduce:
		h.err = "replicas mixed Barrier and AllReduceSum in one step"
	case h.sum == nil:
		h.sum = make([]float64, total)
	case total != len(h.sum):
		h.err = fmt.Sprintf("AllReduceSum buffers differ in length: %d and %d", total, len(h.sum))
	}
	if off+n > total {
		h.err = "malformed all-reduce part: past the vector's end"
	}
	if h.err != "" {
		delete(h.partial, replica)
		return off+n >= total
	}
	if h.partial == nil {
		h.partial = map[int][]float32{}
	}
	p := h.partial[replica]
	if p == nil {
		p = make([]float32, total)
		h.partial[replica] = p
	}
	decode(p[off:off+n], vec)
	if off+n < total {
		return false
	}
	for i, v := range p {
		h.sum[i] += float64(v)
	}
	delete(h.partial, replica)
	h.n++
	return true
}

// fetchLocked answers a part of the last round's sum.
func (h *groupHost) fetchLocked(m *nats.Msg) {
	if len(m.Data) < 17 {
		m.Respond(errAnswer("malformed fetch"))
		return
	}
	round := binary.LittleEndian.Uint32(m.Data[5:])
	off, n := int(binary.LittleEndian.Uint32(m.Data[9:])), int(binary.LittleEndian.Uint32(m.Data[13:]))
	if round != h.round || off+n > len(h.last) {
		m.Respond(errAnswer(fmt.Sprintf("no sum of round %d at %d+%d (the last round is %d, of %d values)", round, off, n, h.round, len(h.last))))
		return
	}
	ans := make([]byte, 1+4*n)
	for i, v := range h.last[off : off+n] {
		binary.LittleEndian.PutUint32(ans[1+4*i:], math.Float32bits(v))
	}
	m.Respond(ans)
}

// leaveLocked takes replica out and reports whether it was the last
// member present (false when it had left already).
func (h *groupHost) leaveLocked(replica int) (last bool) {
	if h.left[replica] {
		return false
	}
	h.left[replica] = true
	h.members--
	delete(h.partial, replica) // a vector it did not finish adds nothing
	if len(h.waiting) == 0 && len(h.partial) == 0 {
		h.open, h.sum = false, nil // nothing of the round is left
	}
	h.completeLocked()
	return h.members == 0
}

// leave takes a replica of a lost worker out.
func (h *groupHost) leave(replica int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leaveLocked(replica)
}

func (h *groupHost) completeLocked() {
	if len(h.waiting) == 0 || len(h.waiting) < h.members {
		return
	}
	var ans []byte
	if h.err != "" {
		ans = errAnswer(h.err)
	} else {
		h.round++
		h.last = make([]float32, len(h.sum))
		for i, v := range h.sum {
			h.last[i] = float32(v)
		}
		inline := len(h.last) <= h.maxAnswer
		ans = make([]byte, 9, 9+4*len(h.last))
		binary.LittleEndian.PutUint32(ans[1:], uint32(h.n))
		binary.LittleEndian.PutUint32(ans[5:], h.round)
		if inline {
			ans = ans[:9+4*len(h.last)]
			for i, v := range h.last {
				binary.LittleEndian.PutUint32(ans[9+4*i:], math.Float32bits(v))
			}
		}
	}
	for _, w := range h.waiting {
		w.Respond(ans)
	}
	h.waiting, h.open, h.sum = nil, false, nil
}

func errAnswer(s string) []byte { return append([]byte{1}, s...) }

// remoteGroup is a worker's side: the engine's RemoteGroup.
type remoteGroup struct {
	nc      *nats.Conn
	subject string
}

func (g *remoteGroup) call(ctx context.Context, op byte, replica int, args ...uint32) ([]byte, error) {
	req := make([]byte, 5+4*len(args))
	req[0] = op
	binary.LittleEndian.PutUint32(req[1:], uint32(replica))
	for i, a := range args {
		binary.LittleEndian.PutUint32(req[5+4*i:], a)
	}
	return g.request(ctx, req)
}

func (g *remoteGroup) request(ctx context.Context, req []byte) ([]byte, error) {
	m, err := g.nc.RequestWithContext(ctx, g.subject, req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("group across workers: %w", err)
	}
	if len(m.Data) < 1 || m.Data[0] != 0 {
		if len(m.Data) > 0 {
			return nil, errors.New(string(m.Data[1:]))
		}
		return nil, errors.New("group across workers: empty answer")
	}
	return m.Data, nil
}

// reduce sends f in parts, the last of which waits for the round, and
// stores the round's sum into f: from the answer, or fetched in parts.
func (g *remoteGroup) reduce(ctx context.Context, replica int, f []float32) (int, error) {
	per := partValues(g.nc.MaxPayload())
	var ans []byte
	for off := 0; ; off += per {
		part := f[off:min(off+per, len(f))]
		req := make([]byte, 13+4*len(part))
		req[0] = opReduce
		binary.LittleEndian.PutUint32(req[1:], uint32(replica))
		binary.LittleEndian.PutUint32(req[5:], uint32(len(f)))
		binary.LittleEndian.PutUint32(req[9:], uint32(off))
		for i, v := range part {
			binary.LittleEndian.PutUint32(req[13+4*i:], math.Float32bits(v))
		}
		a, err := g.request(ctx, req)
		if err != nil {
			return 0, err
		}
		if off+len(part) >= len(f) {
			ans = a
			break
		}
	}
	if len(ans) < 9 {
		return 0, fmt.Errorf("AllReduceSum across workers: an answer of %d bytes", len(ans))
	}
	n, round := int(binary.LittleEndian.Uint32(ans[1:])), binary.LittleEndian.Uint32(ans[5:])
	if len(ans) == 9+4*len(f) {
		decode(f, ans[9:])
		return n, nil
	}
	for off := 0; off < len(f); off += per {
		k := min(per, len(f)-off)
		a, err := g.call(ctx, opFetch, replica, round, uint32(off), uint32(k))
		if err != nil {
			return 0, err
		}
		if len(a) != 1+4*k {
			return 0, fmt.Errorf("AllReduceSum across workers: a part of %d bytes for %d values", len(a)-1, k)
		}
		decode(f[off:off+k], a[1:])
	}
	return n, nil
}

// decode reads little-endian float32s into f.
func decode(f []float32, b []byte) {
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

func (g *remoteGroup) Barrier(ctx context.Context, replica int) error {
	_, err := g.call(ctx, opBarrier, replica)
	return err
}

func (g *remoteGroup) AllReduce(ctx context.Context, replica int, x nodes.Reducible) (int, error) {
	f, ok := x.(nodes.Floats)
	var back func()
	if !ok {
		hc, ok := x.(nodes.HostCopier)
		if !ok {
			return 0, fmt.Errorf("AllReduce across workers sums host vectors; a %T cannot be copied to the host: place the stage's replicas on one worker (dflow run --place STAGE=WORKER)", x)
		}
		// A backend's buffer (drafter_train's gradients) crosses to the
		// host once, is summed there across workers, and back once.
		f = make([]float32, x.Len())
		hc.CopyToHost(f)
		back = func() { hc.CopyFromHost(f) }
	}
	n, err := g.reduce(ctx, replica, f)
	if err != nil {
		return 0, err
	}
	if back != nil {
		back()
	}
	return n, nil
}

func (g *remoteGroup) Leave(ctx context.Context, replica int) (bool, error) {
	ans, err := g.call(ctx, opLeave, replica)
	if err != nil {
		return false, err
	}
	return len(ans) >= 5 && binary.LittleEndian.Uint32(ans[1:]) == 1, nil
}
