package report

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
)

// SetOrder records the spec's order of stages and edges, which the JSON
// and the summary follow (a map alone has none).
func (r *Report) SetOrder(stages, edges []string) {
	r.stageOrder, r.edgeOrder = stages, edges
}

// StageNames returns the report's stages in the spec's order (any the
// order does not know follow, sorted).
func (r *Report) StageNames() []string { return ordered(r.Stages, r.stageOrder) }

// EdgeNames returns the report's edges in the spec's order.
func (r *Report) EdgeNames() []string { return ordered(r.Edges, r.edgeOrder) }

func ordered[V any](m map[string]V, order []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, k := range order {
		if _, ok := m[k]; ok && !seen[k] {
			out = append(out, k)
			seen[k] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !seen[k] {
			out = append(out, k)
		}
	}
	return out
}

// inOrder is a map that marshals its keys in a given order.
type inOrder[V any] struct {
	m    map[string]V
	keys []string
}

func (o inOrder[V]) MarshalJSON() ([]byte, error) {
	if o.m == nil {
		return []byte("null"), nil
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := marshal(k)
		vb, err := marshal(o.m[k])
		if err != nil {
			return nil, err
		}
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// MarshalJSON writes the report with its stages and edges in the spec's
// order.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	return marshal(struct {
		plain
		Stages inOrder[Stage] `json:"stages"`
		Edges  inOrder[Edge]  `json:"edges"`
	}{plain(r), inOrder[Stage]{r.Stages, r.StageNames()}, inOrder[Edge]{r.Edges, r.EdgeNames()}})
}

// UnmarshalJSON reads a report and remembers the order its stages and
// edges were written in.
func (r *Report) UnmarshalJSON(b []byte) error {
	type plain Report
	if err := json.Unmarshal(b, (*plain)(r)); err != nil {
		return err
	}
	var raw struct {
		Stages json.RawMessage `json:"stages"`
		Edges  json.RawMessage `json:"edges"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	r.stageOrder, r.edgeOrder = keysOf(raw.Stages), keysOf(raw.Edges)
	return nil
}

// keysOf returns the keys of a JSON object in the order they appear.
func keysOf(obj json.RawMessage) []string {
	d := json.NewDecoder(bytes.NewReader(obj))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var keys []string
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return keys
		}
		k, _ := t.(string)
		var skip json.RawMessage
		if err := d.Decode(&skip); err != nil {
			return keys
		}
		keys = append(keys, k)
	}
	return keys
}

// marshal is json.Marshal without HTML escapes: a report is not HTML, and
// a restarted replica's worker reads "a>b".
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
