package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/proto"
	"github.com/dflow-dev/dflow/report"
)

// member is a group kind's replica's nodes.Group (Start.group, protocol
// version 2): each collective is a Collective message to dflow, which
// runs it among the stage's replicas in its engine's group, and answers
// with a CollectiveResult. One collective at a time; its wait counts as
// blocked in the replica's Times, as a built-in replica's group waits do.
type member struct {
	s    *session
	mu   sync.Mutex // one collective at a time
	next uint64     // the last Collective's id
	res  chan *proto.CollectiveResult
}

func newMember(s *session) *member { return &member{s: s, res: make(chan *proto.CollectiveResult, 1)} }

// result takes dflow's answer (from the receiver). An answer to a
// collective whose caller gave up (its ctx ended) is dropped by the next
// call.
func (m *member) result(r *proto.CollectiveResult) {
	select {
	case m.res <- r:
	default:
	}
}

func (m *member) call(ctx context.Context, c *proto.Collective) (*proto.CollectiveResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
	c.Id = m.next
	for {
		select {
		case <-m.res: // a stale answer
			continue
		default:
		}
		break
	}
	defer m.s.times.wait(waitBlocked)()
	if err := m.s.send(&proto.Message{Msg: &proto.Message_Collective{Collective: c}}); err != nil {
		return nil, fmt.Errorf("sdk: collective: %w", err)
	}
	for {
		select {
		case r := <-m.res:
			if r.Id != c.Id {
				continue
			}
			if r.Error != "" {
				return nil, errors.New(r.Error)
			}
			return r, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-m.s.dead:
			return nil, errors.New("sdk: the stream to dflow ended during a collective")
		}
	}
}

func (m *member) Barrier(ctx context.Context) error {
	_, err := m.call(ctx, &proto.Collective{Op: proto.CollectiveOp_COLLECTIVE_BARRIER})
	return err
}

func (m *member) AllReduceSum(ctx context.Context, buf []float32) (int, error) {
	r, err := m.call(ctx, &proto.Collective{Op: proto.CollectiveOp_COLLECTIVE_ALL_REDUCE, Values: buf})
	if err != nil {
		return 0, err
	}
	if len(r.Values) != len(buf) {
		return 0, fmt.Errorf("sdk: all-reduce of %d values answered with %d", len(buf), len(r.Values))
	}
	copy(buf, r.Values)
	return int(r.Members), nil
}

// AllReduce sums a host vector (nodes.Floats, or a nodes.HostCopier,
// copied to the host and back): the sum crosses to dflow.
func (m *member) AllReduce(ctx context.Context, x nodes.Reducible) (int, error) {
	switch v := x.(type) {
	case nodes.Floats:
		return m.AllReduceSum(ctx, v)
	case nodes.HostCopier:
		buf := make([]float32, v.Len())
		v.CopyToHost(buf)
		n, err := m.AllReduceSum(ctx, buf)
		if err == nil {
			v.CopyFromHost(buf)
		}
		return n, err
	}
	return 0, fmt.Errorf("sdk: all-reduce of a %T: a plugin's group sums host vectors (nodes.Floats or a nodes.HostCopier)", x)
}

func (m *member) Leave() { _, _ = m.Finish(context.Background()) }

func (m *member) Finish(ctx context.Context) (bool, error) {
	r, err := m.call(ctx, &proto.Collective{Op: proto.CollectiveOp_COLLECTIVE_FINISH})
	if err != nil {
		return false, err
	}
	return r.Last, nil
}

var errKeep = errors.New("sdk: a plugin's group does not move state between members (Group.Keep); save and restore it yourself, with a kind that restores (nodes.Spec.Moves)")

// Keep moves no state between members: a plugin keeps its own. For a
// kind that restores (Spec.Moves: Kind.restores), it says whether this
// start is a restart of the group lost whole: a *nodes.Restore naming the
// step of the group's last save to restore (Step < 0: none yet, start
// afresh), or nil on a first start. Any other kind's member gets an
// error.
func (m *member) Keep(context.Context, nodes.State) error {
	start := m.s.start
	switch {
	case !m.s.restores:
		return errKeep
	case start.RestoreStep != nil:
		return &nodes.Restore{Step: int(*start.RestoreStep)}
	}
	return nil
}

func (m *member) Saves(ctx context.Context) error {
	_, err := m.call(ctx, &proto.Collective{Op: proto.CollectiveOp_COLLECTIVE_SAVES})
	return err
}

func (m *member) Saved(ctx context.Context, step int) error {
	_, err := m.call(ctx, &proto.Collective{Op: proto.CollectiveOp_COLLECTIVE_SAVED, Step: int64(step)})
	return err
}

// Step is one step of a group member's input in lockstep (Steps).
type Step struct {
	// Index counts the steps from 0, the same on every member.
	Index int
	// Items are the member's items of the step: up to k, fewer (none at
	// all) once its input has ended while another member's has not. A
	// member with none still takes part in the step's collectives, with
	// a weight of zero.
	Items []any
	// Total is how many items the step has over every member, Members
	// how many members took part: a member's share of a mean over the
	// step's items is len(Items)/Total (for DDP, which averages over the
	// members, scale the sum of the member's losses by Members/Total).
	Total, Members int
}

// Steps gives a group member its input on port as steps, in lockstep
// with the other members of its group: every member gets the same number
// of steps; a step hands each member up to k items (it waits for k, or
// for the end of its input); a member whose input has ended gets empty
// steps while another's has not, so that it still joins each step's
// collectives; and the steps end on every member at the same step, once
// no member has an item left. Whether each member has items and whether
// all inputs have ended is settled by one all-reduce a step through the
// group (nodes.Group.AllReduceSum), so Steps works for a plugin's group
// kind and for a built-in kind alike. A node that trains with a
// collective of its own per step (DDP) runs one per step, also on an
// empty step; the uneven end of a naive loop over Recv, where a member
// that has run out stops joining, hangs the others' collective.
//
// Steps measures each step, as node metrics (counters, in seconds):
// report.DataWait ("data_wait_seconds"), the member's wait for its items,
// and report.Compute ("compute_seconds"), from having the step to asking
// for the next. The step's all-reduce, where the members wait for the
// last to arrive, is shared between the two in the proportion of the
// group's waits for items to its compute (summed in the same all-reduce):
// a group waiting for its producers counts it as data wait, one whose
// members compute unevenly as compute. The report and its diagnosis read
// their shares.
//
// An item of a step that came by reference (shared memory) is valid
// until the next step; with k > 1, all but a step's last are copies
// (Detach).
func Steps(ctx context.Context, r nodes.Replica, port string, k int) iter.Seq2[*Step, error] {
	return func(yield func(*Step, error) bool) {
		if k < 1 {
			yield(nil, fmt.Errorf("sdk: steps of %d items: k is at least 1", k))
			return
		}
		in, metrics := r.In(port), r.Metrics()
		ended := false
		var computed time.Duration // the last step's compute
		for index := 0; ; index++ {
			st := &Step{Index: index}
			asked := time.Now() // the wait for the step's items begins
			for !ended && len(st.Items) < k {
				item, err := in.Recv(ctx)
				if err == io.EOF {
					ended = true
					break
				}
				if err != nil {
					yield(nil, err)
					return
				}
				if n := len(st.Items); n > 0 && Shared(st.Items[n-1]) {
					// The next Recv ends the previous item's lifetime.
					if st.Items[n-1], err = Detach(st.Items[n-1]); err != nil {
						yield(nil, err)
						return
					}
				}
				st.Items = append(st.Items, item)
			}
			got := time.Now()
			// The step's count, with the members' waits for items and
			// their last computes, which share out the all-reduce's wait.
			sums := []float32{float32(len(st.Items)), float32(got.Sub(asked).Seconds()), float32(computed.Seconds())}
			n, err := r.Group().AllReduceSum(ctx, sums)
			if err != nil {
				yield(nil, fmt.Errorf("sdk: step %d: %w", index, err))
				return
			}
			st.Total, st.Members = int(sums[0]), n
			ready := time.Now()
			data := 1.0
			if w, c := float64(sums[1]), float64(sums[2]); w+c > 0 {
				data = w / (w + c)
			}
			synced := ready.Sub(got).Seconds()
			metrics.Add(report.DataWait, got.Sub(asked).Seconds()+data*synced)
			metrics.Add(report.Compute, (1-data)*synced)
			if st.Total == 0 {
				return // every member's input has ended
			}
			if !yield(st, nil) {
				return
			}
			computed = time.Since(ready)
			metrics.Add(report.Compute, computed.Seconds())
		}
	}
}
