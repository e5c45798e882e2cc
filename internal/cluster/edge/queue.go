package edge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/dataplane"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers of a queue's messages.
const (
	hdrWire   = "Dflow-Wire"      // the item's wire encoding (items.Encode)
	hdrSize   = dataplane.HdrSize // the item's bytes, on the data plane
	hdrHolder = "Dflow-Holder"    // the worker whose data plane holds them
	hdrKey    = "Dflow-Key"       // the item's key (nodes.Keyed), for key_hash edges further on
)

// Queue is one queue of an edge on JetStream, as one instance sees it.
type Queue struct {
	env            *Env
	edge           *graph.Edge
	ei, qi         int
	subject        string
	producers      []int // every producer replica the graph wires to the queue
	local          []int // those in this instance
	consumers      int   // consumer replicas in this instance
	localConsumers []int // which
	id             string
	seq            atomic.Int64
	depth          atomic.Int64
	finished       atomic.Bool // Recv has seen the end: nothing is in flight
	closed         atomic.Bool // Close has stored every item and written the ends

	// the producer side (publish.go)
	pmu        sync.Mutex
	pcond      sync.Cond          // on pmu: an answer came, or the answerer stopped
	credit     int                // publishes allowed: by the room read last, and the consumers' grants since
	grants     int                // what the grants left over, in parts of a publish (granted)
	read       bool               // the room was read once: grants add to it
	unanswered int                // publishes issued, not yet answered
	pubs       chan *pub          // issued, in order, for the answerer
	pubErr     error              // the first publish refused
	pstream    jetstream.Stream   // the edge's stream, read for the depth
	pcons      jetstream.Consumer // the queue's consumer, read for room
	stopped    bool               // the answerer has stopped
	// fetched is closed (and replaced) when the queue's consumer side has
	// fetched messages, which makes room: the producers waiting for room
	// here read it again at once. Said by this instance's consumer side
	// itself, or on the queue's room subject by another's (roomSub).
	fetched chan struct{}
	roomSub *nats.Subscription // where the consumers are elsewhere, or some of them; nil if none or the subscription failed

	// the consumer side, used by the engine's pump only
	cons     jetstream.Consumer
	inbox    chan jetstream.Msg // fetched, held, not yet decoded
	idle     chan struct{}      // a fetch found nothing; it waits on resume before the next
	resume   chan struct{}
	room     chan struct{} // an item has left the inbox
	fetchErr chan error
	// later brings the items whose bytes were fetched again after their
	// holder's loss (refetch), refetching how many are under way
	later      chan laterItem
	refetching atomic.Int32
	ended      map[int]bool
	endErrs    int // ends' failed reads in a row

	// ahead are the large items' bytes being fetched before their turn
	// (at most aheadMax at once), by id
	ahead      map[string]*fetching
	aheadSlots chan struct{}

	hmu       sync.Mutex
	seen      seenIDs                  // ids handed on lately, or committed lately: redeliveries are dropped
	held      map[string]jetstream.Msg // fetched and not yet acked, by id: the latest delivery
	following map[string]bool          // ids followed by a restartable replica, until committed
}

// New is queue qi of edge e (the ei-th of the graph's edges) as the share
// of env sees it. Where its producers here have consumers elsewhere, it
// hears their grants on the queue's room subject.
func New(env *Env, e *graph.Edge, ei, qi int) *Queue {
	q := &Queue{env: env, edge: e, ei: ei, qi: qi, subject: wire.SubjQueue(env.Job.Run, ei, qi),
		producers: e.Queues[qi].Producers, seen: seenIDs{window: 4 * env.Job.Timings.AckWait},
		held: map[string]jetstream.Msg{}, following: map[string]bool{}, fetched: make(chan struct{})}
	for _, p := range q.producers {
		if env.Job.Place[e.From.Stage.Name][p] == env.Instance {
			q.local = append(q.local, p)
		}
	}
	for _, c := range e.Queues[qi].Consumers {
		if env.Job.Place[e.To.Stage.Name][c] == env.Instance {
			q.consumers++
			q.localConsumers = append(q.localConsumers, c)
		}
	}
	q.id = wire.Token(env.Instance) + "-" + strconv.Itoa(ei) + "-" + strconv.Itoa(qi)
	q.pcond.L = &q.pmu
	if len(q.local) > 0 && q.consumers < len(e.Queues[qi].Consumers) {
		// A failed subscription leaves the producers to read the room
		// more often (waitRoom), as they did before it was said.
		q.roomSub, _ = env.NC.Subscribe(wire.SubjRoom(env.Job.Run, ei, qi), func(m *nats.Msg) {
			from, n, ok := parseGrant(m.Data)
			if ok && from != env.Instance { // its own consumer side grants directly
				q.granted(n)
			}
		})
	}
	q.inbox = make(chan jetstream.Msg, 2*q.batch()) // here, not at the first Recv: Held reads it
	return q
}

// StopGrants stops hearing the consumers' grants, once the share's
// background group has ended.
func (q *Queue) StopGrants() {
	if q.roomSub != nil {
		q.roomSub.Unsubscribe()
	}
}

// Send publishes item once the queue has room for it, and returns without
// waiting for the server's answer (the publisher, publish.go, takes it):
// the engine counts the item sent. What a restartable replica sends
// derives from the item in hand: its id follows from that item's, so sent
// again after a loss, to whichever queue of the edge, it is a duplicate
// the edge's stream drops, and the item in hand is settled only once
// every answer is back (pub.from, the receipt it derives from).
func (q *Queue) Send(ctx context.Context, item any, from engine.Origin) error {
	wire, parts, err := items.Encode(item)
	if err != nil {
		return fmt.Errorf("%s crosses hosts: %w", q.Name(), err)
	}
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	id := q.id + "-" + strconv.FormatInt(q.seq.Add(1), 10)
	t, derived := from.Receipt.(Receipt)
	if derived {
		id = DerivedID(t.ID(), from.Sent, strconv.Itoa(q.ei))
	}
	m := nats.NewMsg(q.subject)
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Header.Set(hdrWire, wire)
	if k, ok := item.(nodes.Keyed); ok && k.Key() != "" {
		m.Header.Set(hdrKey, k.Key()) // a key outside the wire encoding (items.Blob's)
	}
	if err := q.waitRoom(ctx); err != nil {
		return err
	}
	p := &pub{msg: m, id: id}
	if derived {
		p.from = t
	}
	if size > q.env.Threshold {
		// The bytes stay here, for the consumer to fetch; the message
		// says where (package dataplane). Held already: for the message that
		// stands, which this one duplicates.
		var from dataplane.Input
		if p.from != nil {
			from = p.from
		}
		p.held = q.env.DP.Put(id, parts, q, from)
		m.Header.Set(dataplane.HdrRef, q.env.DP.Addr())
		m.Header.Set(hdrHolder, q.env.Share.Worker())
		m.Header.Set(hdrSize, strconv.Itoa(size))
		if q.env.DP.Pin() != "" {
			m.Header.Set(dataplane.HdrPin, q.env.DP.Pin())
		}
	} else if len(parts) == 1 {
		m.Data = parts[0]
	} else {
		m.Data = bytes.Join(parts, nil)
	}
	return q.publish(ctx, p)
}

// Recv returns the next item; ok is false once every producer wired to
// the queue, on every worker, has ended and the stream is empty.
func (q *Queue) Recv(ctx context.Context) (engine.Delivery, bool, error) {
	var none engine.Delivery
	if q.cons == nil {
		c, err := q.env.JS.Consumer(ctx, wire.StreamEdge(q.env.Job.Run, q.ei), wire.ConsumerQueue(q.qi))
		if err != nil {
			return none, false, err
		}
		q.cons, q.ended = c, map[int]bool{}
		q.idle, q.fetchErr = make(chan struct{}), make(chan error, 1)
		q.later = make(chan laterItem)
		q.ahead, q.aheadSlots = map[string]*fetching{}, make(chan struct{}, aheadMax)
		q.resume = make(chan struct{}, 1)
		q.room = make(chan struct{}, 1)
		q.env.Go(q.fetch)
	}
	for {
		select {
		case m := <-q.inbox:
			select {
			case q.room <- struct{}{}:
			default:
			}
			d, dup, err := q.decode(ctx, m)
			if err != nil {
				return none, false, err
			}
			if !dup {
				return d, true, nil
			}
		case <-q.idle:
			// A fetch found nothing and waits: with no pull of this share's
			// outstanding and nothing in the inbox, maybe the queue has
			// ended. (The inbox may still hold the batch before: a fetch
			// goes while the consumers take it.)
			if len(q.inbox) > 0 || q.refetching.Load() > 0 {
				q.resume <- struct{}{}
				continue
			}
			end, err := q.ends(ctx)
			q.resume <- struct{}{}
			if err != nil || end {
				return none, false, err
			}
		case it := <-q.later:
			if it.err != nil {
				return none, false, it.err
			}
			q.hmu.Lock()
			delete(q.following, it.m.Headers().Get(jetstream.MsgIDHeader)) // take follows it again, or acks it
			q.hmu.Unlock()
			d, err := q.finish(it.m, it.data, it.r, true)
			if err != nil {
				return none, false, err
			}
			return d, true, nil
		case err := <-q.fetchErr:
			return none, false, err
		case <-ctx.Done():
			return none, false, ctx.Err()
		}
	}
}

// batch is half what the consumer side's inbox holds (the room its pulls
// ask for, pull.go): half the capacity (at most 256), shared out over the
// consumer replicas so that one worker does not hold a shared queue's
// whole capacity.
func (q *Queue) batch() int {
	return max(1, min(q.edge.Capacity/2, 256)/max(1, len(q.edge.Queues[q.qi].Consumers)))
}

// saidRoom grants the producers the room n fetched messages made: to the
// producer replicas here at once, to those elsewhere in a word on the
// queue's room subject (a grant, grantWord).
func (q *Queue) saidRoom(n int) {
	if len(q.local) > 0 {
		q.granted(n)
	}
	if len(q.local) < len(q.producers) {
		q.env.NC.Publish(wire.SubjRoom(q.env.Job.Run, q.ei, q.qi), grantWord(q.env.Instance, n))
	}
}

// granted takes this share's part of a grant of n (its producer replicas'
// part of the queue's: every producer share hears every grant) as credit,
// and wakes the producers here waiting for room (waitRoom). The parts are
// rounded down, the fractions kept: the credits of all producer shares
// never add up to more than the room the consumers made.
func (q *Queue) granted(n int) {
	q.pmu.Lock()
	all := max(1, len(q.producers))
	q.grants += n * max(1, len(q.local)) // in parts of 1/all of a publish
	q.credit = min(q.credit+q.grants/all, q.part())
	q.grants %= all
	close(q.fetched)
	q.fetched = make(chan struct{})
	q.pmu.Unlock()
}

// part is the most credit this share holds: its producer replicas' part
// of the queue's capacity, rounded up (however much was granted or read,
// so that an idle share does not pile it up, nor shares that read the
// same room keep more than the capacity between them for long).
func (q *Queue) part() int {
	capacity := max(1, q.edge.Capacity)
	return max(1, (capacity*max(1, len(q.local))+len(q.producers)-1)/max(1, len(q.producers)))
}

// grantWord is a grant of n from the consumer side of share from, as it
// travels on a queue's room subject.
func grantWord(from string, n int) []byte {
	return []byte(strconv.Itoa(n) + " " + from)
}

// parseGrant reads a grantWord.
func parseGrant(b []byte) (from string, n int, ok bool) {
	num, from, ok := strings.Cut(string(b), " ")
	if !ok {
		return "", 0, false
	}
	n, err := strconv.Atoi(num)
	return from, n, err == nil && n > 0
}

// seenIDs are the ids of the items a queue's consumer side has handed
// on, for as long as a redelivery of one can still come: a message is
// redelivered only while unacked (ackWait after it was last kept), so an
// id is kept from when it is handed on for between window and twice that
// (two generations, the older dropped as a new one begins), and a followed
// item, in hand for longer, is known by q.following. So the ids stay a
// window's worth, not one per item of the run. Each is kept as 128 bits
// of hash (idKey), a third of what the string took: at tens of thousands
// of small items a second a window holds a million ids, and two ids
// whose keys met would drop the second item as a redelivery, a chance of
// about n²/2¹²⁹ for n ids in a window.
type seenIDs struct {
	cur, old map[idKey]struct{}
	since    time.Time
	window   time.Duration // 4 x the run's ack wait
}

// idKey is an id's key in seenIDs: two hashes of it under seeds of this
// process's own (the keys never leave it).
type idKey [2]uint64

var idSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

func keyOf(id string) idKey {
	return idKey{maphash.String(idSeeds[0], id), maphash.String(idSeeds[1], id)}
}

func (s *seenIDs) has(id string) bool {
	k := keyOf(id)
	_, cur := s.cur[k]
	_, old := s.old[k]
	return cur || old
}

func (s *seenIDs) add(id string) {
	if s.cur == nil || time.Since(s.since) > s.window {
		s.old, s.cur, s.since = s.cur, map[idKey]struct{}{}, time.Now()
	}
	s.cur[keyOf(id)] = struct{}{}
}

// decode rebuilds m's item, fetching its bytes from their holder, and
// takes it. dup is true for a redelivery of an item already handed on,
// and for an item whose holder is gone and whose bytes come later
// (refetch).
func (q *Queue) decode(ctx context.Context, m jetstream.Msg) (d engine.Delivery, dup bool, err error) {
	id := m.Headers().Get(jetstream.MsgIDHeader)
	if q.handedOn(id) {
		q.claim(id) // its bytes, if fetched again, are not needed
		// A redelivery of an item handed on here: acked if it was done
		// with, else the one in hand stays followed (its latest delivery
		// is what is kept alive and acked).
		if !q.isFollowed(id) {
			q.ack(id)
		}
		return d, true, nil
	}
	data := m.Data()
	r, onPlane := dataplane.RefOf(m.Headers())
	if onPlane {
		if data, err = q.bytesOf(ctx, r, id); err != nil {
			if ctx.Err() != nil {
				return d, false, ctx.Err()
			}
			if !q.env.Share.Restartable(q.edge.From.Stage) {
				return d, false, fmt.Errorf("%s: the bytes of item %s are held by worker %s (data plane %s), which did not give them: %w; they are nowhere else, and stage %q does not restart to send them again",
					q.Name(), id, m.Headers().Get(hdrHolder), r.Addr, err, q.edge.From.Stage.Name)
			}
			// Its producer restarts elsewhere: the input comes back, and the
			// item is sent again from there (rehold). Meanwhile the items
			// behind it go first: a consumer that waited for it would hold
			// up what has to move for the input to be done again (the
			// producers, blocked on queues that consumer does not drain).
			q.refetch(ctx, m, r, id, err)
			return d, true, nil
		}
	}
	d, err = q.finish(m, data, r, onPlane)
	return d, false, err
}

// take acks the item id now, unless the consuming stage restarts
// elsewhere on a loss: then it returns the item's receipt, which travels
// with the item to the replica that receives it (the engine keeps it as
// that replica's delivery in hand) and is settled once the replica has
// done with it (settle.Taken.Done), whatever the item's type.
func (q *Queue) take(id string, r *ref) engine.Receipt {
	if !q.env.Share.Restartable(q.edge.To.Stage) {
		if r != nil {
			q.ackSync(id) // the bytes go only once the ack is the server's
		} else {
			q.ack(id)
		}
		q.Release(id, r)
		return nil
	}
	q.hmu.Lock()
	q.following[id] = true
	m := q.held[id]
	q.hmu.Unlock()
	again := false
	if m != nil {
		md, err := m.Metadata()
		again = err != nil || md.NumDelivered > 1 // unknown: maybe
	}
	return q.env.Share.Take(q, id, r, again)
}

func (q *Queue) isFollowed(id string) bool {
	q.hmu.Lock()
	defer q.hmu.Unlock()
	return q.following[id]
}

// HeldMsg is id's latest delivery: what acks it.
func (q *Queue) HeldMsg(id string) jetstream.Msg {
	q.hmu.Lock()
	defer q.hmu.Unlock()
	return q.held[id]
}

// Committed ends the following of id: the server has its ack.
func (q *Queue) Committed(id string) {
	q.hmu.Lock()
	delete(q.held, id)
	delete(q.following, id)
	q.seen.add(id) // a redelivery waiting in the inbox is still dropped
	q.hmu.Unlock()
}

// handedOn says whether id was handed on here lately, or is in hand.
func (q *Queue) handedOn(id string) bool {
	q.hmu.Lock()
	defer q.hmu.Unlock()
	return q.seen.has(id) || q.following[id]
}

// hold keeps m from redelivery until it is acked (touch).
func (q *Queue) hold(m jetstream.Msg) {
	id := m.Headers().Get(jetstream.MsgIDHeader)
	q.hmu.Lock()
	q.held[id] = m
	q.hmu.Unlock()
}

// ack acks the latest delivery of id.
func (q *Queue) ack(id string) {
	q.hmu.Lock()
	m := q.held[id]
	delete(q.held, id)
	q.hmu.Unlock()
	if m != nil {
		m.Ack()
	}
}

// ackSync acks the latest delivery of id and waits for the server to
// confirm it (a few tries), for an item whose bytes are released after.
func (q *Queue) ackSync(id string) {
	q.hmu.Lock()
	m := q.held[id]
	delete(q.held, id)
	q.hmu.Unlock()
	if m == nil {
		return
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(q.env.Stop, 5*time.Second)
		err := m.DoubleAck(ctx)
		cancel()
		if err == nil || q.env.Stop.Err() != nil {
			return
		}
	}
}

// stores says whether the queue's stream still stores the message of
// that sequence (not yet acked); true when it cannot tell.
func (q *Queue) stores(ctx context.Context, seq uint64) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	s, err := q.env.JS.Stream(ctx, wire.StreamEdge(q.env.Job.Run, q.ei))
	if err != nil {
		return true
	}
	_, err = s.GetMsg(ctx, seq)
	return !errors.Is(err, jetstream.ErrMsgNotFound)
}

// Touch keeps the held items from being redelivered.
func (q *Queue) Touch() {
	if q.env.Share.Released() || !q.env.Share.Renews() {
		return
	}
	q.hmu.Lock()
	held := make([]jetstream.Msg, 0, len(q.held))
	for _, m := range q.held {
		held = append(held, m)
	}
	q.hmu.Unlock()
	for _, m := range held {
		m.InProgress()
	}
}

// ends reports whether the queue has ended: every producer's end key is
// there and no message is left to deliver. Called while no pull of this
// share's is outstanding, so none is on its way here; items in other
// shares' hands are theirs, as in process. A share that took over a lost
// worker's replicas waits first for what that worker held to come back
// (ackWait after the lost share last kept them, which it stops doing when
// told it is lost, before the restart starts).
func (q *Queue) ends(ctx context.Context) (bool, error) {
	if q.env.Job.Restart && time.Since(q.env.Started) < q.env.Job.Timings.RestartGuard() {
		return false, nil
	}
	// A producer replica of this instance ends when it returns here: an
	// end key there already is an earlier incarnation's (its worker lost
	// after that end but before the replica was recorded settled and
	// seen done, so restarted to settle what it left), and the consumer
	// that took it would return while the restart still runs, which the
	// engine counts as leaving its input unread.
	if len(q.local) > 0 && !q.closed.Load() {
		return false, nil
	}
	for _, p := range q.producers {
		if q.ended[p] {
			continue
		}
		if _, err := q.env.Ends.Get(ctx, wire.KeyEnd(q.ei, q.qi, p)); err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				q.endErrs = 0
				return false, nil
			}
			return false, q.endErr(ctx, "the end of producer replica "+strconv.Itoa(p), err)
		}
		q.ended[p] = true
	}
	info, err := q.cons.Info(ctx)
	if err != nil {
		return false, q.endErr(ctx, "the queue's consumer", err)
	}
	q.endErrs = 0
	if info.NumPending != 0 {
		return false, nil
	}
	q.finished.Store(true)
	return true, nil
}

// Held implements engine.Holder: the messages fetched here and not yet
// handed on (in the inbox), for the consumers that have all returned.
func (q *Queue) Held() int { return len(q.inbox) }

// ConsumersGone records that this instance's consumer replicas of the
// queue have returned (engine.ConsumersGoner).
func (q *Queue) ConsumersGone() {
	if q.env.Share.Aborting() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, c := range q.localConsumers {
		q.env.Ends.Put(ctx, wire.KeyGone(q.ei, q.qi, c), []byte(q.env.Instance))
	}
}

// consumersGone reports whether every consumer replica the graph wires to
// the queue has returned, wherever it ran.
func (q *Queue) consumersGone(ctx context.Context, qi int) bool {
	for _, c := range q.edge.Queues[qi].Consumers {
		if _, err := q.env.Ends.Get(ctx, wire.KeyGone(q.ei, qi, c)); err != nil {
			return false
		}
	}
	return true
}

// endErr is nil while a read for ends may still be a passing failure (a
// reconnection), then an error saying what could not be read.
func (q *Queue) endErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if q.endErrs++; q.endErrs < 20 {
		return nil
	}
	return fmt.Errorf("%s: cannot read %s on worker %s for 20 tries (if the server is up, does the worker's NATS user have JetStream key-value and consumer rights?): %w", q.Name(), what, q.env.Share.Worker(), err)
}

// Close writes the end key of every producer replica of this instance,
// trying for up to 10s; a key that cannot be written fails the share (its
// consumers would wait for ever).
func (q *Queue) Close() {
	if q.env.Share.Aborting() {
		return
	}
	if err := q.Flush(); err != nil {
		return // the share fails (answered): no end is written ahead of an item
	}
	// Within the share's run: aborted (counted lost, the run over), it
	// records no end, and stops trying at once rather than outlive the
	// engine's grace.
	ctx, cancel := context.WithTimeout(q.env.Share.RunCtx(), 10*time.Second)
	defer cancel()
	for _, p := range q.local {
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			_, err := q.env.Ends.Put(ctx, wire.KeyEnd(q.ei, q.qi, p), []byte(q.env.Instance))
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				q.env.Share.Fail(fmt.Errorf("%s: the end of producer replica %d could not be recorded on worker %s: %v", q.Name(), p, q.env.Share.Worker(), err))
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
	}
	q.closed.Store(true)
}

// Depth is the stream's depth as last read: the messages it stores, those
// delivered to a consumer's worker and not yet acked included, shown at
// most the edge's capacity. An item at hand in a consumer worker's engine
// (acked, one per consumer worker) is not counted.
func (q *Queue) Depth() int {
	if q.finished.Load() {
		return 0
	}
	return int(min(q.depth.Load(), int64(q.edge.Capacity)))
}

func (q *Queue) ReadDepth() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if n, err := q.stored(ctx); err == nil { // the room's reading, on the stream it keeps
		q.depth.Store(int64(n))
	}
}
