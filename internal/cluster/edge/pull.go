package edge

import (
	"fmt"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/broker"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/nats-io/nats.go"
)

// The consumer side's pulls.
//
// A queue's consumer side asks its durable consumer for messages with
// pull requests of its own on one subscription, and asks for exactly the
// room its inbox has: every message that comes goes into the inbox at
// once and is held (kept from redelivery) from then on, so none waits
// unheld in a client buffer while the consumers are slow. A request is
// under way while the consumers take what came before it, so the
// consumer side does not wait a round trip to the server between
// batches, as one fetch after another did; and the messages of every
// request come on the one subscription in the order the server sends
// them, the order the producers sent them in.

// pullExpiry is how long a pull request waits at the server for
// messages; one that brings none says the queue may have ended (idle).
const pullExpiry = 200 * time.Millisecond

// fetch pulls the queue's messages into the inbox as they arrive, each
// held from the moment it is here, until the queue has ended or the
// instance stops. Once a request expires with nothing since the one
// before, it asks no more until those under way have expired too, and
// says so on idle.
func (q *Queue) fetch() {
	stop := q.env.Stop.Done()
	fail := func(err error) {
		select {
		case <-stop:
		case q.fetchErr <- fmt.Errorf("%s: fetch: %w", q.Name(), err):
		}
	}
	msgs := make(chan *nats.Msg, 2*cap(q.inbox)+16)
	reply := q.env.NC.NewInbox()
	sub, err := q.env.NC.ChanSubscribe(reply, msgs)
	if err != nil {
		fail(err)
		return
	}
	defer sub.Unsubscribe()
	next := broker.NextSubject(wire.StreamEdge(q.env.Job.Run, q.ei), wire.ConsumerQueue(q.qi))
	// at least this much room before a request: not one per item
	least := max(1, cap(q.inbox)/4)
	// asked: asked for and not yet here or expired; got: come since the
	// last expiry; quiet: an expiry brought nothing, so no more requests
	// until every one under way has expired (then none can be on its way:
	// the server sends a request's messages before its end) or a message
	// came
	asked, got, quiet := 0, 0, false
	granted := 0 // room made and not yet said
	for !q.finished.Load() {
		if granted > 0 && len(msgs) == 0 {
			// the room is made as the server delivers: said once what
			// came together is in
			q.saidRoom(granted)
			granted = 0
		}
		if room := cap(q.inbox) - len(q.inbox) - asked; room >= least && !quiet {
			if err := q.env.NC.PublishRequest(next, reply, broker.PullRequest(room, pullExpiry)); err != nil {
				fail(err)
				return
			}
			asked += room
		}
		select {
		case m := <-msgs:
			if broker.IsStatus(m) {
				n, err := broker.PullStatus(m)
				if err != nil {
					fail(err)
					return
				}
				if n == 0 {
					continue
				}
				asked -= n
				quiet = quiet || got == 0
				got = 0
				if !quiet || asked > 0 {
					continue
				}
				// Every request expired, nothing since: say so, and wait
				// until the consumers have looked at the queue's end.
				quiet = false
				select {
				case q.idle <- struct{}{}:
					select {
					case <-q.resume:
					case <-stop:
						return
					}
				case <-stop:
					return
				}
				continue
			}
			asked--
			got++
			quiet = false
			jm := broker.NewPulled(m, q.env.NC)
			fresh := jm.Delivered() == 1 // a redelivery made no room: it was granted when it first came
			q.hold(jm)
			q.fetchAhead(jm)
			select {
			case q.inbox <- jm: // room by construction
			case <-stop:
				return
			}
			if fresh {
				granted++
			}
		case <-q.room:
		case <-stop:
			return
		}
	}
}
