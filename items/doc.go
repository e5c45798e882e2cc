// Package items defines the items dflow's built-in nodes exchange and the
// registry of wire encodings that carries items across a process
// boundary, to and from plugins.
//
// The built-in item types live here rather than with the nodes that make
// them, so that a plugin can receive and send them without linking those
// nodes (or dflow's models): Blob (synthetic_source), Batch (text_reader's
// tokens) and HiddenStates (target_forward's hidden_states). The node
// packages name the same types (synthetic.Blob, text.Batch,
// dflash.HiddenStates are aliases).
//
// Each item type registers its encoding where it is defined, with
// Register in an init function: its name on the wire, its Go type, and a
// pair of functions between the item and its bytes. A node kind of a
// user's own that sends a type of its own across a plugin boundary
// registers it the same way. Port types name encodings: a port of type
// "bytes", "blob", "tokens" or "hidden_states" carries exactly the Go
// type registered for it (see graph.WireTypes, and docs/plugin-protocol.md for the layouts).
//
// Invariants: a registered encoding never changes; Decode(Encode(x))
// equals x; an item is read-only once sent, so encoding may alias its
// arrays (a large array is a piece of its own, the array's own memory on a
// little-endian machine) and decoding may hand out arrays that view the
// received bytes, which the item then owns.
package items
