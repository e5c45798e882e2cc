package items

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// encodeWhole is Encode with the pieces joined, as they cross the wire.
func encodeWhole(item any) (string, []byte, error) {
	name, pieces, err := Encode(item)
	return name, slices.Concat(pieces...), err
}

// sampleItems has one item of every wire type.
var sampleItems = []any{
	[]byte("raw"),
	&Blob{Replica: 3, Seq: 99, Data: []byte{1, 2, 3}},
	&Batch{B: 2, T: 2, Seq: 7, Tokens: []int32{1, 2, 3, 4, 5, 6}},
	&HiddenStates{B: 1, T: 2, K: 1, D: 2, Seq: 4, Hidden: []float32{1, -2, 3.5, 4}, Tokens: []int32{9, 8}, Greedy: []int32{7, 6}},
}

func TestCodecRoundTrip(t *testing.T) {
	for _, item := range sampleItems {
		name, b, err := encodeWhole(item)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(name, b)
		if err != nil || !reflect.DeepEqual(back, item) {
			t.Errorf("%s: got %#v (%v), want %#v", name, back, err, item)
		}
	}
	if _, _, err := Encode(42); err == nil {
		t.Error("an int has no encoding")
	}
	for name, b := range map[string][]byte{"blob": {1}, "tokens": make([]byte, 30), "hidden": make([]byte, 8), "nope": nil} {
		if _, err := Decode(name, b); err == nil {
			t.Errorf("%s: malformed bytes decoded", name)
		}
	}
}

// TestWireLayout pins the documented byte layouts (docs/plugin-protocol.md) that
// plugins in other languages read and write.
func TestWireLayout(t *testing.T) {
	le := func(vals ...any) []byte {
		var b []byte
		for _, v := range vals {
			switch v := v.(type) {
			case int64:
				b = binary.LittleEndian.AppendUint64(b, uint64(v))
			case int32:
				b = binary.LittleEndian.AppendUint32(b, uint32(v))
			case float32:
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
			case []byte:
				b = append(b, v...)
			}
		}
		return b
	}
	for _, tc := range []struct {
		item any
		typ  string
		want []byte
	}{
		{[]byte{7, 8}, "bytes", []byte{7, 8}},
		{&Blob{Replica: 3, Seq: -2, Data: []byte{1, 2}}, "blob", le(int64(3), int64(-2), []byte{1, 2})},
		{&Batch{B: 1, T: 1, Seq: 5, Tokens: []int32{-1, 300}}, "tokens", le(int64(1), int64(1), int64(5), int32(-1), int32(300))},
		{&HiddenStates{B: 1, T: 1, K: 1, D: 2, Seq: 9, Hidden: []float32{1.5, -2}, Tokens: []int32{4}, Greedy: []int32{6}},
			"hidden", le(int64(1), int64(1), int64(1), int64(2), int64(9), float32(1.5), float32(-2), int32(4), int32(6))},
	} {
		for _, native := range []bool{true, false} {
			setLittleEndian(t, native && littleEndian)
			typ, b, err := encodeWhole(tc.item)
			if err != nil || typ != tc.typ || !bytes.Equal(b, tc.want) {
				t.Errorf("native %v: Encode(%T) = %s % x, %v; want %s % x", native, tc.item, typ, b, err, tc.typ, tc.want)
			}
		}
	}
}

// setLittleEndian makes the codec take its in-memory path (v true, on a
// little-endian machine) or its portable one, for the rest of the test.
func setLittleEndian(t *testing.T, v bool) {
	old := littleEndian
	littleEndian = v
	t.Cleanup(func() { littleEndian = old })
}

// TestDecodeInPlace: aligned arrays are read where they lie (the item
// owns the received bytes); misaligned ones are copied, and equal.
func TestDecodeInPlace(t *testing.T) {
	_, b, _ := encodeWhole(&Batch{B: 1, T: 1, Seq: 1, Tokens: []int32{10, -20}})
	item, _ := Decode("tokens", b)
	tokens := item.(*Batch).Tokens
	if littleEndian && unsafe.Pointer(&tokens[0]) != unsafe.Pointer(&b[24]) {
		t.Error("aligned tokens were copied")
	}
	shifted := make([]byte, len(b)+1)[1:] // starts at an odd address
	copy(shifted, b)
	item, err := Decode("tokens", shifted)
	if err != nil || !reflect.DeepEqual(item.(*Batch).Tokens, []int32{10, -20}) {
		t.Fatalf("misaligned tokens: %v %v", item, err)
	}
}

// FuzzDecode: whatever bytes a plugin sends, Decode returns an error or an
// item that is consistent with itself (sizes that match its arrays, no
// negative dimension) and encodes back to the same bytes; it never panics.
func FuzzDecode(f *testing.F) {
	for _, item := range sampleItems {
		name, b, _ := encodeWhole(item)
		f.Add(name, b)
	}
	// Headers whose sizes multiply out to the payload only by overflow, or
	// with negative dimensions that cancel out.
	f.Add("hidden", append(header(1, 1, -1, -4, 0), make([]byte, 24)...))
	f.Add("hidden", append(header(1, 1, 1<<62, 4, 0), make([]byte, 8)...))
	f.Add("tokens", append(header(1<<62, 3, 0), make([]byte, 0)...))
	f.Add("tokens", append(header(-1, -2, 0), make([]byte, 4)...))
	f.Fuzz(func(t *testing.T, name string, b []byte) {
		item, err := Decode(name, bytes.Clone(b))
		if err != nil {
			return
		}
		switch v := item.(type) {
		case *Batch:
			if v.B < 0 || v.T < 0 || v.B > 1<<31 || v.T > 1<<31 || len(v.Tokens) != v.B*(v.T+1) {
				t.Fatalf("tokens B=%d T=%d with %d tokens", v.B, v.T, len(v.Tokens))
			}
		case *HiddenStates:
			big := func(d int) bool { return d < 0 || d > 1<<31 }
			if big(v.B) || big(v.T) || big(v.K) || big(v.D) || len(v.Hidden) != v.B*v.T*v.K*v.D || len(v.Tokens) != v.B*v.T || len(v.Greedy) != v.B*v.T {
				t.Fatalf("hidden B=%d T=%d K=%d D=%d with %d, %d, %d values", v.B, v.T, v.K, v.D, len(v.Hidden), len(v.Tokens), len(v.Greedy))
			}
		}
		name2, b2, err := encodeWhole(item)
		if err != nil || name2 != name || !bytes.Equal(b2, b) {
			t.Fatalf("%s did not encode back to its bytes (%v)", name, err)
		}
	})
}

// point is a user's own item type, registered as a plugin author would.
type point struct{ X, Y int32 }

// TestRegister: a type of the user's own crosses like a built-in one; a
// second encoding for a wire name or a type is refused.
func TestRegister(t *testing.T) {
	Register(Codec{Wire: "test_point", Type: reflect.TypeFor[*point](),
		Encode: func(item any) [][]byte {
			p := item.(*point)
			return [][]byte{binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, uint32(p.X)), uint32(p.Y))}
		},
		Decode: func(b []byte) (any, error) {
			return &point{int32(binary.LittleEndian.Uint32(b)), int32(binary.LittleEndian.Uint32(b[4:]))}, nil
		}})
	name, b, err := encodeWhole(&point{3, -4})
	if err != nil || name != "test_point" || WireName(&point{}) != "test_point" {
		t.Fatalf("encode: %s %v", name, err)
	}
	if back, err := Decode(name, b); err != nil || *back.(*point) != (point{3, -4}) {
		t.Errorf("decode: %v %v", back, err)
	}
	for _, c := range []Codec{
		{Wire: "test_point", Type: reflect.TypeFor[point](), Encode: func(any) [][]byte { return nil }, Decode: func([]byte) (any, error) { return nil, nil }},
		{Wire: "test_other", Type: reflect.TypeFor[*point](), Encode: func(any) [][]byte { return nil }, Decode: func([]byte) (any, error) { return nil, nil }},
		{Wire: "test_half", Type: reflect.TypeFor[int]()},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%s, %v) did not panic", c.Wire, c.Type)
				}
			}()
			Register(c)
		}()
	}
	if _, _, err := Encode(struct{}{}); err == nil || !strings.Contains(err.Error(), "items.Register") {
		t.Errorf("an unregistered type: %v", err)
	}
}
