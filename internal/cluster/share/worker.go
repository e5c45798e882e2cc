package share

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/nats-io/nats.go/jetstream"
)

// WorkerOptions configure a worker.
type WorkerOptions struct {
	// Name is the worker's name in placements and reports.
	Name string
	Conn *nats.Conn
	// Registry builds the nodes; nodes.Default when nil.
	Registry *nodes.Registry
	// Load builds the graph of a job the way the coordinator did (the
	// spec's source with its overrides).
	Load func(*wire.Job) (*graph.Graph, error)
	// Log gets a line per job started and ended.
	Log io.Writer
	// Once makes the worker return after one job, and when the
	// coordinator that gave it is gone.
	Once bool
	// DataAddr is the address (host, or host:port) the worker's data
	// plane listens on and other workers reach it by: large items' bytes
	// go from the worker that holds them to the one that consumes them
	// there. "": the host's address on its route to the broker, any port.
	DataAddr string
	// Roots are the folders under which a job's nodes may read and write
	// files (the config fields their kinds declare paths): a job with a
	// path outside them is refused, with words, before any of its
	// replicas starts. nil: DefaultRoots.
	Roots *control.Roots
	// AfterSend, if set, is called after every item a restartable replica
	// has sent, before the item it came from is committed: tests crash a
	// worker there.
	AfterSend func(stage string)
}

// RunWorker serves jobs until ctx is done (or, with Once, after a job).
func RunWorker(ctx context.Context, o WorkerOptions) error {
	if !wire.ValidName.MatchString(o.Name) {
		return fmt.Errorf("worker name %q: use letters, digits, - and _", o.Name)
	}
	if o.Registry == nil {
		o.Registry = nodes.Default
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Roots == nil {
		r := control.DefaultRoots()
		o.Roots = &r
	}
	w := &worker{o: o, jobs: make(chan *nats.Msg, 4)}
	var err error
	if w.js, err = wire.NewJS(o.Conn); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub, err := o.Conn.ChanSubscribe(wire.SubjRun(o.Name), w.jobs)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	exit, err := o.Conn.Subscribe(wire.SubjExit(o.Name), func(*nats.Msg) { cancel() })
	if err != nil {
		return err
	}
	defer exit.Unsubscribe()
	if err := o.Conn.Flush(); err != nil {
		return err
	}
	// The worker returns once its goroutines have ended: the shares it
	// serves (w.wg), then its announcements, which go on while a share
	// does (the coordinator counts a silent worker lost).
	announcing, quiet := context.WithCancel(ctx)
	announced := make(chan struct{})
	go func() {
		defer close(announced)
		w.announce(announcing)
	}()
	defer func() {
		w.wg.Wait()
		quiet()
		<-announced
	}()
	fmt.Fprintf(o.Log, "dflow worker %s: joined %s, waiting for a job\n", o.Name, o.Conn.ConnectedUrlRedacted())
	own := make(chan struct{}, 1) // this worker's own share has ended
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-own:
			if o.Once {
				return nil // once restarts it took have ended with the run
			}
		case m := <-w.jobs:
			var job wire.Job
			if err := json.Unmarshal(m.Data, &job); err != nil {
				respond(m, fmt.Errorf("bad job: %v", err))
				continue
			}
			mine := job.Instance == o.Name
			if mine && w.busy.Load() {
				respond(m, fmt.Errorf("worker %s is busy with run %s", o.Name, w.run.Load()))
				continue
			}
			if mine {
				w.busy.Store(true)
				w.run.Store(job.Run)
			}
			// A job for another instance is a restart of a lost worker's
			// replicas, beside this worker's share.
			w.wg.Go(func() {
				w.serve(ctx, &job, m)
				if mine {
					w.busy.Store(false)
					own <- struct{}{}
				}
			})
		}
	}
}

type worker struct {
	o    WorkerOptions
	js   jetstream.JetStream
	jobs chan *nats.Msg
	busy atomic.Bool
	run  atomic.Value
	wg   sync.WaitGroup
}

func respond(m *nats.Msg, err error) {
	var r wire.Reply
	if err != nil {
		r.Err = err.Error()
	}
	b, _ := json.Marshal(r)
	m.Respond(b)
}

// announce says every helloEvery that the worker is there.
func (w *worker) announce(ctx context.Context) {
	t := time.NewTicker(wire.HelloEvery)
	defer t.Stop()
	for {
		b, _ := json.Marshal(wire.Hello{Name: w.o.Name, Busy: w.busy.Load()})
		w.o.Conn.Publish(wire.SubjHello(w.o.Name), b)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// serve runs one instance's share of a job and sends its report.
func (w *worker) serve(ctx context.Context, job *wire.Job, m *nats.Msg) {
	nc := w.o.Conn
	inst := job.Instance
	nodes.SetRun(job.Provenance) // before the stages are built: they claim their files for it
	job.Timings = job.Timings.WithDefaults()
	for _, f := range job.VarFiles { // read by Load
		if err := w.o.Roots.CheckRead(f); err != nil {
			respond(m, fmt.Errorf("worker %s refused the job: --var-file %s: %v", w.o.Name, f, err))
			return
		}
	}
	g, err := w.o.Load(job)
	if err == nil {
		g, err = wire.WithSlots(g, job.Parked) // a rebalance's spare slots
	}
	if err != nil {
		respond(m, fmt.Errorf("worker %s: %v", w.o.Name, err))
		return
	}
	if err := w.o.Roots.Check(g); err != nil {
		fmt.Fprintf(w.o.Log, "dflow worker %s: run %s: refused: %v\n", w.o.Name, job.Run, err)
		respond(m, fmt.Errorf("worker %s refused the job: %v", w.o.Name, err))
		return
	}
	runCtx, abort := context.WithCancel(ctx)
	defer abort()
	l, err := newLinks(runCtx, nc, w.js, job, g, inst, w.o.DataAddr)
	if err != nil {
		respond(m, fmt.Errorf("worker %s: %v", w.o.Name, err))
		return
	}
	defer l.close()
	l.worker = w.o.Name
	l.restartable = func(s *graph.Stage) bool { return wire.Restartable(w.o.Registry, s) }
	l.syncs = func(s *graph.Stage) bool {
		spec, ok := w.o.Registry.Spec(s.Node)
		return ok && spec.Sync != nil && spec.Sync(s.Config)
	}
	l.ranks.Whole = func(s *graph.Stage) bool { return wire.Whole(w.o.Registry, s) }
	l.summing = func(s *graph.Stage) bool {
		return wire.Moves(w.o.Registry, s) && !wire.Hosted(w.o.Registry, s, job.Place[s.Name], job.Parked[s.Name] > 0)
	}
	l.afterSend = w.o.AfterSend
	l.logw = w.o.Log
	var lostErr atomic.Pointer[error] // the first
	l.fatal = func(err error) {
		lostErr.CompareAndSwap(nil, &err)
		l.released.Store(true)
		abort()
	}
	var lastHB atomic.Int64 // the coordinator's heartbeat, last heard
	lastHB.Store(time.Now().UnixNano())
	// Items are kept from redelivery only while the coordinator is heard
	// and the connection is up: a worker paused or cut off past job.Timings.Lease
	// has been counted lost, and renewals it sent late (buffered while
	// reconnecting, or on waking) would hold back the items of the share
	// that took over.
	l.renew = func() bool {
		return nc.IsConnected() && time.Since(time.Unix(0, lastHB.Load())) < job.Timings.Lease
	}
	l.start()
	drain := make(chan struct{})
	var drainOnce sync.Once
	groups := map[string]engine.RemoteGroup{}
	for _, s := range g.Stages {
		if wire.Hosted(w.o.Registry, s, job.Place[s.Name], job.Parked[s.Name] > 0) {
			groups[s.Name] = l.group(s, job.Restart)
		}
	}
	p, err := engine.New(g, engine.Options{
		Registry: w.o.Registry, Drain: drain, Grace: job.Grace,
		Here:      func(s *graph.Stage, i int) bool { return job.Place[s.Name][i] == inst },
		Transport: l.For,
		Chain:     l.ChainFor,
		Group:     func(s *graph.Stage) engine.RemoteGroup { return groups[s.Name] },
		Wrap:      func(s *graph.Stage, n nodes.Node) nodes.Node { return l.track(s, l.ranked(s, n)) },
		Parked:    job.Parked, Started: job.Started, Left: job.Left, Released: job.Released,
	})
	if err != nil {
		respond(m, fmt.Errorf("worker %s: %v", w.o.Name, err))
		return
	}
	// Control: snapshots, drain, abort, and the coordinator's heartbeat.
	var subs []*nats.Subscription
	sub := func(subject string, f nats.MsgHandler) {
		if s, err := nc.Subscribe(subject, f); err == nil {
			subs = append(subs, s)
		}
	}
	sub(wire.SubjSnap(job.Run, inst), func(m *nats.Msg) {
		b, _ := json.Marshal(l.sent(p.Snapshot()))
		m.Respond(b)
	})
	if job.Parked != nil {
		// The coordinator's moves, this share's part of each (package
		// engine's parked.go).
		sub(wire.SubjMove(job.Run, inst), func(m *nats.Msg) {
			var mv wire.Move
			err := json.Unmarshal(m.Data, &mv)
			switch {
			case err != nil:
			case mv.Release != "":
				// Said at once: letting the slots go may close queues
				// (their ends written) for a while.
				respond(m, nil)
				p.Release(mv.Release)
				return
			default:
				if err = p.Move(mv.From, mv.Leave, mv.To, mv.Start); err == nil {
					fmt.Fprintf(w.o.Log, "dflow worker %s: run %s: %s[%d] leaves after its item in hand, and %s[%d] starts on its device\n", w.o.Name, job.Run, mv.From, mv.Leave, mv.To, mv.Start)
				}
			}
			respond(m, err)
		})
	}
	sub(wire.SubjDrain(job.Run), func(*nats.Msg) { drainOnce.Do(func() { close(drain) }) })
	var aborted atomic.Bool
	sub(wire.SubjAbort(job.Run), func(*nats.Msg) { aborted.Store(true); abort() })
	// Counted lost: the share ends, and its items are for the share that
	// took over. Said by an abort of its own and by every heartbeat after
	// (the abort may have been missed).
	lost := func() { l.released.Store(true); aborted.Store(true); abort() }
	sub(wire.SubjAbortShare(job.Run, inst), func(*nats.Msg) { lost() })
	sub(wire.SubjHB(job.Run), func(m *nats.Msg) {
		if slices.Contains(strings.Split(string(m.Data), "\n"), inst) {
			lost()
			return
		}
		lastHB.Store(time.Now().UnixNano())
	})
	defer func() {
		for _, s := range subs {
			s.Unsubscribe()
		}
	}()
	nc.Flush()
	respond(m, nil)
	share := "" // a share taking over a lost worker's replicas is named
	if job.Restart {
		share = " (the share " + inst + ", taking over)"
	}
	fmt.Fprintf(w.o.Log, "dflow worker %s: run %s%s: %s\n", w.o.Name, job.Run, share, wire.Placed(g, job, inst))

	var orphaned atomic.Bool
	watchDone := make(chan struct{})
	watch := control.LeaseWatch{Lease: job.Timings.Lease, Clock: time.Now,
		Heard: func() time.Time { return time.Unix(0, lastHB.Load()) },
		// Asked directly, a coordinator that lives answers with the
		// heartbeat's list: its beats were only late (a loaded host).
		Probe: func() bool {
			m, err := nc.Request(wire.SubjAlive(job.Run), nil, job.Timings.Lease)
			if err != nil {
				return false
			}
			if slices.Contains(strings.Split(string(m.Data), "\n"), inst) {
				lost()
			} else {
				lastHB.Store(time.Now().UnixNano())
			}
			return true
		}}
	// The watch is in the share's group: close waits for it (a probe
	// under way ends within a lease).
	l.bg.Go(func() {
		t := time.NewTicker(wire.HBEvery)
		defer t.Stop()
		for {
			select {
			case <-watchDone:
				return
			case <-t.C:
				if watch.Gone() {
					orphaned.Store(true)
					l.released.Store(true) // its items are for others now
					abort()
					return
				}
			}
		}
	})
	rep, err := p.Execute(runCtx)
	// The bytes of large items sent and not yet acked by their consumers
	// stay until they are, or no consumer is left for them, or the run is
	// aborted (the coordinator's heartbeat still watched meanwhile): the
	// share's end would take them away.
	if n, size := l.dp.Holding(); n > 0 && !orphaned.Load() {
		fmt.Fprintf(w.o.Log, "dflow worker %s: run %s%s: keeping %d items' bytes (%d MiB) until their consumers have them\n", w.o.Name, job.Run, share, n, size>>20)
		l.dp.Drained(runCtx)
	}
	close(watchDone)
	if orphaned.Load() {
		// Say so, in case the coordinator lives and only its heartbeat was
		// late: the run then fails instead of waiting for this share.
		fmt.Fprintf(w.o.Log, "dflow worker %s: run %s: the coordinator's heartbeat stopped for %v and it did not answer when asked: aborted\n", w.o.Name, job.Run, job.Timings.Lease)
		d := wire.Done{Instance: inst, Failed: true,
			Err: fmt.Sprintf("worker %s: the coordinator's heartbeat stopped for %v and it did not answer when asked, so its share aborted", w.o.Name, job.Timings.Lease)}
		db, _ := json.Marshal(d)
		nc.Request(wire.SubjDone(job.Run), db, time.Second)
		return
	}
	// What the replicas finished last is settled before the report goes.
	for _, q := range l.queueList() {
		if ferr := q.Flush(); ferr != nil && err == nil && !l.aborting() {
			err = ferr
		}
	}
	if serr := l.ledger.Settle(); serr != nil && err == nil {
		err = serr
	}
	if lerr := lostErr.Load(); lerr != nil && !aborted.Load() {
		err = *lerr
	}
	// The acks sent are the server's before the report says the share is
	// over: the coordinator then reads what was never acked as unread.
	nc.FlushTimeout(2 * time.Second)
	b, _ := json.Marshal(rep)
	l.readDepths() // the share's last figures show the queues as they are now, not 250ms ago
	sb, _ := json.Marshal(p.Snapshot())
	d := wire.Done{Instance: inst, Report: b, Snapshot: sb, Failed: rep.Status == report.Failed}
	if err != nil && !aborted.Load() {
		d.Err = fmt.Sprintf("worker %s: %v", inst, err)
	}
	db, _ := json.Marshal(d)
	for range 20 {
		if _, rerr := nc.Request(wire.SubjDone(job.Run), db, time.Second); rerr == nil || errors.Is(rerr, nats.ErrConnectionClosed) {
			break
		}
		if ctx.Err() != nil {
			break
		}
	}
	why := "" // the worker's own log says why, too
	if d.Err != "" {
		why = ": " + d.Err
	} else if rep.Status == report.Failed && rep.Error != "" {
		why = ": " + rep.Error
	}
	fmt.Fprintf(w.o.Log, "dflow worker %s: run %s%s: %s%s\n", w.o.Name, job.Run, share, rep.Status, why)
}
