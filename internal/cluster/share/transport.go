package share

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/dataplane"
	"github.com/dflow-dev/dflow/internal/cluster/edge"
	"github.com/dflow-dev/dflow/internal/cluster/follow"
	"github.com/dflow-dev/dflow/internal/cluster/ranks"
	"github.com/dflow-dev/dflow/internal/cluster/settle"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/report"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// links are one instance's transports: the engine's TransportFor, and what
// they share (the connection, the blob stream, the end bucket, the items
// held unacked).
type links struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	job      *wire.Job
	g        *graph.Graph
	instance string
	worker   string // the worker's name (instance is the share's)
	ends     jetstream.KeyValue
	holders  jetstream.KeyValue // where large items sent again are held (rehold)
	// dp holds the bytes of the large items this share sends, for their
	// consumers to fetch, and fetches those it receives (package dataplane);
	// threshold is the size past which an item's bytes take it
	dp        *dataplane.Plane
	threshold int

	// restartable says whether a stage's replicas restart elsewhere when
	// their worker is lost: the items they take then come with a receipt,
	// settled (acked by this share) once finished and what was sent from
	// them is stored (package settle), so a loss redelivers what they had
	// not finished.
	restartable func(*graph.Stage) bool
	// syncs says whether a stage's replicas step together: a node that
	// starts them as distributed ranks learns where each runs (ranks)
	syncs func(*graph.Stage) bool
	// ranks tells the ranks of group stages where rank 0 listens
	ranks *ranks.Placer
	// summing says whether a stage is a group of a kind that moves whose
	// members sum in this process (package follow's local groups)
	summing   func(*graph.Stage) bool
	ledger    *settle.Ledger     // settles the receipts of what restartable replicas take
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
	// follow are the restartable replicas the share follows, and its side
	// of their groups (package follow); the links are their follow.Share
	follow *follow.Replicas

	// env is what the share's queues on JetStream have in common
	// (package edge); the links are their edge.Share
	env    *edge.Env
	mu     sync.Mutex
	queues []*edge.Queue
	// bg is the share's one group of goroutines: keep-alive and its
	// renewals, settling, each queue's publish answerer and pull loop,
	// fetches ahead and again, releases, settled records, and in a
	// worker's share (shareRun) the engine's run, control's handlers and
	// the watch of the coordinator's lease. stopCtx is its cancellation:
	// done once close begins, when every one of them ends (what is under
	// way ends with it); close then waits for the group. Nothing starts in
	// it once stopCtx is done where it could start after close (Go, under
	// mu).
	bg         sync.WaitGroup
	stopCtx    context.Context
	stopCancel context.CancelFunc
}

// newLinks sets up a share's transports; dataAddr is the address its data
// plane listens on and other hosts reach it by ("": the host's address on
// the route to the broker, any free port).
func newLinks(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, job *wire.Job, g *graph.Graph, instance, dataAddr string) (*links, error) {
	l := &links{nc: nc, js: js, job: job, g: g, instance: instance}
	l.stopCtx, l.stopCancel = context.WithCancel(context.Background())
	own := *job // its own copy: the job may be shared (tests), and is read here for the share's life
	own.Timings = own.Timings.WithDefaults()
	l.job = &own
	l.ctx = ctx
	var err error
	if l.ends, err = js.KeyValue(ctx, wire.BucketEnds(job.Run)); err != nil {
		return nil, fmt.Errorf("end bucket: %w", err)
	}
	if l.holders, err = js.KeyValue(ctx, wire.BucketHolders(job.Run)); err != nil {
		return nil, fmt.Errorf("holder bucket: %w", err)
	}
	positions, err := js.KeyValue(ctx, wire.BucketPositions(job.Run)) // how far resuming sources have gone
	if err != nil {
		return nil, fmt.Errorf("position bucket: %w", err)
	}
	l.ledger = settle.New(settle.Env{NC: nc, Graph: g, Instance: instance, Ends: l.ends, Positions: positions,
		Recount: job.Recount.Sources, Stop: l.stopCtx}, l)
	l.follow = follow.New(follow.Env{NC: nc, Job: l.job, Graph: g, Instance: instance, Ends: l.ends,
		Ledger: l.ledger, Stop: l.stopCtx, Share: l})
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
	l.ranks = &ranks.Placer{Job: l.job, Instance: instance, Ends: l.ends, Addr: l.dp.Addr}
	l.env = &edge.Env{NC: nc, JS: js, Job: l.job, Instance: instance, Ends: l.ends, Holders: l.holders,
		DP: l.dp, Threshold: l.threshold, Started: time.Now(), Stop: l.stopCtx, Go: l.bg.Go, Share: l}
	return l, nil
}

// The links are their queues' edge.Share.

func (l *links) Worker() string { return l.worker }

func (l *links) Aborting() bool { return l.aborting() }

func (l *links) Released() bool { return l.released.Load() }

func (l *links) Renews() bool { return l.renew == nil || l.renew() }

func (l *links) Fail(err error) {
	if l.fatal != nil && !l.aborting() {
		l.fatal(err)
	}
}

func (l *links) RunCtx() context.Context { return l.runCtx() }

func (l *links) Restartable(s *graph.Stage) bool { return l.restartable != nil && l.restartable(s) }

func (l *links) Take(q *edge.Queue, id string, r *dataplane.Ref, again bool) engine.Receipt {
	return l.ledger.Take(q, id, r, again)
}

// Fatal fails the share with err, aborting or not: a settle that failed
// (settle.Share, with Worker and Released).
func (l *links) Fatal(err error) {
	if l.fatal != nil {
		l.fatal(err)
	}
}

// For is the engine's TransportFor: a queue on JetStream where the job
// says the queue crosses workers.
func (l *links) For(e *graph.Edge, qi int) engine.Transport {
	if !l.job.Remote[e.Name][qi] {
		return nil
	}
	q := edge.New(l.env, e, wire.EdgeIndex(l.g, e), qi)
	l.mu.Lock()
	l.queues = append(l.queues, q)
	l.mu.Unlock()
	return q
}

// ChainFor is the engine's ChainFor: a chain's queue (package settle's
// chain.go) where the job says its edge is a chain's.
func (l *links) ChainFor(e *graph.Edge, qi int) engine.Chain {
	if !l.job.Chained[e.Name] {
		return nil
	}
	return l.ledger.Chain(wire.EdgeIndex(l.g, e))
}

// The links are their followed replicas' follow.Share, with Worker,
// Aborting and Restartable.

func (l *links) Syncs(s *graph.Stage) bool { return l.syncs != nil && l.syncs(s) }

func (l *links) Summing(s *graph.Stage) bool { return l.summing != nil && l.summing(s) }

// Log is the worker's log.
func (l *links) Log() io.Writer {
	if l.logw == nil {
		return io.Discard
	}
	return l.logw
}

func (l *links) AfterSend(stage string) {
	if l.afterSend != nil {
		l.afterSend(stage)
	}
}

// Go starts f in the share's group unless close has begun (close cancels
// stopCtx under mu): a replica that outlived the share's end, past its
// Grace, records nothing.
func (l *links) Go(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopCtx.Err() == nil {
		l.bg.Go(f)
	}
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
	l.bg.Go(l.ledger.Run)
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
		q.StopGrants()
	}
	l.dp.Close()
}

// keepAlive reads every queue's depth every 250ms, and keeps the items
// held by this instance from being redelivered while it lives (every
// 750ms, on a goroutine of its own so that slow reads cannot delay it).
func (l *links) keepAlive() {
	every := func(d time.Duration, f func(*edge.Queue)) {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-l.stopCtx.Done():
				return
			case <-t.C:
			}
			l.mu.Lock()
			qs := append([]*edge.Queue(nil), l.queues...)
			l.mu.Unlock()
			for _, q := range qs {
				f(q)
			}
		}
	}
	l.bg.Go(func() { every(l.job.Timings.AckWait/4, (*edge.Queue).Touch) })
	every(250*time.Millisecond, func(q *edge.Queue) {
		q.ReadDepth()
		l.dp.SweepReheld(l.stopCtx, q) // cheap while nothing is reheld
	})
}

// readDepths reads every queue's depth now.
func (l *links) readDepths() {
	for _, q := range l.queueList() {
		q.ReadDepth()
	}
}

// sent is s with a finished producer replica shown not done while a
// remote queue it feeds is not yet closed (its last publishes may be
// unanswered): the coordinator takes a replica lost done as having sent
// all it will, and writes its ends for it.
func (l *links) sent(s *report.Snapshot) *report.Snapshot {
	for _, q := range l.queueList() {
		if q.Closed() {
			continue
		}
		st := s.Stage(q.Edge().From.Stage.Name)
		if st == nil {
			continue
		}
		for _, p := range q.Local() {
			if p < len(st.Replicas) {
				st.Replicas[p].Done = false
			}
		}
	}
	return s
}

// queueList is the share's queues now.
func (l *links) queueList() []*edge.Queue {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*edge.Queue(nil), l.queues...)
}
