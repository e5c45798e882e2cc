// Package engine runs a validated graph: every stage replica in a
// goroutine of its own, items moving through bounded queues wired per the
// graph's edges (graph.Edge.Queues), end-of-input derived from the
// topology. docs/runtime.md describes the model. Go users reach it
// through package run; the engine implements the nodes.Replica, Input,
// Output and Group handles that package nodes defines.
//
// What it owns: the queues (one Go channel each), the replicas' ports and
// their accounting (tally.go, clock.go), replica groups (group.go), the
// sampler that advances the coarse clock, records queue depths and takes
// series points, the deadlock detector (deadlock.go), failure, drain and
// abort (engine.go, wake.go), and the report's figures (report.go).
//
// Transports: a queue is an in-process channel unless Options.Transport
// gives it a Transport (transport.go), the seam an edge across hosts
// plugs into. An implementation must deliver every item sent exactly
// once, in the order of each producer's sends; block Send while the queue
// holds its capacity and honour ctx in Send and Recv; return the items in
// flight after Close and then ok = false; and report Depth without
// blocking. The engine calls Close once, after the last producer replica
// wired to the queue has returned, and drives Recv from one goroutine of
// its own (a pump into the consumers' channel), so the ports, fan-in,
// termination and monitoring are the same for both; the in-process
// channel stays the fast path.
//
// Invariants:
//   - A queue's channel is closed exactly once, by the last producer
//     replica wired to it to return; nodes never close anything, and
//     Recv returns io.EOF once every queue of a port has closed and
//     drained.
//   - An item a Recv or Send finds ready touches no clock and no shared
//     cache line: only blocking waits are timed and recorded (what each
//     waits on, for the deadlock detector).
//   - Counts are published before every blocking wait and when Run
//     returns, so a waiting replica and the final report are exact.
//   - Plain channel operations wait on the replica's own context only;
//     once the run is cancelled the engine releases them itself (wake.go).
//   - The first error wins and cancels the rest; a report is always
//     returned, with busy + idle + blocked adding up to each lifetime.
package engine
