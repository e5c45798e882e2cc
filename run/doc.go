// Package run executes dflow pipelines from Go: the front door to the
// runtime, which itself stays internal.
//
// A pipeline is a *graph.Graph, loaded from HCL (graph.Loader) or built in
// Go (graph.NewBuilder), whose stages are node kinds of a nodes.Registry:
// the built-in ones (nodes.Default, filled by importing the packages under
// nodes/) or a registry of the caller's own. New builds the nodes and
// wires the queues; Run executes it: every stage replica in a goroutine of
// its own, items moving through bounded queues, end-of-input derived from
// the graph, until every stage has finished, one fails, the run deadlocks,
// ctx is cancelled (an abort) or Options.Drain is closed (a drain). It
// always returns a report (package report), with the diagnosis of what
// limited the run (Diagnose); the error is the run's first failure, naming
// stage and replica.
//
// With Options.Cluster the same pipeline runs across hosts: this process
// coordinates, the workers of a NATS JetStream cluster run the replicas
// (Cluster says which: a server of one's own, local worker processes, or
// an embedded server for other hosts), and the snapshots and report are
// theirs merged. Close stops what such a run started. Worker makes this
// program one of a cluster's workers, as `dflow worker` is, with the node
// kinds of its own registry.
//
// Invariants: a Pipeline runs once. Snapshot may be called from any
// goroutine while Run runs, and costs the run nothing it would notice.
// Items sent on an edge belong to their consumers (see nodes.Output).
package run
