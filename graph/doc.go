// Package graph loads dflow pipeline specs and models the validated graph.
//
// A spec is HCL (native or JSON syntax) with pipeline, variable, plugin,
// stage and edge blocks; docs/spec-language.md is the reference. A Loader
// decodes a spec against a Catalog of node kinds, checks it as a whole and
// returns either a *Graph or every problem at once as hcl.Diagnostics with
// source ranges, which WriteDiagnostics and WriteDiagnosticsJSON print.
//
// # Invariants
//
// A Graph returned without error diagnostics is complete: every stage has
// a Kind and resolved ports, every input port has at least one edge, every
// edge joins an output to an input of compatible type, and the stage graph
// is acyclic. Each edge's Queues hold its wiring (see Wire), computed once
// here and shared by the runtime and the simulator. A Graph is read-only
// after loading and safe to share between goroutines.
//
// # Variants
//
// A graph with one edge's policy or capacity, or one stage's replicas,
// changed is a call on the graph in memory, not a re-read of the spec:
// g.With(SetPolicy("hs", Shared)) returns a copy, checked as the Builder
// checks those attributes and wired again, and leaves g as it was.
//
// # Policies
//
// An edge's Policy is a value that wires the edge (Policy.Wire: its
// queues) and routes each item a producer sends to one of its queues
// (Policy.Router), for the runtime and the simulator alike. With P
// producer and C consumer replicas, a shared edge has one queue for all;
// a round_robin edge has one queue per consumer, producer p feeding
// consumer p mod C when P >= C, and consumer c fed by producer c mod P
// when P < C (each producer then rotates over its consumers in the order
// Edge.ProducerQueues gives); a key_hash edge has one queue per consumer,
// fed by every producer, and an item goes to consumer
// KeyHashOf(key) mod C: FNV-1a 64 of the item's key, stable across runs,
// machines and Go versions (the key is the item's Key() string,
// nodes.Keyed; an item without one fails the send, ErrNoKey).
package graph
