package wire

import (
	"encoding/json"
	"fmt"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/plugins/proto"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

var fieldTypes = map[string]graph.FieldType{
	"string": graph.String, "number": graph.Number, "int": graph.Int, "bool": graph.Bool,
	"list(string)": graph.StringList, "list(number)": graph.NumberList,
}

func ctyType(t graph.FieldType) cty.Type {
	switch t {
	case graph.Number, graph.Int:
		return cty.Number
	case graph.Bool:
		return cty.Bool
	case graph.StringList:
		return cty.List(cty.String)
	case graph.NumberList:
		return cty.List(cty.Number)
	}
	return cty.String
}

// FieldsToProto describes a config schema on the wire.
func FieldsToProto(fs []graph.Field) []*proto.Field {
	out := make([]*proto.Field, len(fs))
	for i, f := range fs {
		p := &proto.Field{Name: f.Name, Type: f.Type.String(), Required: f.Required, Doc: f.Doc}
		if f.Path != graph.NotPath {
			p.Path = f.Path.String()
		}
		if f.Default != cty.NilVal {
			b, _ := ctyjson.Marshal(f.Default, ctyType(f.Type))
			p.DefaultJson = string(b)
		}
		out[i] = p
	}
	return out
}

// FieldsFromProto reads a config schema from the wire.
func FieldsFromProto(ps []*proto.Field) ([]graph.Field, error) {
	out := make([]graph.Field, len(ps))
	for i, p := range ps {
		t, ok := fieldTypes[p.Type]
		if !ok {
			return nil, fmt.Errorf("config attribute %q has unknown type %q", p.Name, p.Type)
		}
		f := graph.Field{Name: p.Name, Type: t, Required: p.Required, Doc: p.Doc}
		switch p.Path {
		case "":
		case "read":
			f.Path = graph.ReadPath
		case "write":
			f.Path = graph.WritePath
		default:
			return nil, fmt.Errorf("config attribute %q: path %q: want read, write or nothing", p.Name, p.Path)
		}
		if p.DefaultJson != "" {
			v, err := ctyjson.Unmarshal([]byte(p.DefaultJson), ctyType(t))
			if err != nil {
				return nil, fmt.Errorf("config attribute %q: default %s: %v", p.Name, p.DefaultJson, err)
			}
			f.Default = v
		}
		out[i] = f
	}
	return out, nil
}

// ConfigJSON encodes a decoded config as a JSON object.
func ConfigJSON(cfg *graph.Config) string {
	m := map[string]json.RawMessage{}
	for _, name := range cfg.Names() {
		v := cfg.Value(name)
		if v.IsNull() {
			continue
		}
		b, err := ctyjson.Marshal(v, v.Type())
		if err == nil {
			m[name] = b
		}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// ConfigFromJSON decodes a config JSON object against a schema.
func ConfigFromJSON(s string, fields []graph.Field) (*graph.Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf("config is not a JSON object: %v", err)
	}
	vals := map[string]cty.Value{}
	for _, f := range fields {
		if b, ok := raw[f.Name]; ok {
			v, err := ctyjson.Unmarshal(b, ctyType(f.Type))
			if err != nil {
				return nil, fmt.Errorf("config attribute %q: %v", f.Name, err)
			}
			vals[f.Name] = v
		} else if f.Default != cty.NilVal {
			vals[f.Name] = f.Default
		}
	}
	return graph.NewConfig(vals), nil
}

// PortsToProto describes ports on the wire.
func PortsToProto(ps []graph.PortSpec) []*proto.Port {
	out := make([]*proto.Port, len(ps))
	for i, p := range ps {
		out[i] = &proto.Port{Name: p.Name, Output: p.Dir == graph.Out, Type: p.Type, SameAs: p.SameAs, Doc: p.Doc}
	}
	return out
}

// PortsFromProto reads ports from the wire.
func PortsFromProto(ps []*proto.Port) []graph.PortSpec {
	out := make([]graph.PortSpec, len(ps))
	for i, p := range ps {
		dir := graph.In
		if p.Output {
			dir = graph.Out
		}
		out[i] = graph.PortSpec{Name: p.Name, Dir: dir, Type: p.Type, SameAs: p.SameAs, Doc: p.Doc}
	}
	return out
}
