package group

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// Member is a worker's side: the engine's RemoteGroup.
type Member struct {
	NC      *nats.Conn
	Subject string // the group's subject: dflow.r.RUN.grp.STAGE
	Share   string // the instance whose replicas these are
	Restart bool   // the share takes over lost replicas: Keep takes the group's state
	Lone    bool   // a group of one replica: its sum is its own vector
	// hooks into the share (nil: none, in tests): the id of the item a
	// replica has in hand, settling what the share's replicas have
	// finished, the items a restart drops if they come back, and, where
	// the group saves: holding a replica's inputs until a save, the
	// round a replica's item in hand was trained in, and the round the
	// group's last save holds
	Held    func(replica int) string
	Settle  func() error
	Skip    func(replica int, ids []string)
	Hold    func(replica int)
	Stepped func(replica int, round uint32)
	Durable func(replica int, round uint32)

	mu      sync.Mutex
	states  map[int]nodes.State // what each replica gave Keep
	saving  map[int]bool        // the replicas that called Saves
	joining map[int]bool        // slots a move started: Keep takes the group's state (Joins)
}

// Joins notes that replica, a rebalance's spare slot, starts now: it
// takes the group's state over at its Keep, as a restart does (package
// engine's Joiner).
func (g *Member) Joins(replica int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.joining == nil {
		g.joining = map[int]bool{}
	}
	g.joining[replica] = true
}

func (g *Member) call(ctx context.Context, op byte, replica int, args ...uint32) ([]byte, error) {
	req := make([]byte, 5+4*len(args))
	req[0] = op
	binary.LittleEndian.PutUint32(req[1:], uint32(replica))
	for i, a := range args {
		binary.LittleEndian.PutUint32(req[5+4*i:], a)
	}
	return g.request(ctx, req)
}

// request sends req and returns its answer; asked first for its state
// (a restart of another member is due), the replica sends it, then asks
// again.
func (g *Member) request(ctx context.Context, req []byte) ([]byte, error) {
	return g.requestAs(ctx, req, "")
}

// requestAs is request, of a collective's arrival (or a part of one)
// with id.
func (g *Member) requestAs(ctx context.Context, req []byte, id string) ([]byte, error) {
	replica := int(binary.LittleEndian.Uint32(req[1:]))
	msg := &nats.Msg{Subject: g.Subject, Data: req, Header: nats.Header{}}
	msg.Header.Set(HdrShare, g.Share)
	if id != "" {
		msg.Header.Set(HdrArrival, id)
	}
	if g.Held != nil {
		if id := g.Held(replica); id != "" {
			msg.Header.Set(HdrHeld, id)
		}
	}
	for {
		m, err := g.NC.RequestMsgWithContext(ctx, msg)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("group across workers: %w", err)
		}
		if d := m.Header.Get(HdrSaved); d != "" && g.Durable != nil {
			if round, err := strconv.ParseUint(d, 10, 32); err == nil {
				g.Durable(replica, uint32(round))
			}
		}
		if len(m.Data) == 5 && m.Data[0] == 2 {
			if err := g.donate(ctx, replica, int(binary.LittleEndian.Uint32(m.Data[1:]))); err != nil {
				return nil, &donateError{err}
			}
			continue
		}
		if len(m.Data) < 1 || m.Data[0] != 0 {
			if len(m.Data) > 0 {
				return nil, errors.New(string(m.Data[1:]))
			}
			return nil, errors.New("group across workers: empty answer")
		}
		return m.Data, nil
	}
}

// donate sends replica's state, for the restart of member to.
func (g *Member) donate(ctx context.Context, replica, to int) error {
	g.mu.Lock()
	st := g.states[replica]
	g.mu.Unlock()
	if st == nil {
		return fmt.Errorf("replica %d was asked for the group's state, for the restart of replica %d, and its node gave none (nodes.Group.Keep)", replica, to)
	}
	b, err := st.MarshalBinary()
	if err != nil {
		return fmt.Errorf("replica %d: the group's state, for the restart of replica %d: %w", replica, to, err)
	}
	per := int(g.NC.MaxPayload() - 256)
	for off := 0; off == 0 || off < len(b); off += per {
		part := b[off:min(off+per, len(b))]
		req := make([]byte, 17, 17+len(part))
		req[0] = OpState
		for i, v := range []int{replica, to, len(b), off} {
			binary.LittleEndian.PutUint32(req[1+4*i:], uint32(v))
		}
		if _, err := g.request(ctx, append(req, part...)); err != nil {
			return err
		}
		if len(b) == 0 {
			break
		}
	}
	return nil
}

// Keep records replica's state; on a restart, it first takes the group's
// state over (from the member that was asked for it), and the item of
// the lost member's last completed step is dropped if it comes back.
func (g *Member) Keep(ctx context.Context, replica int, st nodes.State) error {
	g.mu.Lock()
	if g.states == nil {
		g.states = map[int]nodes.State{}
	}
	g.states[replica] = st
	joins := g.joining[replica]
	delete(g.joining, replica)
	g.mu.Unlock()
	if !g.Restart && !joins {
		return nil
	}
	ans, err := g.call(ctx, OpJoin, replica)
	if err != nil {
		return err
	}
	if len(ans) < 6 {
		return fmt.Errorf("group across workers: a join answer of %d bytes", len(ans))
	}
	if ids := string(ans[6:]); ids != "" && g.Skip != nil {
		g.Skip(replica, strings.Split(ids, "\n"))
	}
	switch ans[1] {
	case 0:
		return nil // it had left the group: nothing to take
	case 2: // lost whole: every member restores the last save
		return &nodes.Restore{Step: int(int32(binary.LittleEndian.Uint32(ans[2:])))}
	}
	b := make([]byte, binary.LittleEndian.Uint32(ans[2:]))
	per := int(g.NC.MaxPayload() - 256)
	for off := 0; off < len(b); off += per {
		k := min(per, len(b)-off)
		a, err := g.call(ctx, OpStateFetch, replica, uint32(off), uint32(k))
		if err != nil {
			return err
		}
		if len(a) != 1+k {
			return fmt.Errorf("group across workers: a state part of %d bytes for %d", len(a)-1, k)
		}
		copy(b[off:], a[1:])
	}
	if err := st.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("replica %d: the group's state, taken over: %w", replica, err)
	}
	return nil
}

// arrive settles what the share's replicas have finished before a
// replica whose state moves arrives in a step: the item of its step
// before is acked, so only the item of its last completed step can come
// back to a restart (which drops it: the host names it).
func (g *Member) arrive(replica int) error {
	g.mu.Lock()
	kept, saving := g.states[replica] != nil, g.saving[replica]
	g.mu.Unlock()
	if !kept || saving || g.Settle == nil {
		return nil // a saving replica's inputs wait for the save
	}
	return g.Settle()
}

// completed tells the replica's links the round of a collective's answer:
// the item in hand was trained in it.
func (g *Member) completed(replica int, ans []byte) {
	if len(ans) >= 9 && g.Stepped != nil {
		g.Stepped(replica, binary.LittleEndian.Uint32(ans[5:]))
	}
}

// Trained asks whether item id, which a replica of the stage here took
// again (a redelivery), was trained in a completed round by any member:
// then the replica drops it, and round is the round a save has yet to
// hold (0: one holds it). Asked only of a redelivered item: its first
// delivery's share was lost, or stopped keeping it from redelivery.
func (g *Member) Trained(ctx context.Context, replica int, id string) (round uint32, trained bool, err error) {
	req := make([]byte, 5, 5+len(id))
	req[0] = OpTrained
	binary.LittleEndian.PutUint32(req[1:], uint32(replica))
	ans, err := g.request(ctx, append(req, id...))
	if err != nil {
		return 0, false, err
	}
	if len(ans) < 6 {
		return 0, false, fmt.Errorf("group across workers: a trained answer of %d bytes", len(ans))
	}
	return binary.LittleEndian.Uint32(ans[2:]), ans[1] == 1, nil
}

// Saves says that replica's group saves: its inputs wait for a save.
func (g *Member) Saves(ctx context.Context, replica int) error {
	g.mu.Lock()
	if g.saving == nil {
		g.saving = map[int]bool{}
	}
	g.saving[replica] = true
	g.mu.Unlock()
	if g.Hold != nil {
		g.Hold(replica)
	}
	_, err := g.call(ctx, OpSaves, replica)
	return err
}

// Saved says that the group's state of the round completed last is saved.
func (g *Member) Saved(ctx context.Context, replica, step int) error {
	_, err := g.call(ctx, OpSaved, replica, uint32(int32(step)))
	return err
}

// done says that replica has returned, and waits until the group's final
// save holds what it trained (true), or ctx ends (false). A request the
// host could not take is asked again.
func (g *Member) Done(ctx context.Context, replica int) bool {
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		ans, err := g.call(ctx, OpDone, replica)
		if err == nil {
			return len(ans) >= 2 && ans[1] == 1
		}
		if !errors.Is(err, nats.ErrNoResponders) {
			return false // the share counted lost, or the run over
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}

// arrival sends req, a collective's arrival (or a part of one) with id,
// and returns its answer. Where the call fails first (ctx ends, a
// donation asked for first fails, the request fails), the arrival is
// withdrawn (OpWithdraw): the member is out of the round, as a member in
// process whose wait ends on its context is, and the call returns its
// error (ctx's, where ctx ended); unless the round had completed with
// that arrival: then its answer is the round's, which counts for this
// member as for the others. (Where the host answered an error, nothing
// of the arrival is left there: the withdrawal finds none, or is refused
// as the arrival was.)
func (g *Member) arrival(ctx context.Context, req []byte, id string) ([]byte, error) {
	ans, err := g.requestAs(ctx, req, id)
	if err == nil {
		return ans, nil
	}
	if a := g.withdraw(ctx, int(binary.LittleEndian.Uint32(req[1:])), id); len(a) >= 9 {
		return a, nil
	}
	return nil, err
}

// withdraw asks the host to take replica's arrival id out of the round
// under way, and returns the answer: 0 alone (withdrawn, or in no round),
// or the answer of the round that arrival completed. It is asked for a
// few seconds, whether ctx has ended or not; a request that fails leaves
// the arrival to the host's handling of a lost member (its share counted
// lost: its arrival dropped).
func (g *Member) withdraw(ctx context.Context, replica int, id string) []byte {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	req := make([]byte, 5, 5+len(id))
	req[0] = OpWithdraw
	binary.LittleEndian.PutUint32(req[1:], uint32(replica))
	ans, err := g.request(c, append(req, id...))
	if err != nil {
		return nil
	}
	return ans
}

// arrivalID is a new id for a collective's arrival: random, so that a
// member's restart elsewhere names none of its lost run's.
func arrivalID() string {
	return strconv.FormatUint(rand.Uint64(), 36)
}

// reduce sends f in parts, the last of which waits for the round, and
// stores the round's sum into f: from the answer, or fetched in parts.
func (g *Member) reduce(ctx context.Context, replica int, f []float32) (int, error) {
	return g.reduceAs(ctx, replica, f, arrivalID())
}

// reducePart is the request of replica's all-reduce of f that carries
// its values from off, at most per of them: the op, the replica, f's
// length, off, then the values. part is those values.
func reducePart(replica int, f []float32, off, per int) (req []byte, part []float32) {
	part = f[off:min(off+per, len(f))]
	req = make([]byte, 13+4*len(part))
	req[0] = OpReduce
	binary.LittleEndian.PutUint32(req[1:], uint32(replica))
	binary.LittleEndian.PutUint32(req[5:], uint32(len(f)))
	binary.LittleEndian.PutUint32(req[9:], uint32(off))
	Encode(req[13:], part)
	return req, part
}

// reduceAs is reduce, its arrival's id given.
func (g *Member) reduceAs(ctx context.Context, replica int, f []float32, id string) (int, error) {
	per := PartValues(g.NC.MaxPayload())
	var ans []byte
	for off := 0; ; off += per {
		req, part := reducePart(replica, f, off, per)
		a, err := g.arrival(ctx, req, id)
		if err != nil {
			return 0, err
		}
		if off+len(part) >= len(f) || len(a) >= 9 {
			ans = a // the last part's, or the round's that completed as ctx ended
			break
		}
	}
	if len(ans) < 9 {
		return 0, fmt.Errorf("AllReduceSum across workers: an answer of %d bytes", len(ans))
	}
	g.completed(replica, ans)
	n, round := int(binary.LittleEndian.Uint32(ans[1:])), binary.LittleEndian.Uint32(ans[5:])
	if len(ans) == 9+4*len(f) {
		Decode(f, ans[9:])
		return n, nil
	}
	// The round completed with this member: it counts for it as for the
	// others, its sum with it, even where ctx ends while the sum is
	// fetched (each part's request bounded on its own).
	for off := 0; off < len(f); off += per {
		k := min(per, len(f)-off)
		c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		a, err := g.call(c, OpFetch, replica, round, uint32(off), uint32(k))
		cancel()
		if err != nil {
			return 0, err
		}
		if len(a) != 1+4*k {
			return 0, fmt.Errorf("AllReduceSum across workers: a part of %d bytes for %d values", len(a)-1, k)
		}
		Decode(f[off:off+k], a[1:])
	}
	return n, nil
}

func (g *Member) Barrier(ctx context.Context, replica int) error {
	if err := g.arrive(replica); err != nil {
		return err
	}
	req := make([]byte, 5)
	req[0] = OpBarrier
	binary.LittleEndian.PutUint32(req[1:], uint32(replica))
	ans, err := g.arrival(ctx, req, arrivalID())
	if err == nil {
		g.completed(replica, ans)
	}
	return err
}

func (g *Member) AllReduce(ctx context.Context, replica int, x nodes.Reducible) (int, error) {
	if g.Lone {
		// hosted only to restart: the sum of one is the vector itself
		return 1, g.Barrier(ctx, replica)
	}
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
	if err := g.arrive(replica); err != nil {
		return 0, err
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

// Leave takes replica out of the group. Asked at its leave for its state
// (a member's restart, or a slot a move started, is due), it sends it
// first; where that fails it leaves all the same, and another member is
// asked (a member that stayed present would be waited for by every step).
func (g *Member) Leave(ctx context.Context, replica int) (bool, error) {
	ans, err := g.call(ctx, OpLeave, replica)
	var de *donateError
	if errors.As(err, &de) {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ans, err = g.call(c, OpLeave, replica, 1)
	}
	if err != nil {
		return false, err
	}
	return len(ans) >= 5 && binary.LittleEndian.Uint32(ans[1:]) == 1, nil
}

// donateError is a donation that failed: the state asked for was not
// sent.
type donateError struct{ err error }

func (e *donateError) Error() string { return e.err.Error() }
func (e *donateError) Unwrap() error { return e.err }
