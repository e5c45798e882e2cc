package nn

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestSafetensorsRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	in := []Tensor{
		{Name: "wte", Shape: []int{3, 2}, Data: []float32{1, 2, 3, 4, 5, -6.5}},
		{Name: "blocks.0.ln1.weight", Shape: []int{2}, Data: []float32{0.5, 1e-20}},
		{Name: "scalar", Shape: []int{}, Data: []float32{7}},
	}
	meta := map[string]string{"config": `{"d_model":2}`}
	if err := WriteSafetensors(path, in, meta); err != nil {
		t.Fatal(err)
	}
	out, gotMeta, err := ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotMeta, meta) || len(out) != 3 {
		t.Fatalf("meta %v, %d tensors", gotMeta, len(out))
	}
	byName := map[string]Tensor{}
	for _, x := range out {
		byName[x.Name] = x
	}
	for _, x := range in {
		if !reflect.DeepEqual(byName[x.Name].Data, x.Data) || !reflect.DeepEqual(byName[x.Name].Shape, x.Shape) {
			t.Errorf("%s: got %+v", x.Name, byName[x.Name])
		}
	}
	// The header is 8-byte aligned, as the reference writes it.
	b, _ := os.ReadFile(path)
	if binary.LittleEndian.Uint64(b)%8 != 0 {
		t.Error("header length not a multiple of 8")
	}
}

// TestSafetensorsKnownBytes parses a file laid out by hand the way the
// reference implementation lays it out.
func TestSafetensorsKnownBytes(t *testing.T) {
	header := `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}}`
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	b = append(b, 0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0) // 1.0, -2.0
	ts, meta, err := ParseSafetensors("hand", b)
	if err != nil || len(ts) != 1 || ts[0].Data[0] != 1 || ts[0].Data[1] != -2 || meta["format"] != "pt" {
		t.Fatalf("%v %v %v", ts, meta, err)
	}
}

func TestSafetensorsErrors(t *testing.T) {
	good := filepath.Join(t.TempDir(), "g.safetensors")
	WriteSafetensors(good, []Tensor{{Name: "a", Shape: []int{4}, Data: make([]float32, 4)}}, nil)
	b, _ := os.ReadFile(good)
	hlen := binary.LittleEndian.Uint64(b)
	mk := func(header string, data int) []byte {
		out := make([]byte, 8)
		binary.LittleEndian.PutUint64(out, uint64(len(header)))
		return append(append(out, header...), make([]byte, data)...)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"tiny", b[:5], "shorter than the 8-byte header"},
		{"truncated", b[:len(b)-3], "outside the"},
		{"huge header", append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, b[8:]...), "does not fit"},
		{"bad json", mk(`{"a":`, 0), "not valid JSON"},
		{"dtype", mk(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, 4), "dtype F16"},
		{"shape", mk(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8), "needs 12 bytes"},
		{"overlap", mk(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "overlapping"},
		{"trailing", mk(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 8), "follow the last tensor"},
		{"meta", mk(`{"__metadata__":{"x":1}}`, 0), "__metadata__"},
	} {
		_ = hlen
		if _, _, err := ParseSafetensors(tc.name, tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	if err := WriteSafetensors(filepath.Join(t.TempDir(), "x"), []Tensor{{Name: "a", Shape: []int{3}, Data: make([]float32, 2)}}, nil); err == nil {
		t.Error("shape/data mismatch: want an error")
	}
}

// FuzzSafetensors: no input makes the parser panic.
func FuzzSafetensors(f *testing.F) {
	header := `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	f.Add(append(append(b, header...), 0, 0, 0x80, 0x3f))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		ParseSafetensors("fuzz", data)
	})
}
