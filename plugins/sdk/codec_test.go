package sdk

import (
	"reflect"
	"testing"

	"github.com/dflow-dev/dflow/nodes/dflash"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/nodes/text"
)

func TestCodecRoundTrip(t *testing.T) {
	for _, item := range []any{
		[]byte("raw"),
		&synthetic.Blob{Replica: 3, Seq: 99, Data: []byte{1, 2, 3}},
		&text.Batch{B: 2, T: 2, Seq: 7, Tokens: []int32{1, 2, 3, 4, 5, 6}},
		&dflash.HiddenStates{B: 1, T: 2, K: 1, D: 2, Seq: 4, Hidden: []float32{1, -2, 3.5, 4}, Tokens: []int32{9, 8}, Greedy: []int32{7, 6}},
	} {
		name, b, err := Encode(item)
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
