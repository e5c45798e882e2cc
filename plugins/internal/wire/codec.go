package wire

import (
	"fmt"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/items"
)

// Items cross the process boundary in the wire encoding registered for
// their Go type (package items: the built-in types, and any a plugin
// registers itself). Each port type of graph.WireTypes means one Go type
// and one encoding; docs/plugins.md has the table, docs/plugin-protocol.md the layouts.

// WireName is the encoding an item crosses as ("bytes", "blob", "tokens",
// "hidden", or one a plugin registered), or "" for an item of a type
// without one.
func WireName(item any) string { return items.WireName(item) }

// CheckPortItem reports an item that is not of the Go type its port's type
// means (graph.WireTypes); on a port of type any, or of a type that has no
// wire encoding, every item passes.
func CheckPortItem(portType string, item any) error {
	w, ok := graph.LookupWireType(portType)
	if !ok || WireName(item) == w.Wire {
		return nil
	}
	return fmt.Errorf("a %T item on a port of type %q, which carries %s", item, portType, w.Go)
}

// CheckPortWire is CheckPortItem for an Encoded item, by its wire name.
func CheckPortWire(portType, wire string) error {
	w, ok := graph.LookupWireType(portType)
	if !ok || wire == w.Wire {
		return nil
	}
	return fmt.Errorf("a %s item on a port of type %q, which carries %s (%s on the wire)", wire, portType, w.Go, w.Wire)
}

// Encode turns an item into its wire name and bytes.
func Encode(item any) (string, []byte, error) {
	e, err := EncodeItem(item)
	if err != nil {
		return "", nil, err
	}
	return e.Type, e.Whole(), nil
}

// encode turns an item into its wire name and the pieces of its bytes, in
// order: a large array is a piece of its own, the array's own memory
// where the machine is little-endian like the wire, so that it is sent
// without being copied first.
func encode(item any) (string, [][]byte, error) { return items.Encode(item) }

// Decode rebuilds an item from its wire name and bytes.
func Decode(name string, b []byte) (any, error) { return items.Decode(name, b) }
