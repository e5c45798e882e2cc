package wire

import (
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/plugins/proto"
)

// TestFieldPathOnTheWire: a plugin kind's path fields cross the wire
// read or written as declared, so that a worker checks them against its
// roots as it checks a built-in kind's; an unknown path use is an error.
func TestFieldPathOnTheWire(t *testing.T) {
	t.Parallel()
	fs := []graph.Field{
		{Name: "weights", Type: graph.String, Path: graph.ReadPath},
		{Name: "out", Type: graph.String, Path: graph.WritePath},
		{Name: "scale", Type: graph.Number},
	}
	back, err := FieldsFromProto(FieldsToProto(fs))
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range fs {
		if back[i].Path != f.Path {
			t.Errorf("%s: path %v after the wire, want %v", f.Name, back[i].Path, f.Path)
		}
	}
	if _, err := FieldsFromProto([]*proto.Field{{Name: "x", Type: "string", Path: "execute"}}); err == nil {
		t.Error("a path use other than read or write was taken")
	}
}
