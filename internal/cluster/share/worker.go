package share

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
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
			w.take(ctx, m, own)
		}
	}
}

// take starts serving the job in m, or refuses it: a job for this
// worker's own instance while its share of a run goes on. A job for
// another instance is a restart of a lost worker's replicas, beside this
// worker's share. own hears when this worker's own share has ended.
func (w *worker) take(ctx context.Context, m *nats.Msg, own chan<- struct{}) {
	var job wire.Job
	if err := json.Unmarshal(m.Data, &job); err != nil {
		respond(m, fmt.Errorf("bad job: %v", err))
		return
	}
	mine := job.Instance == w.o.Name
	if mine && w.busy.Load() {
		respond(m, fmt.Errorf("worker %s is busy with run %s", w.o.Name, w.run.Load()))
		return
	}
	if mine {
		w.busy.Store(true)
		w.run.Store(job.Run)
	}
	w.wg.Go(func() {
		w.serve(ctx, &job, m)
		if mine {
			w.busy.Store(false)
			own <- struct{}{}
		}
	})
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
