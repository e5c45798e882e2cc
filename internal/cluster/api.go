package cluster

import (
	"context"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/broker"
	"github.com/dflow-dev/dflow/internal/cluster/control"
	"github.com/dflow-dev/dflow/internal/cluster/share"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/nats-io/nats.go"
)

// What the rest of dflow names through this package, kept in
// internal/cluster/wire, where the coordinator and the shares agree on
// them.
type (
	// Job is what the coordinator sends a worker (wire.Job).
	Job = wire.Job
	// Timings are a run's lease and ack wait across hosts (wire.Timings).
	Timings = wire.Timings
)

// The defaults of Timings.
const (
	DefaultLease           = wire.DefaultLease
	DefaultAckWait         = wire.DefaultAckWait
	DefaultDeadlockConfirm = wire.DefaultDeadlockConfirm
	DefaultAnswer          = wire.DefaultAnswer
)

// Roots are the folders under which a worker lets a job's nodes read and
// write files (control.Roots).
type Roots = control.Roots

// DefaultRoots are a worker's roots when it is given none: it writes under
// the folder it runs in, and reads there and under the Go root.
func DefaultRoots() Roots { return control.DefaultRoots() }

// SpecFolders are the folders a spec's nodes write in and read from, as
// their path fields name them (control.SpecFolders).
func SpecFolders(g *graph.Graph) (write, read []string) { return control.SpecFolders(g) }

// Dismiss tells workers to leave (those started with --once for a local
// cluster, when the run is over or could not start).
func Dismiss(nc *nats.Conn, workers ...string) {
	for _, w := range workers {
		nc.Publish(wire.SubjExit(w), nil)
	}
	nc.Flush()
}

// WorkerOptions configure a worker (share.WorkerOptions).
type WorkerOptions = share.WorkerOptions

// RunWorker serves jobs until ctx is done (or, with Once, after a job):
// share.RunWorker.
func RunWorker(ctx context.Context, o WorkerOptions) error { return share.RunWorker(ctx, o) }

// The broker a cluster runs on (package broker).
type (
	Server        = broker.Server
	ServerOptions = broker.ServerOptions
	ConnOptions   = broker.ConnOptions
)

// StartServer starts an embedded NATS server (broker.StartServer).
func StartServer(o ServerOptions) (*Server, error) { return broker.StartServer(o) }

// Connect connects to a cluster's server (broker.Connect).
func Connect(o ConnOptions) (*nats.Conn, error) { return broker.Connect(o) }

// NewToken makes up a cluster token (broker.NewToken).
func NewToken() string { return broker.NewToken() }
