// Package wire is what a dflow plugin (through plugins/sdk) and dflow
// (plugins/host) share on the wire, and what plugin authors never write:
// the go-plugin handshake and plugin map, the gRPC options of both ends,
// the item codec over the items registry, Item chunks and Batches
// (Batcher, Assembler), credit accounting (Window on the receiving end of
// a port, Credit on the sending end), config schemas and ports as
// protocol messages, and the shared-memory pools that carry large items
// by reference (shm.go).
//
// Invariants:
//   - An Item message carries at most ChunkSize payload bytes; a Batch
//     at most MaxBatchItems items of ChunkSize bytes in all.
//   - A Window never grants credit beyond its Items, nor, once it has
//     seen an item's size, beyond its Bytes (an item larger passes alone).
//   - A pool has one writer, which allocates its regions; Close unmaps it,
//     and nothing may read it after: the owner of a pair of pools waits
//     for every goroutine that uses them before closing them.
package wire
