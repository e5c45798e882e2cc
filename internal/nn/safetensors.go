package nn

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// Tensor is a named float32 tensor.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// The safetensors format (the format PyTorch users share weights in): an
// 8-byte little-endian header length H, H bytes of JSON mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// into the data that follows the header) plus an optional "__metadata__"
// map of strings, then the tensors' bytes. dflow reads and writes F32.

type stEntry struct {
	Dtype       string   `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// maxHeader bounds the JSON header (the reference implementation uses
// 100 MB), so a corrupt length cannot make us allocate without limit.
const maxHeader = 100 << 20

// WriteSafetensors writes tensors, in the given order, and string
// metadata to path.
func WriteSafetensors(path string, tensors []Tensor, metadata map[string]string) error {
	header := map[string]any{}
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		if n := numel(t.Shape); n != len(t.Data) {
			return fmt.Errorf("safetensors: tensor %q: shape %v holds %d values, data has %d", t.Name, t.Shape, n, len(t.Data))
		}
		if _, dup := header[t.Name]; dup {
			return fmt.Errorf("safetensors: tensor %q twice", t.Name)
		}
		size := int64(4 * len(t.Data))
		header[t.Name] = stEntry{Dtype: "F32", Shape: t.Shape, DataOffsets: [2]int64{off, off + size}}
		off += size
	}
	h, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	for len(h)%8 != 0 { // align the data to 8 bytes, as the reference does
		h = append(h, ' ')
	}
	buf := make([]byte, 8+len(h)+int(off))
	binary.LittleEndian.PutUint64(buf, uint64(len(h)))
	copy(buf[8:], h)
	p := buf[8+len(h):]
	for _, t := range tensors {
		for _, v := range t.Data {
			binary.LittleEndian.PutUint32(p, math.Float32bits(v))
			p = p[4:]
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf, 0o644); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// ReadSafetensors reads a file written by WriteSafetensors or by the
// reference implementation (F32 tensors only). It checks the header
// against the file: every tensor's byte range inside the data, matching
// its shape, ranges not overlapping and covering the data.
func ReadSafetensors(path string) ([]Tensor, map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	return ParseSafetensors(path, b)
}

// ReadSafetensorsMetadata reads only a file's header and returns its
// __metadata__ (empty when it has none), without reading the tensors: what
// a file is and who wrote it, cheaply. Errors say in words why the file is
// not safetensors.
func ReadSafetensorsMetadata(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer f.Close()
	fail := func(format string, args ...any) (map[string]string, error) {
		return nil, fmt.Errorf("safetensors: %s: %s", path, fmt.Sprintf(format, args...))
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return fail("not a safetensors file: shorter than the 8-byte header length")
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	if hlen > maxHeader || 8+hlen > uint64(st.Size()) {
		return fail("not a safetensors file: header length %d does not fit a file of %d bytes", hlen, st.Size())
	}
	h := make([]byte, hlen)
	if _, err := io.ReadFull(f, h); err != nil {
		return fail("truncated header: %v", err)
	}
	var hdr struct {
		Meta map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(h, &hdr); err != nil {
		return fail("not a safetensors file: the header is not valid JSON (%v)", err)
	}
	if hdr.Meta == nil {
		hdr.Meta = map[string]string{}
	}
	return hdr.Meta, nil
}

// ParseSafetensors parses safetensors bytes; name is used in errors.
func ParseSafetensors(name string, b []byte) ([]Tensor, map[string]string, error) {
	fail := func(format string, args ...any) ([]Tensor, map[string]string, error) {
		return nil, nil, fmt.Errorf("safetensors: %s: %s", name, fmt.Sprintf(format, args...))
	}
	if len(b) < 8 {
		return fail("file is %d bytes, shorter than the 8-byte header length", len(b))
	}
	hlen := binary.LittleEndian.Uint64(b)
	if hlen > maxHeader || 8+hlen > uint64(len(b)) {
		return fail("header length %d does not fit a file of %d bytes (truncated or not safetensors)", hlen, len(b))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+hlen], &raw); err != nil {
		return fail("header is not valid JSON: %v", err)
	}
	data := b[8+hlen:]
	meta := map[string]string{}
	type span struct {
		name       string
		begin, end int64
	}
	var spans []span
	var tensors []Tensor
	for k, v := range raw {
		if k == "__metadata__" {
			if err := json.Unmarshal(v, &meta); err != nil {
				return fail("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		var e stEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return fail("tensor %q: %v", k, err)
		}
		if e.Dtype != "F32" {
			return fail("tensor %q has dtype %s; dflow reads F32 only", k, e.Dtype)
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end > int64(len(data)) {
			return fail("tensor %q: data_offsets [%d, %d] outside the %d data bytes (truncated?)", k, begin, end, len(data))
		}
		n := numel(e.Shape)
		if n < 0 || int64(n)*4 != end-begin {
			return fail("tensor %q: shape %v needs %d bytes, data_offsets give %d", k, e.Shape, int64(n)*4, end-begin)
		}
		t := Tensor{Name: k, Shape: e.Shape, Data: make([]float32, n)}
		for i := range t.Data {
			t.Data[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[begin+int64(4*i):]))
		}
		tensors = append(tensors, t)
		spans = append(spans, span{k, begin, end})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].begin < spans[j].begin })
	var at int64
	for _, s := range spans {
		if s.begin != at {
			return fail("tensor %q starts at byte %d, expected %d (overlapping or gapped data)", s.name, s.begin, at)
		}
		at = s.end
	}
	if at != int64(len(data)) {
		return fail("%d bytes of data follow the last tensor", int64(len(data))-at)
	}
	sort.Slice(tensors, func(i, j int) bool { return tensors[i].Name < tensors[j].Name })
	return tensors, meta, nil
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt32/d) {
			return -1
		}
		n *= d
	}
	return n
}
