// Package nodes is the API between dflow's runtime and the nodes it runs:
// built-in stages, and (through the plugin SDK) plugin stages.
//
// A node kind is registered as a Spec: its config schema and ports (what
// `dflow validate` checks) and a constructor. The runtime builds one Node
// per stage and calls Node.Run once per replica, concurrently. Through its
// Replica handle a replica receives from input ports, sends to output
// ports, joins its replica group for collectives and publishes metrics.
//
// # Rules
//
//   - Input.Recv returns io.EOF exactly once per port when every producer
//     replica wired to the replica's queues has finished; no sentinel is
//     ever sent.
//   - Output.Send blocks while the queue is full and fails with
//     ErrNoConsumers when no consumer is left.
//   - After Send the item belongs to the consumers; with fan-out several
//     consumers share it read-only.
//   - On a key_hash edge an item's key (Keyed) picks its consumer
//     replica, hash(key) mod the replicas (graph.KeyHashOf, FNV-1a 64);
//     an item without a key fails Send with ErrNoKey. Other policies
//     ignore keys.
//   - A replica must not use its ports or group after Run returns.
//   - Built-in kinds register themselves in Default from init; tests use
//     their own NewRegistry.
package nodes
