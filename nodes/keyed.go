package nodes

import "github.com/dflow-dev/dflow/graph"

// Keyed is implemented by items that carry a key: on an edge whose policy
// is key_hash, Send routes an item to consumer replica
// graph.KeyConsumer(Key(), C), FNV-1a 64 of the key's bytes mod the C
// consumer replicas, so every item with the same key reaches the same
// replica, on every run and machine. A node sets the key when it sends by
// sending a Keyed item (an item type of its own with a Key method, or one
// that wraps a payload with its key); a stage that forwards items keeps
// their keys. Other policies never look at the key: it costs nothing on
// their edges. On a key_hash edge an item that is not Keyed, or whose Key
// is "", fails Send with an error wrapping ErrNoKey that names the edge,
// the stage and the replica.
type Keyed interface {
	Key() string
}

// ErrNoKey is wrapped by Send's error for an item without a key on a
// key_hash edge.
var ErrNoKey = graph.ErrNoKey
