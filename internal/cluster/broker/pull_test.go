package broker

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// TestPulledMetadata: a message of a pull subscription of the client's
// own reads its delivery count and sequences from its reply subject, in
// both of the server's forms (with a domain and an account hash, and
// without), and says it cannot where the subject is not an ack subject.
func TestPulledMetadata(t *testing.T) {
	for _, reply := range []string{
		"$JS.ACK.DFQ_ab_1.q0.3.41.40.1700000000000000000.7",
		"$JS.ACK.hub.ACCHASH.DFQ_ab_1.q0.3.41.40.1700000000000000000.7.tok",
	} {
		p := NewPulled(&nats.Msg{Reply: reply}, nil)
		md, err := p.Metadata()
		if err != nil {
			t.Fatalf("%s: %v", reply, err)
		}
		if md.Stream != "DFQ_ab_1" || md.Consumer != "q0" || md.NumDelivered != 3 || md.Sequence.Stream != 41 ||
			md.Sequence.Consumer != 40 || md.NumPending != 7 || md.Timestamp.UnixNano() != 1700000000000000000 {
			t.Errorf("%s: %+v", reply, md)
		}
		if p.Delivered() != 3 {
			t.Errorf("%s: delivered %d, want 3", reply, p.Delivered())
		}
	}
	if _, err := NewPulled(&nats.Msg{Reply: "_INBOX.x"}, nil).Metadata(); err == nil {
		t.Error("an inbox subject read as a JetStream message")
	}
}

// TestPullStatus: an expired or cut-short request says how much of it
// will not come; a heartbeat nothing; a deleted consumer, or an end that
// does not say how much, is an error.
func TestPullStatus(t *testing.T) {
	msg := func(status, desc, pending string) *nats.Msg {
		h := nats.Header{}
		h.Set("Status", status)
		h.Set("Description", desc)
		if pending != "" {
			h.Set("Nats-Pending-Messages", pending)
		}
		return &nats.Msg{Header: h}
	}
	for _, c := range []struct {
		m    *nats.Msg
		n    int
		fail bool
	}{
		{msg("408", "Request Timeout", "5"), 5, false},
		{msg("409", "Exceeded MaxWaiting", "2"), 2, false},
		{msg("100", "Idle Heartbeat", ""), 0, false},
		{msg("409", "Consumer Deleted", "3"), 0, true},
		{msg("408", "Request Timeout", ""), 0, true},
		{msg("503", "No Responders", ""), 0, true},
	} {
		if !IsStatus(c.m) {
			t.Errorf("%s %s: not read as a status", c.m.Header.Get("Status"), c.m.Header.Get("Description"))
		}
		n, err := PullStatus(c.m)
		if n != c.n || (err != nil) != c.fail {
			t.Errorf("%s %s: %d, %v; want %d, error %v", c.m.Header.Get("Status"), c.m.Header.Get("Description"), n, err, c.n, c.fail)
		}
	}
	if IsStatus(&nats.Msg{Header: nats.Header{"Status": {"100"}}, Data: []byte("x")}) {
		t.Error("a message with data read as a status")
	}
}
