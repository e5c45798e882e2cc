package edge

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	next := "$JS.API.CONSUMER.MSG.NEXT." + wire.StreamEdge(q.env.Job.Run, q.ei) + "." + wire.ConsumerQueue(q.qi)
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
			req := `{"batch":` + strconv.Itoa(room) + `,"expires":` + strconv.FormatInt(int64(pullExpiry), 10) + `}`
			if err := q.env.NC.PublishRequest(next, reply, []byte(req)); err != nil {
				fail(err)
				return
			}
			asked += room
		}
		select {
		case m := <-msgs:
			if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 {
				n, err := q.pullStatus(m, status)
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
			jm := newPulled(m, q.env.NC)
			fresh := jm.delivered() == 1 // a redelivery made no room: it was granted when it first came
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

// pullStatus reads a status message on the pull subscription: how many
// messages of a request it says will not come (a request that expired, or
// was cut short), or an error where the consumer is gone.
func (q *Queue) pullStatus(m *nats.Msg, status string) (int, error) {
	switch status {
	case "100": // a heartbeat
		return 0, nil
	case "404", "408", "409":
		desc := m.Header.Get("Description")
		if status == "409" && strings.Contains(strings.ToLower(desc), "deleted") {
			return 0, fmt.Errorf("consumer deleted (%s)", desc)
		}
		n, err := strconv.Atoi(m.Header.Get("Nats-Pending-Messages"))
		if err != nil {
			return 0, fmt.Errorf("a pull ended (%s %s) without saying how much of it did not come", status, desc)
		}
		return n, nil
	}
	return 0, fmt.Errorf("pull status %s %s", status, m.Header.Get("Description"))
}

// pulled is a message that came on the consumer side's own pull
// subscription: a jetstream.Msg, its acks sent on its reply subject.
type pulled struct {
	m  *nats.Msg
	nc *nats.Conn
	// its metadata, read once from its reply subject (ackMetadata)
	md    *jetstream.MsgMetadata
	mdErr error
}

var _ jetstream.Msg = (*pulled)(nil)

func newPulled(m *nats.Msg, nc *nats.Conn) *pulled {
	p := &pulled{m: m, nc: nc}
	p.md, p.mdErr = ackMetadata(m.Reply)
	return p
}

// delivered is how many times the server has delivered the message; 0
// where it cannot say.
func (p *pulled) delivered() uint64 {
	if p.mdErr != nil {
		return 0
	}
	return p.md.NumDelivered
}

func (p *pulled) Metadata() (*jetstream.MsgMetadata, error) { return p.md, p.mdErr }

// ackMetadata reads a message's metadata from its reply subject
// ($JS.ACK.[domain.hash.]stream.consumer.delivered.stream-seq.
// consumer-seq.time.pending[.token]).
func ackMetadata(reply string) (*jetstream.MsgMetadata, error) {
	tok := strings.Split(reply, ".")
	if len(tok) < 9 || tok[0] != "$JS" || tok[1] != "ACK" {
		return nil, errors.New("not a JetStream message")
	}
	if len(tok) >= 11 { // with a domain and an account hash
		tok = tok[2:]
	}
	num := func(s string) uint64 { n, _ := strconv.ParseUint(s, 10, 64); return n }
	return &jetstream.MsgMetadata{
		Stream: tok[2], Consumer: tok[3], NumDelivered: num(tok[4]),
		Sequence:  jetstream.SequencePair{Stream: num(tok[5]), Consumer: num(tok[6])},
		Timestamp: time.Unix(0, int64(num(tok[7]))), NumPending: num(tok[8]),
	}, nil
}

func (p *pulled) Data() []byte         { return p.m.Data }
func (p *pulled) Headers() nats.Header { return p.m.Header }
func (p *pulled) Subject() string      { return p.m.Subject }
func (p *pulled) Reply() string        { return p.m.Reply }
func (p *pulled) Ack() error           { return p.m.Respond([]byte("+ACK")) }
func (p *pulled) Nak() error           { return p.m.Respond([]byte("-NAK")) }
func (p *pulled) InProgress() error    { return p.m.Respond([]byte("+WPI")) }
func (p *pulled) Term() error          { return p.m.Respond([]byte("+TERM")) }

func (p *pulled) NakWithDelay(delay time.Duration) error {
	return p.m.Respond([]byte(`-NAK {"delay": ` + strconv.FormatInt(int64(delay), 10) + `}`))
}

func (p *pulled) TermWithReason(reason string) error {
	return p.m.Respond([]byte("+TERM " + reason))
}

// DoubleAck acks the message and waits for the server to say it has the
// ack.
func (p *pulled) DoubleAck(ctx context.Context) error {
	_, err := p.nc.RequestWithContext(ctx, p.m.Reply, []byte("+ACK"))
	return err
}
