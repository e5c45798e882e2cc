package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream's pull protocol, spoken directly: a client that asks a
// durable consumer for messages with pull requests of its own, on a
// subscription of its own, rather than through nats.go's consume loop
// (package edge says why).

// NextSubject is where pull requests for consumer of stream go.
func NextSubject(stream, consumer string) string {
	return "$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer
}

// PullRequest is the body of a pull request for up to batch messages that
// waits at the server for at most expires.
func PullRequest(batch int, expires time.Duration) []byte {
	return []byte(`{"batch":` + strconv.Itoa(batch) + `,"expires":` + strconv.FormatInt(int64(expires), 10) + `}`)
}

// PullStatus reads a status message on a pull subscription (one with a
// Status header and no data): how many messages of a request it says will
// not come (a request that expired, or was cut short; 0 for a heartbeat),
// or an error where the consumer is gone.
func PullStatus(m *nats.Msg) (int, error) {
	status := m.Header.Get("Status")
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

// IsStatus says whether m is a status message of a pull subscription
// rather than one of the stream's.
func IsStatus(m *nats.Msg) bool { return m.Header.Get("Status") != "" && len(m.Data) == 0 }

// Pulled is a message that came on a pull subscription of the client's
// own: a jetstream.Msg, its acks sent on its reply subject.
type Pulled struct {
	m  *nats.Msg
	nc *nats.Conn
	// its metadata, read once from its reply subject (ackMetadata)
	md    *jetstream.MsgMetadata
	mdErr error
}

var _ jetstream.Msg = (*Pulled)(nil)

// NewPulled is m, which came on nc.
func NewPulled(m *nats.Msg, nc *nats.Conn) *Pulled {
	p := &Pulled{m: m, nc: nc}
	p.md, p.mdErr = ackMetadata(m.Reply)
	return p
}

// Delivered is how many times the server has delivered the message; 0
// where it cannot say.
func (p *Pulled) Delivered() uint64 {
	if p.mdErr != nil {
		return 0
	}
	return p.md.NumDelivered
}

func (p *Pulled) Metadata() (*jetstream.MsgMetadata, error) { return p.md, p.mdErr }

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

func (p *Pulled) Data() []byte         { return p.m.Data }
func (p *Pulled) Headers() nats.Header { return p.m.Header }
func (p *Pulled) Subject() string      { return p.m.Subject }
func (p *Pulled) Reply() string        { return p.m.Reply }
func (p *Pulled) Ack() error           { return p.m.Respond([]byte("+ACK")) }
func (p *Pulled) Nak() error           { return p.m.Respond([]byte("-NAK")) }
func (p *Pulled) InProgress() error    { return p.m.Respond([]byte("+WPI")) }
func (p *Pulled) Term() error          { return p.m.Respond([]byte("+TERM")) }

func (p *Pulled) NakWithDelay(delay time.Duration) error {
	return p.m.Respond([]byte(`-NAK {"delay": ` + strconv.FormatInt(int64(delay), 10) + `}`))
}

func (p *Pulled) TermWithReason(reason string) error {
	return p.m.Respond([]byte("+TERM " + reason))
}

// DoubleAck acks the message and waits for the server to say it has the
// ack.
func (p *Pulled) DoubleAck(ctx context.Context) error {
	_, err := p.nc.RequestWithContext(ctx, p.m.Reply, []byte("+ACK"))
	return err
}
