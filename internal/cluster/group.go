package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// A group across workers is hosted by the coordinator: each member's
// collective is a request on dflow.r.RUN.grp.STAGE, answered when every
// member still present has arrived; a leave is a request too, and can
// itself complete the round the others wait in (the uneven-ends rule, as
// in process). A request is one op byte, the replica as a uint32, then for
// an all-reduce the vector as little-endian float32s. An answer is a
// status byte (0 ok, 1 error), then the contributors as a uint32 and the
// sum, or the error's text.
const (
	opBarrier byte = iota
	opReduce
	opLeave
)

// groupHost is the coordinator's side of one stage's group.
type groupHost struct {
	mu      sync.Mutex
	stage   string
	members int
	left    []bool
	waiting []*nats.Msg
	reduce  bool
	sum     []float64
	n       int
	err     string
}

func newGroupHost(stage string, replicas int) *groupHost {
	return &groupHost{stage: stage, members: replicas, left: make([]bool, replicas)}
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
	if op == opLeave {
		h.leaveLocked(replica)
		m.Respond([]byte{0, 0, 0, 0, 0})
		return
	}
	if h.left[replica] {
		m.Respond(errAnswer("replica has left its group"))
		return
	}
	vec := m.Data[5:]
	if len(h.waiting) == 0 {
		h.reduce, h.n, h.err, h.sum = op == opReduce, 0, "", nil
		if h.reduce {
			h.sum = make([]float64, len(vec)/4)
		}
	}
	switch {
	case (op == opReduce) != h.reduce:
		h.err = "replicas mixed Barrier and AllReduceSum in one step"
	case h.reduce && len(vec)/4 != len(h.sum):
		h.err = fmt.Sprintf("AllReduceSum buffers differ in length: %d and %d", len(vec)/4, len(h.sum))
	case h.reduce:
		for i := range h.sum {
			h.sum[i] += float64(math.Float32frombits(binary.LittleEndian.Uint32(vec[4*i:])))
		}
		h.n++
	}
	h.waiting = append(h.waiting, m)
	h.completeLocked()
}

func (h *groupHost) leaveLocked(replica int) {
	if h.left[replica] {
		return
	}
	h.left[replica] = true
	h.members--
	h.completeLocked()
}

// leaveAll takes the replicas of a lost worker out.
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
		ans = make([]byte, 5+4*len(h.sum))
		binary.LittleEndian.PutUint32(ans[1:], uint32(h.n))
		for i, v := range h.sum {
			binary.LittleEndian.PutUint32(ans[5+4*i:], math.Float32bits(float32(v)))
		}
	}
	for _, w := range h.waiting {
		w.Respond(ans)
	}
	h.waiting = nil
}

func errAnswer(s string) []byte { return append([]byte{1}, s...) }

// remoteGroup is a worker's side: the engine's RemoteGroup.
type remoteGroup struct {
	nc      *nats.Conn
	subject string
}

func (g *remoteGroup) call(ctx context.Context, op byte, replica int, vec []float32) ([]byte, error) {
	req := make([]byte, 5+4*len(vec))
	req[0] = op
	binary.LittleEndian.PutUint32(req[1:], uint32(replica))
	for i, v := range vec {
		binary.LittleEndian.PutUint32(req[5+4*i:], math.Float32bits(v))
	}
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

func (g *remoteGroup) Barrier(ctx context.Context, replica int) error {
	_, err := g.call(ctx, opBarrier, replica, nil)
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
	ans, err := g.call(ctx, opReduce, replica, f)
	if err != nil {
		return 0, err
	}
	if len(ans) != 5+4*len(f) {
		return 0, fmt.Errorf("AllReduceSum across workers: answer of %d bytes for %d values", len(ans), len(f))
	}
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(ans[5+4*i:]))
	}
	if back != nil {
		back()
	}
	return int(binary.LittleEndian.Uint32(ans[1:])), nil
}

func (g *remoteGroup) Leave(replica int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g.call(ctx, opLeave, replica, nil)
}
