// Package synthetic provides the synthetic nodes: synthetic_source,
// synthetic_work and sink. They sleep for configured service times rather
// than compute, so a 2-core machine can stand in for an 8-GPU box when
// comparing wirings, and they are the simulator's ground truth.
//
// Invariants: a stage's service times are a seeded stream per replica, the
// very stream its simulation model replays, so a run and its simulation
// draw the same times; synthetic_source emits exactly count items over its
// replicas (Share splits them), of the Go type its port type means; with
// keys = N its blobs carry keys (Keys: the same key for the same replica
// and sequence number in a run and in its simulation), for key_hash edges.
package synthetic
