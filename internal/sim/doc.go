// Package sim is dflow's discrete-event simulator: it runs a graph in
// virtual time with the runtime's own wiring and routing (graph.Edge.Queues,
// the edge policy's Router: rotation, key_hash by the keys a source's
// model gives, nodes.SimModel.Keys), capacities, fan-in and fan-out, sync steps with uneven ends,
// termination from the topology) and writes the run report, so policies
// and replica splits can be compared before any GPU hour is spent, and
// `dflow validate` can tell a wiring that deadlocks (ProbeDeadlock).
//
// Planning works from the graph in memory, each variant a graph.Graph.With
// of it: Predictor is the diagnosis's estimate of sharing an edge
// (monitor.Predictor), Splits ranks the splits of N replicas between two
// stages, Compare runs (with any Runner) or simulates one variant per
// policy of an edge, and Throughput and Busiest are the figures they rank
// by. The dependency runs sim -> monitor: monitor never imports sim.
//
// Each replica is a state machine: receive (idle while its queues are
// empty), step with its siblings if the node syncs (blocked until every
// member still present arrives), serve one service time (busy), send to
// every edge of each output port (blocked while a queue is full).
//
// Invariants: a simulation is deterministic (events at equal times run in
// the order they were scheduled; same spec and seeds, same report); it
// never runs a node; a simulation that runs out of events with replicas
// still waiting ends with a *Stuck naming each wait.
package sim
