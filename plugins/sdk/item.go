package sdk

import (
	"slices"

	"github.com/dflow-dev/dflow/plugins/internal/wire"
)

// Detach returns an item that owns its memory: the item itself, or, for
// one received by reference (a view of shared memory, valid until the
// next Recv on its port), a copy that the node may keep as long as it
// likes.
func Detach(item any) (any, error) {
	e, err := wire.EncodeItem(item)
	if err != nil {
		return nil, err
	}
	return wire.Decode(e.Type, slices.Concat(e.Pieces...))
}

// Shared reports whether an item's bytes lie in shared memory: an item
// received by reference (a view of a pool), valid only as long as the
// lifetime rules say (Recv; docs/plugin-protocol.md, Shared memory).
func Shared(item any) bool { return wire.Shared(item) }

// Encode turns an item into its wire name ("bytes", "blob", "tokens",
// "hidden", or one registered with items.Register) and its payload, as
// it crosses between dflow and a plugin (docs/plugin-protocol.md has the
// layouts).
func Encode(item any) (string, []byte, error) { return wire.Encode(item) }
