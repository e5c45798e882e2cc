package edge

import (
	"context"
	"fmt"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publishes pipelined.
//
// A queue's Send does not wait for the server's answer: it waits for room
// (waitRoom), issues the publish (publish) and returns, and the queue's
// answerer takes the answers in the order the publishes went (answer).
// What that keeps:
//
//   - Order. Every publish of a queue goes out on one connection in the
//     order of the Sends, and none is ever refused for room: a producer
//     publishes only within its credit (the room it read, the queue's
//     capacity less what the consumer has yet to be delivered and what
//     this share has under way, and what the consumers granted since,
//     within its part of the capacity); the stream has no bound of its
//     own to refuse one for.
//     So the server stores a producer's items in the order it sent them,
//     and a consumer sees them so. A publish refused for any reason fails
//     the share: sent again, it could land behind a later one.
//   - Nothing lost. A queue's Close waits for every answer before it
//     writes the end keys that let the consumers end (flush); an item a
//     restartable replica sent is settled (its input acked, through the
//     ledger) only once the answers of everything sent from it are back,
//     so a worker lost with publishes under way has its input redelivered
//     and the items sent again, under the same ids.
//   - The capacity. The producers hold credit: the room read once, then
//     what the consumers grant as they fetch, each producer share taking
//     its part; the room is read again only where no grant came within
//     grantWait (waitRoom, and rule 4 of the package's doc).

// pub is one publish under way.
type pub struct {
	msg  *nats.Msg
	id   string
	fut  jetstream.PubAckFuture
	held bool    // its bytes are on this share's data plane (package dataplane)
	from Receipt // the item in hand it derives from, settled once answered
}

// waitRoom waits until the queue has room for one more item, as a local
// queue's Send blocks, unless no consumer is left anywhere to make it; the
// wait honours ctx and has no bound (a slow consumer holds a producer back
// as long as it takes, as in process).
func (q *Queue) waitRoom(ctx context.Context) error {
	poll := 50 * time.Microsecond // between reads with no word to wait for
	full := 0                     // reads in a row that found the queue full, with a word to wait for
	began := time.Now()
	lastLook := began
	// Grants come where the consumers' side says what it fetched: from
	// this share's own, or on the room subject (roomSub).
	grants := q.consumers == len(q.edge.Queues[q.qi].Consumers) || q.roomSub != nil
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if q.env.Share.Aborting() {
			// counted lost (or aborting): what its replicas send now is the
			// share that took over's to send
			return fmt.Errorf("%s: the share on worker %s is aborting: %w", q.Name(), q.env.Share.Worker(), context.Canceled)
		}
		q.pmu.Lock()
		if err := q.pubErr; err != nil {
			q.pmu.Unlock()
			return err
		}
		if q.credit > 0 {
			q.credit--
			q.pmu.Unlock()
			return nil
		}
		fetched, read := q.fetched, q.read
		q.pmu.Unlock()
		if grants && read && full == 0 {
			// Out of credit: the consumers grant more as they fetch, a
			// word per fetch. The room is read only where none came
			// within a consumer's turn of an item (a word lost, or a
			// producer elsewhere left idle with its part of the grants).
			select {
			case <-fetched:
				continue
			case <-time.After(grantWait):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		q.pmu.Lock()
		under := q.unanswered // as the read begins: taken after too, below
		q.pmu.Unlock()
		pending, err := q.pending(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%s: reading its room: %w", q.Name(), err)
		}
		q.pmu.Lock()
		under = max(under, q.unanswered)
		q.pmu.Unlock()
		// What is under way may be stored already, or not: counted both
		// ways, the room is never overstated.
		credit := max(q.edge.Capacity, 1) - pending - under
		room := credit
		q.pmu.Lock()
		credit = min(credit, q.part())
		q.credit, q.grants, q.read = credit, 0, true
		q.pmu.Unlock()
		if credit > 0 {
			poll, full = 50*time.Microsecond, 0
			continue
		}
		// No room. Where the queue is full, only a consumer's fetch makes
		// room, and the consumers say so (q.fetched: this instance's own
		// fetches, and other workers' on the queue's room subject,
		// roomSub): the producer reads once more after 2 ms (the read may
		// have raced a publish of its own or an ack, and counted the queue
		// fuller than it is), then waits for that word, and reads again
		// without it only at maxRoomWait, for a word lost (core NATS keeps
		// none). Reading every 2 ms instead, a blocked target of the seed
		// read the room about ten times for each item its slower drafter
		// took (TestRoomSaid). Otherwise, with no word to wait for (the
		// room subject's subscription failed), it reads again
		// less and less often: every 2 ms at most while the wait is short,
		// as a consumer's turn of an item is, and at most a tenth of the
		// wait so far past that, up to maxRoomWait (a queue that stays
		// full, a deadlock: a sender blocked there polled the server 500
		// times a second).
		local := q.consumers == len(q.edge.Queues[q.qi].Consumers)
		wait := poll
		switch {
		case (local || q.roomSub != nil) && room <= 0: // a word will come
			wait = maxRoomWait
			if full == 0 {
				wait = 2 * time.Millisecond
			}
			full++
		case local: // its fetches say so: the reads between are a fallback
			full, poll = 0, min(2*poll, maxRoomWait)
		default:
			full, poll = 0, min(2*poll, max(2*time.Millisecond, time.Since(began)/10), maxRoomWait)
		}
		if time.Since(lastLook) > 250*time.Millisecond {
			lastLook = time.Now()
			if q.consumersGone(ctx, q.qi) {
				return fmt.Errorf("edge %q: %w: every replica of stage %q has returned, on every worker", q.edge.Name, nodes.ErrNoConsumers, q.edge.To.Stage.Name)
			}
		}
		select {
		case <-time.After(wait):
		case <-fetched:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// grantWait is how long a producer out of credit waits for a grant
// before it reads the room.
const grantWait = 2 * time.Millisecond

// maxRoomWait is the longest a sender on a full queue waits between two
// reads of its room: a room made after a long wait is seen within this
// (or a tenth of the wait, if less).
const maxRoomWait = 100 * time.Millisecond

// pending is how many of the queue's messages its consumers have yet to
// be delivered: what is in the queue, as in process. What a consumer's
// worker has taken is out of it, acked or not (fetched ahead, in a
// replica's hands, or done with and waiting until what it sent downstream
// is settled, or until its group's save holds it): counted in, it would
// let a downstream that waits in turn hold the queue full for ever (a
// synchronized stage whose members' items in hand fill it while a member
// waits for one; the DFlash job's tokens, finished but unsettled while
// their hidden states wait in two drafters' queues, leaving nothing for
// the third drafter's target to take).
func (q *Queue) pending(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, q.env.Job.Timings.Answer)
	defer cancel()
	q.pmu.Lock()
	c := q.pcons
	q.pmu.Unlock()
	if c == nil {
		var err error
		if c, err = q.env.JS.Consumer(ctx, wire.StreamEdge(q.env.Job.Run, q.ei), wire.ConsumerQueue(q.qi)); err != nil {
			return 0, err
		}
		q.pmu.Lock()
		q.pcons = c
		q.pmu.Unlock()
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.NumPending), nil
}

// stored is how many messages the queue's stream stores for it: delivered
// and not yet acked, and not yet delivered (the stream's own count of the
// queue's subject, read from its store): the queue's depth as the status
// line, the report and the page show it.
func (q *Queue) stored(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, q.env.Job.Timings.Answer)
	defer cancel()
	q.pmu.Lock()
	s := q.pstream
	q.pmu.Unlock()
	if s == nil {
		var err error
		if s, err = q.env.JS.Stream(ctx, wire.StreamEdge(q.env.Job.Run, q.ei)); err != nil {
			return 0, err
		}
		q.pmu.Lock()
		q.pstream = s
		q.pmu.Unlock()
	}
	return wire.SubjectMsgs(ctx, s, q.subject)
}

// publish issues p's publish; its answer comes to the answerer. Issued
// under pmu, so that the answers queue in the order the publishes went.
// Answers may lag the consumers' grants: what is under way stays within
// what the answerer's queue holds, the publish waiting for an answer
// (else it would wait on the answerer, lock held, while the answerer
// waits for the lock).
func (q *Queue) publish(ctx context.Context, p *pub) error {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	fail := func(err error) error {
		if p.held {
			q.env.DP.Drop(p.id)
		}
		return err
	}
	if q.pubs != nil && q.unanswered >= cap(q.pubs) {
		stop := context.AfterFunc(ctx, func() {
			q.pmu.Lock()
			q.pcond.Broadcast()
			q.pmu.Unlock()
		})
		for q.unanswered >= cap(q.pubs) && !q.stopped && q.pubErr == nil && ctx.Err() == nil {
			q.pcond.Wait()
		}
		stop()
		switch {
		case ctx.Err() != nil:
			return fail(ctx.Err())
		case q.pubErr == nil && q.stopped:
			return fail(fmt.Errorf("%s: the share stopped with %d publishes unanswered", q.Name(), q.unanswered))
		}
	}
	if q.pubErr != nil {
		return fail(q.pubErr)
	}
	if q.stopped {
		return fail(fmt.Errorf("%s: the share has stopped", q.Name()))
	}
	if q.pubs == nil {
		q.pubs = make(chan *pub, 2*q.part()+16)
		q.env.Go(q.answer)
	}
	fut, err := q.env.JS.PublishMsgAsync(p.msg)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", q.Name(), err))
	}
	p.fut = fut
	if p.from != nil {
		p.from.Derived()
	}
	q.unanswered++
	q.pubs <- p // never full: what is under way is within the room
	return nil
}

// answer takes the queue's publishes' answers, in order, until the share
// stops.
func (q *Queue) answer() {
	defer func() {
		q.pmu.Lock()
		q.stopped = true
		q.pcond.Broadcast() // a flush waiting ends
		q.pmu.Unlock()
	}()
	for {
		var p *pub
		select {
		case p = <-q.pubs:
		case <-q.env.Stop.Done():
			return
		}
		select {
		case ack := <-p.fut.Ok():
			q.answered(p, ack, nil)
		case err := <-p.fut.Err():
			q.answered(p, nil, err)
		case <-q.env.Stop.Done():
			return
		}
	}
}

// answered applies a publish's answer: its bytes released if the item
// was a duplicate (the message that stands has them elsewhere), its input
// settled if it derives from one, or, refused, the share failed.
func (q *Queue) answered(p *pub, ack *jetstream.PubAck, err error) {
	if err != nil {
		err = fmt.Errorf("%s: publishing item %s: %w", q.Name(), p.id, err)
		if p.held {
			q.env.DP.Drop(p.id)
		}
	} else if p.held {
		q.env.DP.Stored(p.id, ack.Sequence)
		switch {
		case !ack.Duplicate:
		case p.from == nil:
			q.env.DP.Drop(p.id) // another share holds them, for the message that stands
		default:
			// Sent again from an input that came back: the share that sent
			// it first may be gone with its bytes before a consumer had
			// them. These stand in for them (rehold) until the message that
			// stands is consumed (the sweep drops them then).
			q.rehold(p.id)
		}
	}
	if err == nil && p.from != nil {
		p.from.Answered()
	}
	q.pmu.Lock()
	q.unanswered--
	first := err != nil && q.pubErr == nil
	if first {
		q.pubErr = err
	}
	q.pcond.Broadcast()
	q.pmu.Unlock()
	if first {
		q.env.Share.Fail(err)
	}
}

// Flush waits until every publish issued has its answer; the first
// refusal, if any, is its error.
func (q *Queue) Flush() error {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	for q.unanswered > 0 && q.pubErr == nil {
		if q.stopped {
			return fmt.Errorf("%s: the share stopped with %d publishes unanswered", q.Name(), q.unanswered)
		}
		q.pcond.Wait()
	}
	return q.pubErr
}
