package items

import (
	"fmt"
	"reflect"
	"sync"
)

// Codec is one item type's wire encoding.
type Codec struct {
	// Wire is the encoding's name on the wire ("tokens"), unique.
	Wire string
	// Type is the Go type it carries (reflect.TypeFor[*Batch]()), unique.
	Type reflect.Type
	// Encode returns the item's bytes as pieces, in order; the bytes on
	// the wire are their concatenation. A piece may alias the item.
	Encode func(item any) [][]byte
	// Decode rebuilds an item from its bytes, which it may keep.
	Decode func(b []byte) (any, error)
}

var registry = struct {
	sync.RWMutex
	byWire map[string]*Codec
	byType map[reflect.Type]*Codec
}{byWire: map[string]*Codec{}, byType: map[reflect.Type]*Codec{}}

// Register adds an encoding. A second one for the same wire name or Go
// type, or one with a field missing, is a programming error and panics.
func Register(c Codec) {
	if c.Wire == "" || c.Type == nil || c.Encode == nil || c.Decode == nil {
		panic("items: Register needs a wire name, a type, Encode and Decode")
	}
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.byWire[c.Wire]; dup {
		panic(fmt.Sprintf("items: wire encoding %q registered twice", c.Wire))
	}
	if _, dup := registry.byType[c.Type]; dup {
		panic(fmt.Sprintf("items: a wire encoding for %v registered twice", c.Type))
	}
	registry.byWire[c.Wire], registry.byType[c.Type] = &c, &c
}

// For returns the encoding of item's Go type.
func For(item any) (*Codec, bool) {
	registry.RLock()
	defer registry.RUnlock()
	c, ok := registry.byType[reflect.TypeOf(item)]
	return c, ok
}

// ByWire returns the encoding of that wire name.
func ByWire(wire string) (*Codec, bool) {
	registry.RLock()
	defer registry.RUnlock()
	c, ok := registry.byWire[wire]
	return c, ok
}

// WireName is the encoding item crosses as, or "" for an item of a type
// without one.
func WireName(item any) string {
	if c, ok := For(item); ok {
		return c.Wire
	}
	return ""
}

// Encode turns an item into its wire name and the pieces of its bytes.
func Encode(item any) (string, [][]byte, error) {
	c, ok := For(item)
	if !ok {
		return "", nil, fmt.Errorf("items: no wire encoding for %T (items.Register adds one)", item)
	}
	return c.Wire, c.Encode(item), nil
}

// Decode rebuilds an item from its wire name and bytes.
func Decode(wire string, b []byte) (any, error) {
	c, ok := ByWire(wire)
	if !ok {
		return nil, fmt.Errorf("items: unknown item encoding %q", wire)
	}
	return c.Decode(b)
}
