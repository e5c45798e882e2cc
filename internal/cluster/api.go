package cluster

import "github.com/dflow-dev/dflow/internal/cluster/wire"

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
