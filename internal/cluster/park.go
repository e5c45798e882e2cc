package cluster

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/items"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Parked inputs.
//
// An input of a restartable replica settles only once what it sent is
// safe: a large item's bytes stay on the sender's data plane, and its
// input unsettled, until the item's consumer has acked it, so that a lost
// sender's input comes back and is done again (dataplane.go, rehold). An
// input unsettled stays in its edge's stream and counts against the
// edge's room; were it to stay there while its outputs wait downstream, a
// downstream that waits in turn (a synchronized stage whose starved
// member needs an input the full upstream edge cannot take) would never
// move: the DFlash job's tokens edge, full of batches whose hidden states
// sit in two drafters' queues, left the third drafter's target nothing to
// take.
//
// So an input that its replica has finished while a large item it sent is
// still held is parked: its message is copied to the run's park stream,
// under its queue and its consumer replica, and acked, which frees its
// room. Once the held item is released the copy is deleted (by sequence:
// no tombstone stays), and the input is settled. A replica restarted
// after its worker's loss takes what was parked for it before anything
// else, does it again (what it sends is dropped as a duplicate, or held
// again), and deletes the copies as those settle.

// streamPark is a run's park stream.
func streamPark(run string) string { return "DFR_" + run }

// subjPark is where replica's parked inputs of queue qi of edge ei go.
func subjPark(run string, ei, qi, replica int) string {
	return fmt.Sprintf("dflow.park.%s.%d.%d.%d", run, ei, qi, replica)
}

// createPark makes a run's park stream.
func createPark(ctx context.Context, js jetstream.JetStream, run string) error {
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: streamPark(run), Subjects: []string{"dflow.park." + run + ".>"},
		Storage: jetstream.MemoryStorage,
	})
	if err != nil {
		return fmt.Errorf("park stream: %w", err)
	}
	return nil
}

// park copies t's message to the park stream and acks it; false when it
// could not (t then stays unsettled in its queue, as before parking).
func (t *taken) park(replica int) bool {
	q := t.q
	m := q.heldMsg(t.id)
	if m == nil || q.l.park == nil {
		return false
	}
	msg := &nats.Msg{Subject: subjPark(q.l.job.Run, q.ei, q.qi, replica), Data: m.Data(), Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, t.id)
	msg.Header.Set(hdrWire, m.Headers().Get(hdrWire))
	ctx, cancel := context.WithTimeout(q.l.stopCtx, 10*time.Second)
	defer cancel()
	ack, err := q.l.js.PublishMsg(ctx, msg)
	if err != nil {
		return false
	}
	t.parked = ack.Sequence
	m.Ack()
	q.committed(t)
	return true
}

// unpark deletes t's parked copy: t is settled.
func (lg *ledger) unpark(t *taken) error {
	ctx, cancel := context.WithTimeout(lg.l.stopCtx, 10*time.Second)
	defer cancel()
	if err := lg.l.park.DeleteMsg(ctx, t.parked); err != nil && ctx.Err() == nil {
		return fmt.Errorf("%s: settling parked item %s on worker %s: %w", t.q.name(), t.id, lg.l.worker, err)
	}
	return nil
}

// parkedItem is an input parked by a lost share, for its replica's
// restart.
type parkedItem struct {
	item any
	rec  *taken
}

// parkedFor reads what was parked for replica i of s on every queue it
// consumes here, oldest first, and marks the ids handed on (so that a
// redelivery of one is dropped).
func (l *links) parkedFor(s *graph.Stage, i int) (map[string][]parkedItem, error) {
	if l.park == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(l.runCtx(), 30*time.Second)
	defer cancel()
	out := map[string][]parkedItem{}
	for _, q := range l.queueList() {
		if q.edge.To.Stage != s || !contains(q.localConsumers, i) {
			continue
		}
		subj := subjPark(l.job.Run, q.ei, q.qi, i)
		info, err := l.park.Info(ctx, jetstream.WithSubjectFilter(subj))
		if err != nil {
			return nil, fmt.Errorf("%s: reading its parked items: %w", q.name(), err)
		}
		if info.State.Subjects[subj] == 0 {
			continue
		}
		cons, err := l.park.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
		if err != nil {
			return nil, fmt.Errorf("%s: reading its parked items: %w", q.name(), err)
		}
		for left := info.State.Subjects[subj]; left > 0; {
			batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(2*time.Second))
			if err != nil {
				return nil, fmt.Errorf("%s: reading its parked items: %w", q.name(), err)
			}
			got := 0
			for m := range batch.Messages() {
				got++
				md, err := m.Metadata()
				if err != nil {
					return nil, err
				}
				id := m.Headers().Get(jetstream.MsgIDHeader)
				item, err := items.Decode(m.Headers().Get(hdrWire), m.Data())
				if err != nil {
					return nil, fmt.Errorf("%s: parked item %s: %w", q.name(), id, err)
				}
				q.hmu.Lock()
				q.seen.add(id)
				q.hmu.Unlock()
				out[q.edge.To.Name] = append(out[q.edge.To.Name], parkedItem{item: item,
					rec: &taken{q: q, id: id, parked: md.Sequence.Stream}})
			}
			if got == 0 {
				break
			}
			left -= uint64(got)
		}
	}
	return out, nil
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// parkedLog says what a restart takes first.
func parkedLog(stage string, i int, n int) string {
	return "stage " + stage + " replica " + strconv.Itoa(i) + " takes " + strconv.Itoa(n) + " parked items of its lost share first"
}
