package group

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestMain runs 4 tests at a time even on 2 cores (they wait on their
// members' requests more than they compute), and fails the package's
// tests if a goroutine outlives them (package group_test's too: they
// are in the same test binary).
func TestMain(m *testing.M) {
	testutil.WaitingTests(4)
	testutil.Main(m)
}

// TestVectorWire: a vector crosses as little-endian float32s, whatever the
// machine (Encode and Decode copy it whole where the machine's own are
// those, and go value by value elsewhere), and comes back bit for bit,
// NaN's payload and -0 included.
func TestVectorWire(t *testing.T) {
	f := []float32{0, float32(math.Copysign(0, -1)), 1.5, -3.25e-30, math.MaxFloat32, float32(math.Inf(-1)),
		math.Float32frombits(0x7fc00123)}
	for _, w := range []struct {
		name   string
		encode func([]byte, []float32)
		decode func([]float32, []byte)
	}{{"this machine's", Encode, Decode}, {"value by value", encodeEach, decodeEach}} {
		b := make([]byte, 4*len(f)+3) // longer than the vector: only its bytes are written
		w.encode(b, f)
		for i, v := range f {
			if got := binary.LittleEndian.Uint32(b[4*i:]); got != math.Float32bits(v) {
				t.Errorf("%s: value %d: bytes %08x, want %08x", w.name, i, got, math.Float32bits(v))
			}
		}
		if !slices.Equal(b[4*len(f):], []byte{0, 0, 0}) {
			t.Errorf("%s: encode wrote past the vector: %v", w.name, b[4*len(f):])
		}
		back := make([]float32, len(f))
		w.decode(back, b)
		for i := range f {
			if math.Float32bits(back[i]) != math.Float32bits(f[i]) {
				t.Errorf("%s: value %d: decoded %08x, want %08x", w.name, i, math.Float32bits(back[i]), math.Float32bits(f[i]))
			}
		}
	}
}
