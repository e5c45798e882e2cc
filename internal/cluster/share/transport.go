package share

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/dataplane"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
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

// links are one instance's transports: the engine's TransportFor, and what
// they share (the connection, the blob stream, the end bucket, the items
// held unacked).
type links struct {
	nc        *nats.Conn
	js        jetstream.JetStream
	job       *wire.Job
	g         *graph.Graph
	instance  string
	worker    string // the worker's name (instance is the share's)
	ends      jetstream.KeyValue
	holders   jetstream.KeyValue // where large items sent again are held (rehold)
	positions jetstream.KeyValue // how far resuming sources have gone (resume.go)
	// dp holds the bytes of the large items this share sends, for their
	// consumers to fetch, and fetches those it receives (package dataplane);
	// threshold is the size past which an item's bytes take it
	dp        *dataplane.Plane
	threshold int

	// restartable says whether a stage's replicas restart elsewhere when
	// their worker is lost: the items they take then come with a receipt,
	// settled (acked by this share) once finished and what was sent from
	// them is stored (ledger.go), so a loss redelivers what they had not
	// finished.
	restartable func(*graph.Stage) bool
	// syncs says whether a stage's replicas step together: a node that
	// starts them as distributed ranks learns where each runs (ranks.go)
	syncs func(*graph.Stage) bool
	// whole says whether a stage's group restarts whole after a member's
	// loss (Spec.Whole): its ranks wait for that (ranks.go)
	whole func(*graph.Stage) bool
	// summing says whether a stage is a group of a kind that moves whose
	// members sum in this process (localGroup); locals their records
	summing   func(*graph.Stage) bool
	locals    map[string]*localGroup
	remotes   map[string]*group.Member // its groups across workers, by stage (pmu)
	ledger    *ledger
	started   time.Time
	afterSend func(stage string) // WorkerOptions.AfterSend
	logw      io.Writer          // the worker's log (nil: none)
	// released is set once the share is counted lost: it no longer keeps
	// its items from redelivery, so they reach the share that took over
	// within ackWait.
	released atomic.Bool
	// renew says whether renewals may go (the worker's; nil: always)
	renew func() bool
	// ctx is the share's run: once it is cancelled (an abort), the share
	// records no end of input and no consumer gone, for its replicas may
	// run on in another share
	ctx context.Context
	// fatal fails the share with err (a publish refused, an end of input
	// that could not be recorded).
	fatal func(error)
	// chains is the share's side of its chains' figures (chain.go)
	chains chains
	pmu    sync.Mutex
	// rank0s are where the group stages' ranks 0 this share runs listen,
	// by keyRank0 (ranks.go)
	rank0s map[string]*rank0
	// replicas are the restartable replicas the share follows
	replicas map[replicaKey]*tracked

	mu     sync.Mutex
	queues []*jsQueue
	// bg is the share's background work, one group: keep-alive and its
	// renewals, settling, each queue's publish answerer and pull loop,
	// fetches ahead and again, releases, settled records, and the watch
	// of the coordinator's lease (worker.serve). stopCtx is its
	// cancellation: done once close begins, when every one of them ends
	// (what is under way ends with it); close then waits for the group.
	// Nothing starts in it once stopCtx is done where it could start
	// after close (recordLocked, under mu).
	bg         sync.WaitGroup
	stopCtx    context.Context
	stopCancel context.CancelFunc
}

// newLinks sets up a share's transports; dataAddr is the address its data
// plane listens on and other hosts reach it by ("": the host's address on
// the route to the broker, any free port).
func newLinks(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, job *wire.Job, g *graph.Graph, instance, dataAddr string) (*links, error) {
	l := &links{nc: nc, js: js, job: job, g: g, instance: instance,
		replicas: map[replicaKey]*tracked{}}
	l.stopCtx, l.stopCancel = context.WithCancel(context.Background())
	own := *job // its own copy: the job may be shared (tests), and is read here for the share's life
	own.Timings = own.Timings.WithDefaults()
	l.job = &own
	l.ledger = newLedger(l)
	l.chains.sources = job.Recount.Sources
	l.started = time.Now()
	l.ctx = ctx
	var err error
	if l.ends, err = js.KeyValue(ctx, wire.BucketEnds(job.Run)); err != nil {
		return nil, fmt.Errorf("end bucket: %w", err)
	}
	if l.holders, err = js.KeyValue(ctx, wire.BucketHolders(job.Run)); err != nil {
		return nil, fmt.Errorf("holder bucket: %w", err)
	}
	if l.positions, err = js.KeyValue(ctx, wire.BucketPositions(job.Run)); err != nil {
		return nil, fmt.Errorf("position bucket: %w", err)
	}
	l.threshold = job.DataThreshold
	if l.threshold <= 0 {
		l.threshold = dataplane.Threshold
	}
	// A message must hold what stays on the broker: past the payload
	// limit, the data plane, whatever the threshold.
	l.threshold = min(l.threshold, int(nc.MaxPayload())-4096)
	if dataAddr == "" {
		dataAddr = dataplane.Host(nc)
	}
	_, tlsErr := nc.TLSConnectionState()
	if l.dp, err = dataplane.New(job.Run, job.DataKey, dataAddr, tlsErr == nil); err != nil {
		return nil, err
	}
	return l, nil
}

// For is the engine's TransportFor.
func (l *links) For(e *graph.Edge, qi int) engine.Transport {
	if !l.job.Remote[e.Name][qi] {
		return nil
	}
	ei := wire.EdgeIndex(l.g, e)
	q := &jsQueue{l: l, edge: e, ei: ei, qi: qi, subject: wire.SubjQueue(l.job.Run, ei, qi),
		producers: e.Queues[qi].Producers, seen: seenIDs{window: 4 * l.job.Timings.AckWait},
		held: map[string]jetstream.Msg{}, following: map[string]bool{}, fetched: make(chan struct{})}
	for _, p := range q.producers {
		if l.job.Place[e.From.Stage.Name][p] == l.instance {
			q.local = append(q.local, p)
		}
	}
	for _, c := range e.Queues[qi].Consumers {
		if l.job.Place[e.To.Stage.Name][c] == l.instance {
			q.consumers++
			q.localConsumers = append(q.localConsumers, c)
		}
	}
	q.id = wire.Token(l.instance) + "-" + strconv.Itoa(ei) + "-" + strconv.Itoa(qi)
	q.pcond.L = &q.pmu
	if len(q.local) > 0 && q.consumers < len(e.Queues[qi].Consumers) {
		// A failed subscription leaves the producers to read the room
		// more often (waitRoom), as they did before it was said.
		q.roomSub, _ = l.nc.Subscribe(wire.SubjRoom(l.job.Run, ei, qi), func(m *nats.Msg) {
			from, n, ok := parseGrant(m.Data)
			if ok && from != l.instance { // its own consumer side grants directly
				q.granted(n)
			}
		})
	}
	q.inbox = make(chan jetstream.Msg, 2*q.batch()) // here, not at the first Recv: Held reads it
	l.mu.Lock()
	l.queues = append(l.queues, q)
	l.mu.Unlock()
	return q
}

// log is the worker's log.
func (l *links) log() io.Writer {
	if l.logw == nil {
		return io.Discard
	}
	return l.logw
}

// runCtx is the share's run context (Background for links without one).
func (l *links) runCtx() context.Context {
	if l.ctx == nil {
		return context.Background()
	}
	return l.ctx
}

// start starts the background work (renewals, depth reads, settles),
// once the fields the caller sets are set.
func (l *links) start() {
	l.bg.Go(l.keepAlive)
	l.bg.Go(l.ledger.run)
}

// aborting says the share is being aborted or was counted lost: what its
// replicas did not finish is not theirs to end.
func (l *links) aborting() bool {
	return l.released.Load() || (l.ctx != nil && l.ctx.Err() != nil)
}

// close stops the background work (cancels its group and waits for it)
// and the data plane.
func (l *links) close() {
	l.mu.Lock()
	l.stopCancel()
	l.mu.Unlock()
	l.bg.Wait()
	for _, q := range l.queueList() {
		if q.roomSub != nil {
			q.roomSub.Unsubscribe()
		}
	}
	l.dp.Close()
}

// keepAlive reads every queue's depth every 250ms, and keeps the items
// held by this instance from being redelivered while it lives (every
// 750ms, on a goroutine of its own so that slow reads cannot delay it).
func (l *links) keepAlive() {
	every := func(d time.Duration, f func(*jsQueue)) {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-l.stopCtx.Done():
				return
			case <-t.C:
			}
			l.mu.Lock()
			qs := append([]*jsQueue(nil), l.queues...)
			l.mu.Unlock()
			for _, q := range qs {
				f(q)
			}
		}
	}
	l.bg.Go(func() { every(l.job.Timings.AckWait/4, (*jsQueue).touch) })
	every(250*time.Millisecond, func(q *jsQueue) {
		q.readDepth()
		q.l.dp.SweepReheld(q.l.stopCtx, q) // cheap while nothing is reheld
	})
}

// readDepths reads every queue's depth now.
func (l *links) readDepths() {
	for _, q := range l.queueList() {
		q.readDepth()
	}
}

// sent is s with a finished producer replica shown not done while a
// remote queue it feeds is not yet closed (its last publishes may be
// unanswered): the coordinator takes a replica lost done as having sent
// all it will, and writes its ends for it.
func (l *links) sent(s *report.Snapshot) *report.Snapshot {
	for _, q := range l.queueList() {
		if q.closed.Load() {
			continue
		}
		st := s.Stage(q.edge.From.Stage.Name)
		if st == nil {
			continue
		}
		for _, p := range q.local {
			if p < len(st.Replicas) {
				st.Replicas[p].Done = false
			}
		}
	}
	return s
}

// queueList is the share's queues now.
func (l *links) queueList() []*jsQueue {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*jsQueue(nil), l.queues...)
}

// jsQueue is one queue of an edge on JetStream, as one instance sees it.
type jsQueue struct {
	l              *links
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
	bounded    int                // publishes the stream's bound allows until the store is read again
	unanswered int                // publishes issued, not yet answered
	pubs       chan *pub          // issued, in order, for the answerer
	pubErr     error              // the first publish refused
	pstream    jetstream.Stream   // the edge's stream, read for room
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

func (q *jsQueue) name() string { return fmt.Sprintf("edge %q queue %d", q.edge.Name, q.qi) }

// Send publishes item once the queue has room for it, and returns without
// waiting for the server's answer (the publisher, publish.go, takes it):
// the engine counts the item sent. What a restartable replica sends
// derives from the item in hand: its id follows from that item's, so sent
// again after a loss, to whichever queue of the edge, it is a duplicate
// the edge's stream drops, and the item in hand is settled only once
// every answer is back (pub.from, the receipt it derives from).
func (q *jsQueue) Send(ctx context.Context, item any, from engine.Origin) error {
	wire, parts, err := items.Encode(item)
	if err != nil {
		return fmt.Errorf("%s crosses hosts: %w", q.name(), err)
	}
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	id := q.id + "-" + strconv.FormatInt(q.seq.Add(1), 10)
	t, derived := from.Receipt.(*taken)
	if derived {
		id = "f" + origin{id: t.ident(), k: from.Sent}.hash(strconv.Itoa(q.ei))
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
	if size > q.l.threshold {
		// The bytes stay here, for the consumer to fetch; the message
		// says where (package dataplane). Held already: for the message that
		// stands, which this one duplicates.
		var from dataplane.Input
		if p.from != nil {
			from = heldFrom{p.from, q.l.ledger}
		}
		p.held = q.l.dp.Put(id, parts, q, from)
		m.Header.Set(dataplane.HdrRef, q.l.dp.Addr())
		m.Header.Set(hdrHolder, q.l.worker)
		m.Header.Set(hdrSize, strconv.Itoa(size))
		if q.l.dp.Pin() != "" {
			m.Header.Set(dataplane.HdrPin, q.l.dp.Pin())
		}
	} else if len(parts) == 1 {
		m.Data = parts[0]
	} else {
		m.Data = bytes.Join(parts, nil)
	}
	return q.publish(ctx, p)
}

func isFull(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == 10077 { // JSStreamStoreFailedF: "maximum messages exceeded"
		return true
	}
	s := err.Error()
	return strings.Contains(s, "maximum messages") || strings.Contains(s, "maximum bytes")
}

// Recv returns the next item; ok is false once every producer wired to
// the queue, on every worker, has ended and the stream is empty.
func (q *jsQueue) Recv(ctx context.Context) (engine.Delivery, bool, error) {
	var none engine.Delivery
	if q.cons == nil {
		c, err := q.l.js.Consumer(ctx, wire.StreamEdge(q.l.job.Run, q.ei), wire.ConsumerQueue(q.qi))
		if err != nil {
			return none, false, err
		}
		q.cons, q.ended = c, map[int]bool{}
		q.idle, q.fetchErr = make(chan struct{}), make(chan error, 1)
		q.later = make(chan laterItem)
		q.ahead, q.aheadSlots = map[string]*fetching{}, make(chan struct{}, aheadMax)
		q.resume = make(chan struct{}, 1)
		q.room = make(chan struct{}, 1)
		q.l.bg.Go(q.fetch)
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
func (q *jsQueue) batch() int {
	return max(1, min(q.edge.Capacity/2, 256)/max(1, len(q.edge.Queues[q.qi].Consumers)))
}

// saidRoom grants the producers the room n fetched messages made: to the
// producer replicas here at once, to those elsewhere in a word on the
// queue's room subject (a grant, grantWord).
func (q *jsQueue) saidRoom(n int) {
	if len(q.local) > 0 {
		q.granted(n)
	}
	if len(q.local) < len(q.producers) {
		q.l.nc.Publish(wire.SubjRoom(q.l.job.Run, q.ei, q.qi), grantWord(q.l.instance, n))
	}
}

// granted takes this share's part of a grant of n (its producer replicas'
// part of the queue's: every producer share hears every grant) as credit,
// and wakes the producers here waiting for room (waitRoom). The parts are
// rounded down, the fractions kept: the credits of all producer shares
// never add up to more than the room the consumers made.
func (q *jsQueue) granted(n int) {
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
func (q *jsQueue) part() int {
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
// window's worth, not one per item of the run.
type seenIDs struct {
	cur, old map[string]bool
	since    time.Time
	window   time.Duration // 4 x the run's ack wait
}

func (s *seenIDs) has(id string) bool { return s.cur[id] || s.old[id] }

func (s *seenIDs) add(id string) {
	if s.cur == nil || time.Since(s.since) > s.window {
		s.old, s.cur, s.since = s.cur, map[string]bool{}, time.Now()
	}
	s.cur[id] = true
}

// decode rebuilds m's item, fetching its bytes from their holder, and
// takes it. dup is true for a redelivery of an item already handed on,
// and for an item whose holder is gone and whose bytes come later
// (refetch).
func (q *jsQueue) decode(ctx context.Context, m jetstream.Msg) (d engine.Delivery, dup bool, err error) {
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
			if q.l.restartable == nil || !q.l.restartable(q.edge.From.Stage) {
				return d, false, fmt.Errorf("%s: the bytes of item %s are held by worker %s (data plane %s), which did not give them: %w; they are nowhere else, and stage %q does not restart to send them again",
					q.name(), id, m.Headers().Get(hdrHolder), r.Addr, err, q.edge.From.Stage.Name)
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

// laterItem is an item whose bytes came back late (refetch), or the
// error that they did not.
type laterItem struct {
	m    jetstream.Msg
	data []byte
	r    ref
	err  error
}

// refetch fetches the bytes of m again in the background, from the
// holder a restart of its producer records (fetchAgain), and hands the
// item to Recv then. m stays held, and followed so that a redelivery of
// it is dropped, not acked.
func (q *jsQueue) refetch(ctx context.Context, m jetstream.Msg, r ref, id string, first error) {
	q.hmu.Lock()
	q.following[id] = true
	q.hmu.Unlock()
	q.refetching.Add(1)
	q.l.bg.Go(func() {
		defer q.refetching.Add(-1)
		it := laterItem{m: m}
		var err error
		if it.data, it.r, err = q.fetchAgain(ctx, r, id); err != nil && ctx.Err() == nil {
			it.err = fmt.Errorf("%s: the bytes of item %s are held by worker %s (data plane %s), which did not give them: %w; and no replica of stage %q sent them again within 2 minutes",
				q.name(), id, m.Headers().Get(hdrHolder), m.Headers().Get(dataplane.HdrRef), first, q.edge.From.Stage.Name)
		}
		if ctx.Err() != nil {
			return
		}
		select {
		case q.later <- it:
		case <-ctx.Done():
		case <-q.l.stopCtx.Done():
		}
	})
}

// finish rebuilds m's item from its bytes and takes it (take).
func (q *jsQueue) finish(m jetstream.Msg, data []byte, r ref, onPlane bool) (engine.Delivery, error) {
	id := m.Headers().Get(jetstream.MsgIDHeader)
	item, err := items.Decode(m.Headers().Get(hdrWire), data)
	if err != nil {
		q.ack(id)
		return engine.Delivery{}, fmt.Errorf("%s: %w", q.name(), err)
	}
	if b, ok := item.(*items.Blob); ok && b.ItemKey == "" {
		b.ItemKey = m.Headers().Get(hdrKey)
	}
	q.hmu.Lock()
	q.seen.add(id)
	q.hmu.Unlock()
	var held *ref
	if onPlane {
		held = &r
	}
	d := engine.Delivery{Item: item}
	if t := q.take(id, held); t != nil {
		d.Receipt = t // a nil *taken is no receipt
	}
	return d, nil
}

// aheadMax is how many large items' bytes a queue's consumer side fetches
// before their turn: the transfer of the next overlaps the wait for its
// message and the work on the one before.
const aheadMax = 2

// fetching is a fetch of an item's bytes begun before its turn.
type fetching struct {
	done chan struct{}
	data []byte
	err  error
}

// fetchAhead begins fetching the bytes of m's item when they are on a
// data plane, waiting while aheadMax fetches are under way or unclaimed
// (the pull loop then waits too: a bounded pipeline).
func (q *jsQueue) fetchAhead(m jetstream.Msg) {
	r, ok := dataplane.RefOf(m.Headers())
	if !ok {
		return
	}
	id := m.Headers().Get(jetstream.MsgIDHeader)
	select {
	case q.aheadSlots <- struct{}{}:
	case <-q.l.stopCtx.Done():
		return
	}
	f := &fetching{done: make(chan struct{})}
	q.hmu.Lock()
	if q.ahead[id] != nil {
		q.hmu.Unlock()
		<-q.aheadSlots
		return
	}
	q.ahead[id] = f
	q.hmu.Unlock()
	q.l.bg.Go(func() {
		defer close(f.done)
		ctx, cancel := context.WithCancel(q.l.runCtx())
		defer cancel()
		defer context.AfterFunc(q.l.stopCtx, cancel)()
		f.data, f.err = q.l.dp.Fetch(ctx, r, id)
	})
}

// claim takes id's fetch begun ahead, if any, freeing its slot.
func (q *jsQueue) claim(id string) *fetching {
	q.hmu.Lock()
	f := q.ahead[id]
	delete(q.ahead, id)
	q.hmu.Unlock()
	if f != nil {
		<-q.aheadSlots
	}
	return f
}

// bytesOf returns an item's bytes: fetched ahead, or now.
func (q *jsQueue) bytesOf(ctx context.Context, r ref, id string) ([]byte, error) {
	if f := q.claim(id); f != nil {
		select {
		case <-f.done:
			if f.err == nil {
				return f.data, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return q.l.dp.Fetch(ctx, r, id) // not fetched ahead, or that fetch failed: once more
}

// release tells the holder of an item's bytes that its message is acked:
// it may drop them (off the caller's path).
func (q *jsQueue) release(id string, r *ref) {
	if r == nil {
		return
	}
	q.l.bg.Go(func() {
		q.l.dp.Release(q.l.stopCtx, *r, id)
	})
}

// taken is an item taken from a queue for a restartable stage and not
// yet acked, with the counts of its work so far.
type taken struct {
	q   *jsQueue
	id  string
	ref *ref     // its bytes are on a data plane, released once acked
	by  *tracked // the replica that took it (nil: a source's)
	lg  *ledger  // what settles it
	// a resuming source's item (q nil): its replica's position, its index
	pos *sourcePos
	k   int64
	// dropped: its replica dropped it, the state it restored having
	// trained on it; in a save already unless keep (the round it was
	// trained in, a save of which still has to come)
	dropped bool
	// again: the server had delivered it before (a stream's item)
	again bool
	keep  uint32
	// a chain's item (chain.go): parent is the delivery it derives from,
	// head the input at its chain's head, ei the index of the chained
	// edge it was sent on, sent how many its parent's replica had sent
	// from it before
	parent, head *taken
	ei, sent     int
	idOnce       sync.Once // its id, derived when first asked (ident)

	// settled: once its replica has done with it and every publish of
	// what it sent has its answer, it joins the ledger's next settle
	mu       sync.Mutex
	finished bool // its replica has asked for the next item, or returned
	queued   bool // handed to the ledger: once, whatever a node does
	under    int  // publishes derived from it, unanswered
	// chain counts, on a chain's head, what was derived from it on each
	// chained edge, by edge index
	chain []int64
}

// derive notes a publish of an item sent from t, under way.
func (t *taken) derive() {
	t.mu.Lock()
	t.under++
	t.mu.Unlock()
}

// answered notes a publish from t answered; t is settled if it was the
// last and t is finished.
func (t *taken) answered(lg *ledger) {
	t.mu.Lock()
	t.under--
	settle := t.under == 0 && t.finished && !t.queued
	t.queued = t.queued || settle
	t.mu.Unlock()
	if settle {
		t.settled(lg)
	}
}

// finish notes that t's replica has done with it; t is settled if nothing
// it sent is under way.
func (t *taken) finish(lg *ledger) {
	t.mu.Lock()
	t.finished = true
	settle := t.under == 0 && !t.queued
	t.queued = t.queued || settle
	t.mu.Unlock()
	if settle {
		t.settled(lg)
	}
}

// take acks the item id now, unless the consuming stage restarts
// elsewhere on a loss: then it returns the item's receipt, which travels
// with the item to the replica that receives it (the engine keeps it as
// that replica's delivery in hand) and is settled once the replica has
// done with it (taken.Done), whatever the item's type.
func (q *jsQueue) take(id string, r *ref) *taken {
	if q.l.restartable == nil || !q.l.restartable(q.edge.To.Stage) {
		if r != nil {
			q.ackSync(id) // the bytes go only once the ack is the server's
		} else {
			q.ack(id)
		}
		q.release(id, r)
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
	return &taken{q: q, id: id, ref: r, lg: q.l.ledger, again: again}
}

func (q *jsQueue) isFollowed(id string) bool {
	q.hmu.Lock()
	defer q.hmu.Unlock()
	return q.following[id]
}

// heldMsg is id's latest delivery: what acks it.
func (q *jsQueue) heldMsg(id string) jetstream.Msg {
	q.hmu.Lock()
	defer q.hmu.Unlock()
	return q.held[id]
}

// committed ends the following of t: the server has its ack.
func (q *jsQueue) committed(t *taken) {
	q.hmu.Lock()
	delete(q.held, t.id)
	delete(q.following, t.id)
	q.seen.add(t.id) // a redelivery waiting in the inbox is still dropped
	q.hmu.Unlock()
}

// handedOn says whether id was handed on here lately, or is in hand.
func (q *jsQueue) handedOn(id string) bool {
	q.hmu.Lock()
	defer q.hmu.Unlock()
	return q.seen.has(id) || q.following[id]
}

// hold keeps m from redelivery until it is acked (touch).
func (q *jsQueue) hold(m jetstream.Msg) {
	id := m.Headers().Get(jetstream.MsgIDHeader)
	q.hmu.Lock()
	q.held[id] = m
	q.hmu.Unlock()
}

// ack acks the latest delivery of id.
func (q *jsQueue) ack(id string) {
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
func (q *jsQueue) ackSync(id string) {
	q.hmu.Lock()
	m := q.held[id]
	delete(q.held, id)
	q.hmu.Unlock()
	if m == nil {
		return
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(q.l.stopCtx, 5*time.Second)
		err := m.DoubleAck(ctx)
		cancel()
		if err == nil || q.l.stopCtx.Err() != nil {
			return
		}
	}
}

// stores says whether the queue's stream still stores the message of
// that sequence (not yet acked); true when it cannot tell.
func (q *jsQueue) stores(ctx context.Context, seq uint64) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	s, err := q.l.js.Stream(ctx, wire.StreamEdge(q.l.job.Run, q.ei))
	if err != nil {
		return true
	}
	_, err = s.GetMsg(ctx, seq)
	return !errors.Is(err, jetstream.ErrMsgNotFound)
}

// touch keeps the held items from being redelivered.
func (q *jsQueue) touch() {
	if q.l.released.Load() || (q.l.renew != nil && !q.l.renew()) {
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
func (q *jsQueue) ends(ctx context.Context) (bool, error) {
	if q.l.job.Restart && time.Since(q.l.started) < q.l.job.Timings.RestartGuard() {
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
		if _, err := q.l.ends.Get(ctx, wire.KeyEnd(q.ei, q.qi, p)); err != nil {
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
func (q *jsQueue) Held() int { return len(q.inbox) }

// ConsumersGone records that this instance's consumer replicas of the
// queue have returned (engine.ConsumersGoner).
func (q *jsQueue) ConsumersGone() {
	if q.l.aborting() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, c := range q.localConsumers {
		q.l.ends.Put(ctx, wire.KeyGone(q.ei, q.qi, c), []byte(q.l.instance))
	}
}

// consumersGone reports whether every consumer replica the graph wires to
// the queue has returned, wherever it ran.
func (q *jsQueue) consumersGone(ctx context.Context, qi int) bool {
	for _, c := range q.edge.Queues[qi].Consumers {
		if _, err := q.l.ends.Get(ctx, wire.KeyGone(q.ei, qi, c)); err != nil {
			return false
		}
	}
	return true
}

// endErr is nil while a read for ends may still be a passing failure (a
// reconnection), then an error saying what could not be read.
func (q *jsQueue) endErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if q.endErrs++; q.endErrs < 20 {
		return nil
	}
	return fmt.Errorf("%s: cannot read %s on worker %s for 20 tries (if the server is up, does the worker's NATS user have JetStream key-value and consumer rights?): %w", q.name(), what, q.l.worker, err)
}

// Close writes the end key of every producer replica of this instance,
// trying for up to 10s; a key that cannot be written fails the share (its
// consumers would wait for ever).
func (q *jsQueue) Close() {
	if q.l.aborting() {
		return
	}
	if err := q.flush(); err != nil {
		return // the share fails (answered): no end is written ahead of an item
	}
	// Within the share's run: aborted (counted lost, the run over), it
	// records no end, and stops trying at once rather than outlive the
	// engine's grace.
	ctx, cancel := context.WithTimeout(q.l.runCtx(), 10*time.Second)
	defer cancel()
	for _, p := range q.local {
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			_, err := q.l.ends.Put(ctx, wire.KeyEnd(q.ei, q.qi, p), []byte(q.l.instance))
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				if q.l.fatal != nil && !q.l.aborting() {
					q.l.fatal(fmt.Errorf("%s: the end of producer replica %d could not be recorded on worker %s: %v", q.name(), p, q.l.worker, err))
				}
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

// Depth is the stream's depth as last read: the messages it stores, at
// most the edge's capacity (MaxMsgs), those delivered to a consumer's
// worker and not yet acked included. An item at hand in a consumer
// worker's engine (acked, one per consumer worker) is not counted.
func (q *jsQueue) Depth() int {
	if q.finished.Load() {
		return 0
	}
	return int(min(q.depth.Load(), int64(q.edge.Capacity)))
}

func (q *jsQueue) readDepth() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if n, err := q.stored(ctx); err == nil { // the room's reading, on the stream it keeps
		q.depth.Store(int64(n))
	}
}
