package share

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
	"github.com/nats-io/nats.go"
)

// A shareRun is one instance's share of a job on this worker, from the
// job's message to its report (worker.serve). Its goroutines are the
// members of one group, its links' (links.bg): the background work the
// links start (keep-alive, settling, each queue's answerer and pulls,
// fetches, records), the engine's run, a handler for each control subject
// and the watch of the coordinator's lease. Two contexts end them:
//
//   - runCtx, the run's, ends the engine: an abort, the share counted
//     lost, the coordinator gone, a fatal error, the worker's end. The
//     engine's return ends the share's run but not its group, whose work
//     serves the share's end, in this order: the bytes of large items sent
//     are kept until their consumers have them, the queues' last publishes
//     are answered, the ledger settles what the replicas finished, the
//     report goes. Control goes on meanwhile, and the lease watch until
//     the bytes are no longer needed.
//   - the group's (links.stopCtx) is the shutdown: once the report has
//     gone, control is unsubscribed and its handlers told to end, and
//     links.close cancels the group and waits for every member. The
//     engine's member has returned by then (the share's end waits for it:
//     nothing is flushed or settled while a replica may still send), so
//     this one cancellation stops everything still running; the run's
//     context is cancelled last.
type shareRun struct {
	w     *worker
	ctx   context.Context // the worker's
	job   *wire.Job
	inst  string
	label string // " (the share X, taking over)" for a restart, else ""
	g     *graph.Graph
	l     *links
	p     *engine.Pipeline

	runCtx context.Context
	abort  context.CancelFunc

	drain     chan struct{} // closed by the coordinator's drain
	drainOnce sync.Once
	subs      []*nats.Subscription // control's subjects
	ctl       context.Context      // control's handlers run until it is done
	endCtl    context.CancelFunc

	lastHB   atomic.Int64          // the coordinator's heartbeat, last heard
	lostErr  atomic.Pointer[error] // the first fatal error
	aborted  atomic.Bool           // the coordinator aborted the run, or counted the share lost
	orphaned atomic.Bool           // the coordinator's lease ran out
}

// controlBuffer is how many messages of one control subject wait for its
// handler before the connection drops them (a slow consumer): a subject
// brings a few a second at most (the heartbeat, the coordinator's
// snapshots), and a move is a request the coordinator waits on.
const controlBuffer = 64

// serve runs one instance's share of a job and sends its report.
func (w *worker) serve(ctx context.Context, job *wire.Job, m *nats.Msg) {
	g, err := w.load(job)
	if err != nil {
		respond(m, err)
		return
	}
	s := &shareRun{w: w, ctx: ctx, job: job, inst: job.Instance, g: g}
	if job.Restart {
		s.label = " (the share " + s.inst + ", taking over)"
	}
	s.runCtx, s.abort = context.WithCancel(ctx)
	defer s.abort() // the last: once the share's group has ended
	if s.l, err = s.newLinks(); err != nil {
		respond(m, fmt.Errorf("worker %s: %v", w.o.Name, err))
		return
	}
	defer s.l.close() // cancels the share's group and waits for all of it
	if s.p, err = s.newEngine(); err != nil {
		respond(m, fmt.Errorf("worker %s: %v", w.o.Name, err))
		return
	}
	s.control()
	defer s.endControl() // before close: the run is over, its report sent
	s.l.nc.Flush()
	respond(m, nil)
	fmt.Fprintf(w.o.Log, "dflow worker %s: run %s%s: %s\n", w.o.Name, job.Run, s.label, wire.Placed(g, job, s.inst))

	rep, err := s.run()
	if s.orphaned.Load() {
		s.reportOrphaned()
		return
	}
	s.report(rep, s.settle(err))
}

// load builds a job's graph the way the coordinator did; an error refuses
// the job, in words for the coordinator (files outside the worker's roots
// among them).
func (w *worker) load(job *wire.Job) (*graph.Graph, error) {
	nodes.SetRun(job.Provenance) // before the stages are built: they claim their files for it
	job.Timings = job.Timings.WithDefaults()
	for _, f := range job.VarFiles { // read by Load
		if err := w.o.Roots.CheckRead(f); err != nil {
			return nil, fmt.Errorf("worker %s refused the job: --var-file %s: %v", w.o.Name, f, err)
		}
	}
	g, err := w.o.Load(job)
	if err == nil {
		g, err = wire.WithSlots(g, job.Parked) // a rebalance's spare slots
	}
	if err != nil {
		return nil, fmt.Errorf("worker %s: %v", w.o.Name, err)
	}
	if err := w.o.Roots.Check(g); err != nil {
		fmt.Fprintf(w.o.Log, "dflow worker %s: run %s: refused: %v\n", w.o.Name, job.Run, err)
		return nil, fmt.Errorf("worker %s refused the job: %v", w.o.Name, err)
	}
	return g, nil
}

// newLinks sets up the share's links with what they ask of the worker,
// and starts their background work.
func (s *shareRun) newLinks() (*links, error) {
	o, job, nc := s.w.o, s.job, s.w.o.Conn
	l, err := newLinks(s.runCtx, nc, s.w.js, job, s.g, s.inst, o.DataAddr)
	if err != nil {
		return nil, err
	}
	l.worker = o.Name
	l.restartable = func(st *graph.Stage) bool { return wire.Restartable(o.Registry, st) }
	l.syncs = func(st *graph.Stage) bool {
		spec, ok := o.Registry.Spec(st.Node)
		return ok && spec.Sync != nil && spec.Sync(st.Config)
	}
	l.ranks.Whole = func(st *graph.Stage) bool { return wire.Whole(o.Registry, st) }
	l.summing = func(st *graph.Stage) bool {
		return wire.Moves(o.Registry, st) && !wire.Hosted(o.Registry, st, job.Place[st.Name], job.Parked[st.Name] > 0)
	}
	l.afterSend = o.AfterSend
	l.logw = o.Log
	l.fatal = func(err error) {
		s.lostErr.CompareAndSwap(nil, &err)
		l.released.Store(true)
		s.abort()
	}
	s.lastHB.Store(time.Now().UnixNano())
	// Items are kept from redelivery only while the coordinator is heard
	// and the connection is up: a worker paused or cut off past job.Timings.Lease
	// has been counted lost, and renewals it sent late (buffered while
	// reconnecting, or on waking) would hold back the items of the share
	// that took over.
	l.renew = func() bool {
		return nc.IsConnected() && time.Since(time.Unix(0, s.lastHB.Load())) < job.Timings.Lease
	}
	l.start()
	return l, nil
}

// newEngine builds the share's engine on its links.
func (s *shareRun) newEngine() (*engine.Pipeline, error) {
	o, job, l := s.w.o, s.job, s.l
	s.drain = make(chan struct{})
	groups := map[string]engine.RemoteGroup{}
	for _, st := range s.g.Stages {
		if wire.Hosted(o.Registry, st, job.Place[st.Name], job.Parked[st.Name] > 0) {
			groups[st.Name] = l.follow.Group(st, job.Restart)
		}
	}
	return engine.New(s.g, engine.Options{
		Registry: o.Registry, Drain: s.drain, Grace: job.Grace,
		Here:      func(st *graph.Stage, i int) bool { return job.Place[st.Name][i] == s.inst },
		Transport: l.For,
		Chain:     l.ChainFor,
		Group:     func(st *graph.Stage) engine.RemoteGroup { return groups[st.Name] },
		Wrap:      func(st *graph.Stage, n nodes.Node) nodes.Node { return l.follow.Wrap(st, l.ranked(st, n)) },
		Parked:    job.Parked, Started: job.Started, Left: job.Left, Released: job.Released,
	})
}

// control subscribes the share's control subjects: snapshots, moves,
// drain, abort, the share's own abort and the coordinator's heartbeat.
// Each subject's handler is a member of the share's group that takes its
// messages in order until endControl (or the group's cancellation).
func (s *shareRun) control() {
	run, inst := s.job.Run, s.inst
	s.ctl, s.endCtl = context.WithCancel(s.l.stopCtx)
	s.handle(wire.SubjSnap(run, inst), func(m *nats.Msg) {
		b, _ := json.Marshal(s.l.sent(s.p.Snapshot()))
		m.Respond(b)
	})
	if s.job.Parked != nil {
		s.handle(wire.SubjMove(run, inst), s.move)
	}
	s.handle(wire.SubjDrain(run), func(*nats.Msg) { s.drainOnce.Do(func() { close(s.drain) }) })
	s.handle(wire.SubjAbort(run), func(*nats.Msg) { s.aborted.Store(true); s.abort() })
	// Counted lost: said by an abort of its own and by every heartbeat
	// after (the abort may have been missed).
	s.handle(wire.SubjAbortShare(run, inst), func(*nats.Msg) { s.lost() })
	s.handle(wire.SubjHB(run), func(m *nats.Msg) {
		if slices.Contains(strings.Split(string(m.Data), "\n"), inst) {
			s.lost()
			return
		}
		s.lastHB.Store(time.Now().UnixNano())
	})
}

// handle subscribes subject, f taking its messages in a member of the
// share's group. A subject that could not be subscribed is left out.
func (s *shareRun) handle(subject string, f func(*nats.Msg)) {
	ch := make(chan *nats.Msg, controlBuffer)
	sub, err := s.l.nc.ChanSubscribe(subject, ch)
	if err != nil {
		return
	}
	s.subs = append(s.subs, sub)
	s.l.bg.Go(func() {
		for {
			select {
			case <-s.ctl.Done():
				return
			case m := <-ch:
				if s.ctl.Err() != nil {
					return
				}
				f(m)
			}
		}
	})
}

// endControl unsubscribes control's subjects and tells their handlers to
// end; links.close waits for them with the rest of the group.
func (s *shareRun) endControl() {
	for _, sub := range s.subs {
		sub.Unsubscribe()
	}
	s.endCtl()
}

// lost ends a share counted lost: its items are for the share that took
// over.
func (s *shareRun) lost() {
	s.l.released.Store(true)
	s.aborted.Store(true)
	s.abort()
}

// move is the share's part of one of the coordinator's moves (package
// engine's parked.go).
func (s *shareRun) move(m *nats.Msg) {
	var mv wire.Move
	err := json.Unmarshal(m.Data, &mv)
	switch {
	case err != nil:
	case mv.Release != "":
		// Said at once: letting the slots go may close queues (their
		// ends written) for a while.
		respond(m, nil)
		s.p.Release(mv.Release)
		return
	default:
		if err = s.p.Move(mv.From, mv.Leave, mv.To, mv.Start); err == nil {
			fmt.Fprintf(s.w.o.Log, "dflow worker %s: run %s: %s[%d] leaves after its item in hand, and %s[%d] starts on its device\n", s.w.o.Name, s.job.Run, mv.From, mv.Leave, mv.To, mv.Start)
		}
	}
	respond(m, err)
}

// run runs the engine as a member of the share's group, with the watch of
// the coordinator's lease beside it, and returns the engine's report once
// it has returned and the bytes of the large items the share sent are no
// longer needed. The watch ends with run.
func (s *shareRun) run() (*report.Report, error) {
	watching, endWatch := context.WithCancel(s.l.stopCtx)
	defer endWatch()
	s.l.bg.Go(func() { s.watchLease(watching) })
	var rep *report.Report
	var err error
	ran := make(chan struct{})
	s.l.bg.Go(func() {
		defer close(ran)
		rep, err = s.p.Execute(s.runCtx)
	})
	<-ran
	// The bytes of large items sent and not yet acked by their consumers
	// stay until they are, or no consumer is left for them, or the run is
	// aborted (the coordinator's heartbeat still watched meanwhile): the
	// share's end would take them away.
	if n, size := s.l.dp.Holding(); n > 0 && !s.orphaned.Load() {
		fmt.Fprintf(s.w.o.Log, "dflow worker %s: run %s%s: keeping %d items' bytes (%d MiB) until their consumers have them\n", s.w.o.Name, s.job.Run, s.label, n, size>>20)
		s.l.dp.Drained(s.runCtx)
	}
	return rep, err
}

// watchLease aborts the share, orphaned, once the coordinator's heartbeat
// has stopped for a lease and it does not answer when asked; it returns
// then or once ctx is done. A probe under way ends within a lease.
func (s *shareRun) watchLease(ctx context.Context) {
	nc, job := s.l.nc, s.job
	watch := control.LeaseWatch{Lease: job.Timings.Lease, Clock: time.Now,
		Heard: func() time.Time { return time.Unix(0, s.lastHB.Load()) },
		// Asked directly, a coordinator that lives answers with the
		// heartbeat's list: its beats were only late (a loaded host).
		Probe: func() bool {
			m, err := nc.Request(wire.SubjAlive(job.Run), nil, job.Timings.Lease)
			if err != nil {
				return false
			}
			if slices.Contains(strings.Split(string(m.Data), "\n"), s.inst) {
				s.lost()
			} else {
				s.lastHB.Store(time.Now().UnixNano())
			}
			return true
		}}
	t := time.NewTicker(wire.HBEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if watch.Gone() {
				s.orphaned.Store(true)
				s.l.released.Store(true) // its items are for others now
				s.abort()
				return
			}
		}
	}
}

// reportOrphaned says the share aborted for its coordinator's silence, in
// case the coordinator lives and only its heartbeat was late: the run then
// fails instead of waiting for this share.
func (s *shareRun) reportOrphaned() {
	w, job := s.w, s.job
	fmt.Fprintf(w.o.Log, "dflow worker %s: run %s: the coordinator's heartbeat stopped for %v and it did not answer when asked: aborted\n", w.o.Name, job.Run, job.Timings.Lease)
	d := wire.Done{Instance: s.inst, Failed: true,
		Err: fmt.Sprintf("worker %s: the coordinator's heartbeat stopped for %v and it did not answer when asked, so its share aborted", w.o.Name, job.Timings.Lease)}
	db, _ := json.Marshal(d)
	s.l.nc.Request(wire.SubjDone(job.Run), db, time.Second)
}

// settle settles what the replicas finished last, before the report goes:
// the queues' last publishes answered, then the ledger's settle. It
// returns the share's error: the engine's (err), else the first of these,
// else the fatal error that aborted the share unless the coordinator
// aborted it.
func (s *shareRun) settle(err error) error {
	for _, q := range s.l.queueList() {
		if ferr := q.Flush(); ferr != nil && err == nil && !s.l.aborting() {
			err = ferr
		}
	}
	if serr := s.l.ledger.Settle(); serr != nil && err == nil {
		err = serr
	}
	if lerr := s.lostErr.Load(); lerr != nil && !s.aborted.Load() {
		err = *lerr
	}
	return err
}

// report sends the share's report (wire.Done: the engine's report, the
// last snapshot, err unless the coordinator aborted the run), asking again
// until it is heard, and logs how the share ended.
func (s *shareRun) report(rep *report.Report, err error) {
	w, job, nc := s.w, s.job, s.l.nc
	// The acks sent are the server's before the report says the share is
	// over: the coordinator then reads what was never acked as unread.
	nc.FlushTimeout(2 * time.Second)
	b, _ := json.Marshal(rep)
	s.l.readDepths() // the share's last figures show the queues as they are now, not 250ms ago
	sb, _ := json.Marshal(s.p.Snapshot())
	d := wire.Done{Instance: s.inst, Report: b, Snapshot: sb, Failed: rep.Status == report.Failed}
	if err != nil && !s.aborted.Load() {
		d.Err = fmt.Sprintf("worker %s: %v", s.inst, err)
	}
	db, _ := json.Marshal(d)
	for range 20 {
		if _, rerr := nc.Request(wire.SubjDone(job.Run), db, time.Second); rerr == nil || errors.Is(rerr, nats.ErrConnectionClosed) {
			break
		}
		if s.ctx.Err() != nil {
			break
		}
	}
	why := "" // the worker's own log says why, too
	if d.Err != "" {
		why = ": " + d.Err
	} else if rep.Status == report.Failed && rep.Error != "" {
		why = ": " + rep.Error
	}
	fmt.Fprintf(w.o.Log, "dflow worker %s: run %s%s: %s%s\n", w.o.Name, job.Run, s.label, rep.Status, why)
}
