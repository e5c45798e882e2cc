package edge

import (
	"context"
	"encoding/base64"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/dataplane"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Env is what the queues of one share have in common: the connection,
// the job, the run's buckets, the data plane, the share's background
// group, and the share itself (what a queue asks of it).
type Env struct {
	NC       *nats.Conn
	JS       jetstream.JetStream
	Job      *wire.Job
	Graph    *graph.Graph
	Instance string             // the share's name
	Ends     jetstream.KeyValue // the run's end and gone keys
	Holders  jetstream.KeyValue // where large items sent again are held (rehold)
	// DP holds the bytes of the large items the share sends, for their
	// consumers to fetch, and fetches those it receives; Threshold is the
	// size past which an item's bytes take it
	DP        *dataplane.Plane
	Threshold int
	Started   time.Time // when the share began
	// Stop is the cancellation of the share's background group, and Go
	// starts a function in that group: every goroutine of a queue runs in
	// it, and ends once Stop is done
	Stop  context.Context
	Go    func(func())
	Share Share
}

// Share is what a queue asks of the worker's share it belongs to.
type Share interface {
	// Worker is the name of the share's worker.
	Worker() string
	// Aborting says the share is being aborted or was counted lost: what
	// its replicas did not finish is not theirs to end.
	Aborting() bool
	// Released says the share was counted lost: it keeps nothing from
	// redelivery any more.
	Released() bool
	// Renews says whether the share's renewals may go now.
	Renews() bool
	// Fail fails the share with err, unless it is aborting.
	Fail(err error)
	// RunCtx is the share's run.
	RunCtx() context.Context
	// Restartable says whether a stage's replicas restart elsewhere when
	// their worker is lost: the items they take come with a receipt.
	Restartable(s *graph.Stage) bool
	// Take is the receipt of the item id that q hands a restartable
	// stage (r: where its bytes are held, nil if in its message; again:
	// the server had delivered it before), settled by the share once its
	// replica has done with it and what was sent from it is stored.
	Take(q *Queue, id string, r *dataplane.Ref, again bool) engine.Receipt
}

// Receipt is a delivery in hand that items sent on a queue derive from
// (engine.Origin): what is sent from it gets an id derived from its own
// (DerivedID), and it is told of each publish from it under way
// (Derived) and answered (Answered), so that the share settles it only
// once every one is stored.
type Receipt interface {
	engine.Receipt
	dataplane.Input
	// ID is the id what is sent from it derives from.
	ID() string
}

// DerivedID is the id of the k-th item (counted from 0) sent from the
// delivery of id, on edge at: the same for the same delivery, count and
// edge, whichever share sends it and whichever queue of the edge it goes
// to (the edge's stream is one namespace of ids), so a restart's
// duplicate is dropped by the stream. It is a 128-bit hash: two different
// items whose ids met within the stream's window of duplicates would lose
// the second, and with n ids in the window the chance of that is about
// n²/2¹²⁹ (with 64 bits, two million ids in a window would make it about
// one in ten million).
func DerivedID(id string, k int, at string) string {
	var buf [96]byte
	b := append(buf[:0], id...)
	b = append(b, '#')
	b = strconv.AppendInt(b, int64(k), 10)
	b = append(b, '>')
	b = append(b, at...)
	h := fnv.New128a()
	h.Write(b)
	var sum [16]byte
	return "f" + base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0]))
}

// Name names the queue in errors and logs.
func (q *Queue) Name() string { return fmt.Sprintf("edge %q queue %d", q.edge.Name, q.qi) }

// Edge is the queue's edge.
func (q *Queue) Edge() *graph.Edge { return q.edge }

// Local are the queue's producer replicas in this share.
func (q *Queue) Local() []int { return q.local }

// Closed says whether Close has stored every item sent and written the
// ends.
func (q *Queue) Closed() bool { return q.closed.Load() }

// Env is what the queue has in common with the share's other queues.
func (q *Queue) Env() *Env { return q.env }

// Grants is how many grants the queue's producers here have heard on the
// queue's room subject from consumers elsewhere; ok is false where they
// listen for none (no consumer elsewhere, or the subscription failed).
func (q *Queue) Grants() (n int64, ok bool) {
	if q.roomSub == nil {
		return 0, false
	}
	n, err := q.roomSub.Delivered()
	return n, err == nil
}
