package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// Exactly once across a lost worker.
//
// A replica of a stage that restarts elsewhere (a restartable stage: its
// kind is stateless and it does not step with the others) reads only
// queues on JetStream (remoteQueues), so whatever it has not finished is
// still in a stream when its worker is lost. What it has finished must be
// counted once and never come back. Both are settled by one ledger,
// through the coordinator:
//
//   - a restartable replica's node is wrapped (track): what it takes is
//     followed from Recv to its next Recv (or the return of its Run), and
//     what it sends in between derives from it: its id on a queue follows
//     from the input's id, so a restart that sends it again publishes a
//     duplicate JetStream drops;
//   - the counts of a followed item (taken on an edge, sent on an edge, in
//     and out of its replica) are kept with it until it is finished, then
//     the item joins the worker's next commit: its counts and the reply
//     subject of its message;
//   - the coordinator acks the messages of a commit, then counts the
//     commit's items in that share's ledger, each item once by its queue
//     and id, then answers; until then the worker keeps the messages from
//     redelivery. A commit that reached the coordinator is acked and
//     counted, one that did not is neither and its items come back; an
//     item done twice (its message came back after a late commit) counts
//     once: a worker killed at any point leaves nothing counted twice and
//     nothing lost;
//   - on an edge of several queues, where each item goes is recorded
//     (placed), so an item sent again, by whichever replica, goes where it
//     went first;
//   - a completed run counts the restartable stages by every share's
//     ledger; a lost share's other stages by its last snapshot (their
//     replicas must have finished for the run to go on).

// counts are a share's figures by key: "p" and "c" with an edge (produced,
// consumed), "i" and "o" with a stage and a replica (items in and out).
type counts map[string]int64

func edgeKey(kind, edge string) string { return kind + "\x00" + edge }
func replicaKey(kind, stage string, i int) string {
	return kind + "\x00" + stage + "\x00" + strconv.Itoa(i)
}

func (c counts) add(o counts) {
	for k, v := range o {
		c[k] += v
	}
}

// commit is a worker's batch of finished items for the coordinator.
type commit struct {
	Instance string       `json:"instance"`
	Seq      int64        `json:"seq"`
	Items    []commitItem `json:"items"`
	Counts   counts       `json:"counts"` // counts tied to no followed item
}

// commitItem is one finished item: its message (its queue, its id, the
// reply subject that acks it) and the counts of its work.
type commitItem struct {
	Queue  string `json:"q"`
	ID     string `json:"id"`
	Ack    string `json:"ack"`
	Counts counts `json:"counts"`
}

// acks are the reply subjects of a commit's items.
func (cm *commit) acks() []string {
	var s []string
	for _, it := range cm.Items {
		s = append(s, it.Ack)
	}
	return s
}

func subjCommit(run string) string { return "dflow.r." + run + ".commit" }

// ledger is a worker share's side: the items finished and not yet
// committed, and the counts of items nobody follows.
type ledger struct {
	l *links

	mu       sync.Mutex
	finished []*taken
	loose    counts // counts not tied to a followed item
	seq      int64
	wake     chan struct{}
	cmu      sync.Mutex // one commit at a time
}

func newLedger(l *links) *ledger {
	return &ledger{l: l, loose: counts{}, wake: make(chan struct{}, 1)}
}

// done queues a finished item for the next commit.
func (lg *ledger) done(t *taken) {
	lg.mu.Lock()
	lg.finished = append(lg.finished, t)
	lg.mu.Unlock()
	select {
	case lg.wake <- struct{}{}:
	default:
	}
}

// count adds counts tied to no followed item.
func (lg *ledger) count(keys ...string) {
	lg.mu.Lock()
	for _, k := range keys {
		lg.loose[k]++
	}
	lg.mu.Unlock()
}

// run commits whatever is finished, one commit after another, until the
// share stops.
func (lg *ledger) run() {
	defer lg.l.wg.Done()
	for {
		select {
		case <-lg.l.stop:
			return
		case <-lg.wake:
		}
		if err := lg.commit(); err != nil && lg.l.fatal != nil {
			lg.l.fatal(err)
			return
		}
	}
}

// commitMax is the most items one commit carries (a reply subject is
// about 100 bytes; the server's payload limit is 1 MiB by default).
const commitMax = 2000

// commit sends what is finished to the coordinator, commitMax items at a
// time, and, once it has answered, stops keeping those messages from
// redelivery (the coordinator has acked them). A request that gets no
// answer is sent again with the same sequence number, which the
// coordinator counts once.
func (lg *ledger) commit() error {
	lg.cmu.Lock()
	defer lg.cmu.Unlock()
	for {
		more, err := lg.commitSome()
		if err != nil || !more {
			return err
		}
	}
}

// commitSome sends one commit; more says items are left.
func (lg *ledger) commitSome() (more bool, err error) {
	lg.mu.Lock()
	batch, loose := lg.finished, lg.loose
	if len(batch) > commitMax {
		batch, lg.finished = batch[:commitMax:commitMax], batch[commitMax:]
	} else {
		lg.finished = nil
	}
	more = len(lg.finished) > 0
	lg.loose = counts{}
	if len(batch) == 0 && len(loose) == 0 {
		lg.mu.Unlock()
		return false, nil
	}
	lg.seq++
	cm := commit{Instance: lg.l.instance, Seq: lg.seq, Counts: loose}
	lg.mu.Unlock()
	for _, t := range batch {
		cm.Items = append(cm.Items, commitItem{Queue: t.q.key(), ID: t.id, Ack: t.q.replyOf(t.id), Counts: t.counts})
	}
	b, err := json.Marshal(&cm)
	if err != nil {
		return false, err
	}
	// Until the coordinator counts this share lost (the lease), and then
	// some: the items stay held meanwhile.
	deadline := time.Now().Add(lg.l.job.Timings.Lease + lg.l.job.Timings.AckWait)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		m, err := lg.l.nc.Request(subjCommit(lg.l.job.Run), b, time.Second)
		if err == nil {
			var r reply
			json.Unmarshal(m.Data, &r)
			if r.Err == "" {
				break
			}
			if r.Retry {
				if time.Now().Before(deadline) {
					time.Sleep(wait) // its acks did not reach the server: again
					continue
				}
				return false, fmt.Errorf("the coordinator could not ack this share's finished items for %v: %s", lg.l.job.Timings.Lease+lg.l.job.Timings.AckWait, r.Err)
			}
			return false, fmt.Errorf("the coordinator refused this share's commit: %s", r.Err)
		}
		if errors.Is(err, nats.ErrConnectionClosed) || time.Now().After(deadline) {
			return false, fmt.Errorf("commit to the coordinator: %w", err)
		}
		time.Sleep(wait)
	}
	for _, t := range batch {
		t.q.committed(t)
		t.q.release(t.id, t.ref) // acked: its bytes' holder may drop them
	}
	return more, nil
}

// track wraps the node of a restartable stage so that what its replicas
// take and send is followed.
func (l *links) track(s *graph.Stage, n nodes.Node) nodes.Node {
	if l.restartable == nil || !l.restartable(s) {
		return n
	}
	ports := map[string][]string{}
	for _, e := range l.g.Edges {
		if e.From.Stage == s {
			ports[e.From.Name] = append(ports[e.From.Name], e.Name)
		}
	}
	run := nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
		tr := &tracked{Replica: r, l: l, ports: ports,
			in: replicaKey("i", s.Name, r.Index()), out: replicaKey("o", s.Name, r.Index())}
		err := n.Run(ctx, tr)
		if err == nil {
			tr.finish() // a failed item is not finished: the run fails anyway
		}
		return err
	})
	if q, ok := n.(nodes.Quiescer); ok {
		return quiescent{run, q} // the deadlock detector still asks it
	}
	return run
}

type quiescent struct {
	nodes.NodeFunc
	nodes.Quiescer
}

// tracked is a restartable replica's runtime, following its items: the
// one it took last is in hand until it asks for the next (or returns), and
// what it sends meanwhile derives from it. A stateless kind handles one
// item at a time; its ports may still sit on two goroutines, hence mu.
type tracked struct {
	nodes.Replica
	l       *links
	ports   map[string][]string // output port -> the edges leaving it
	in, out string              // the replica's count keys

	mu   sync.Mutex
	cur  *taken // the item in hand, nil when none or not followed
	sent int    // what it has sent since it took cur
}

func (t *tracked) In(port string) nodes.Input { return &trackedIn{Input: t.Replica.In(port), t: t} }
func (t *tracked) Out(port string) nodes.Output {
	return &trackedOut{Output: t.Replica.Out(port), t: t, edges: t.ports[port]}
}

// finish ends the work on the item in hand.
func (t *tracked) finish() {
	t.mu.Lock()
	cur := t.cur
	t.cur = nil
	t.mu.Unlock()
	if cur != nil {
		cur.finish(t.l.ledger)
	}
}

// count adds keys to the item in hand's counts, or to the loose ones.
func (t *tracked) count(keys ...string) {
	t.mu.Lock()
	if cur := t.cur; cur != nil {
		for _, k := range keys {
			cur.counts[k]++
		}
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	t.l.ledger.count(keys...)
}

type trackedIn struct {
	nodes.Input
	t *tracked
}

func (in *trackedIn) Recv(ctx context.Context) (any, error) {
	t := in.t
	t.finish()
	item, err := in.Input.Recv(ctx)
	if err != nil {
		return item, err
	}
	rec := t.l.claim(item)
	t.mu.Lock()
	t.cur, t.sent = rec, 0
	t.mu.Unlock()
	if rec != nil {
		t.count(t.in, edgeKey("c", rec.q.edge.Name))
	} else {
		t.count(t.in) // counted on its edge when taken (jsQueue.take)
	}
	return item, nil
}

type trackedOut struct {
	nodes.Output
	t     *tracked
	edges []string
}

func (o *trackedOut) Send(ctx context.Context, item any) error {
	t := o.t
	t.mu.Lock()
	cur, k := t.cur, t.sent
	t.sent++
	t.mu.Unlock()
	if cur != nil && followable(item) {
		t.l.setOrigin(item, origin{id: cur.id, k: k, t: cur})
		defer t.l.clearOrigin(item)
	}
	if err := o.Output.Send(ctx, item); err != nil {
		return err
	}
	keys := []string{t.out}
	for _, e := range o.edges {
		keys = append(keys, edgeKey("p", e))
	}
	t.count(keys...)
	if f := t.l.afterSend; f != nil {
		f(t.Stage()) // tests: a crash between a send and its item's commit
	}
	return nil
}

// origin is what an item sent by a restartable replica derives from: the
// id of the item in hand and how many it had sent before this one.
type origin struct {
	id string
	k  int
	t  *taken // the item in hand, settled once what it sent is answered
}

// hash is what derives from the origin at a place (an edge): the same for
// the same item in hand, the same count before it and the same place,
// whichever share sends it, and whichever queue of the edge it goes to
// (the edge's stream is one namespace of ids).
func (o origin) hash(at string) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s#%d>%s", o.id, o.k, at)
	return strconv.FormatUint(h.Sum64(), 36)
}

func (l *links) setOrigin(item any, o origin) {
	l.pmu.Lock()
	l.origins[item] = o
	l.pmu.Unlock()
}

func (l *links) clearOrigin(item any) {
	l.pmu.Lock()
	delete(l.origins, item)
	l.pmu.Unlock()
}

func (l *links) originOf(item any) (origin, bool) {
	if !followable(item) {
		return origin{}, false
	}
	l.pmu.Lock()
	defer l.pmu.Unlock()
	o, ok := l.origins[item]
	return o, ok
}

// claim hands the record of an item taken from a queue to the replica
// that received it.
func (l *links) claim(item any) *taken {
	if !followable(item) {
		return nil
	}
	l.pmu.Lock()
	defer l.pmu.Unlock()
	t := l.pending[item]
	delete(l.pending, item)
	return t
}
