package graph

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// Direction says whether a port receives or emits items.
type Direction int

const (
	In  Direction = iota // the node receives items on the port
	Out                  // the node emits items on the port
)

func (d Direction) String() string {
	if d == In {
		return "input"
	}
	return "output"
}

// Any is the port type that accepts every item type. An output port of type
// Any can feed any input port.
const Any = "any"

// WireType is a port type that means one Go type in process and one
// encoding across a plugin's process boundary (plugins/sdk's codec). Every
// node that emits a port of such a type emits exactly that Go type, and a
// plugin's ports are all of these types or Any, so that a type checked
// equal at validation is an item the consumer can decode and use.
type WireType struct {
	Name   string // the port type; "hidden_states" also covers "hidden_states(d=...,layers=...)"
	Wire   string // the codec's name for the encoding
	Go     string // what a node, in process or in a Go plugin, receives and sends
	Python string // what a plugin on the Python SDK (plugins/python) receives and sends
	Doc    string // who emits it
}

// WireTypes are the port types with a wire encoding, in the order the docs
// list them.
var WireTypes = []WireType{
	{Name: "bytes", Wire: "bytes", Go: "[]byte", Python: "bytes",
		Doc: "synthetic_source with type = \"bytes\"; any node's raw bytes"},
	{Name: "blob", Wire: "blob", Go: "*items.Blob", Python: "dflowplugin.Blob",
		Doc: "synthetic_source (its default type)"},
	{Name: "tokens", Wire: "tokens", Go: "*items.Batch", Python: "dflowplugin.Tokens",
		Doc: "text_reader; synthetic_source with type = \"tokens\""},
	{Name: "hidden_states", Wire: "hidden", Go: "*items.HiddenStates", Python: "dflowplugin.Hidden",
		Doc: "target_forward, as hidden_states(d=D,layers=L,...)"},
}

// LookupWireType returns the wire type a port type names, if any.
// "hidden_states(d=128,layers=0,2,3)" is hidden_states.
func LookupWireType(portType string) (WireType, bool) {
	name := portType
	if i := strings.IndexByte(name, '('); i > 0 && strings.HasSuffix(name, ")") {
		name = name[:i]
	}
	for _, w := range WireTypes {
		if w.Name == name {
			return w, true
		}
	}
	return WireType{}, false
}

// WireTypeNames lists the wire types' names, for messages.
func WireTypeNames() string {
	names := make([]string, len(WireTypes))
	for i, w := range WireTypes {
		names[i] = w.Name
	}
	return strings.Join(names, ", ")
}

// PortSpec declares one port of a node kind.
type PortSpec struct {
	Name string
	Dir  Direction
	// Type names the items on the port ("tokens", "hidden_states", ...), or
	// Any.
	Type string
	// SameAs, on an output port, names an input port whose resolved type
	// the output carries (synthetic_work's out is the type of its in).
	SameAs string
	Doc    string
	// NoKeys, on an output port, says in words why its items carry no key
	// for this config (synthetic_source's "keys = 0: its items carry no
	// key"); "" where they may carry keys or the kind cannot tell. An edge
	// from such a port with policy key_hash, which routes every item by
	// its key, fails validation at the edge's policy, instead of the run
	// at its first item.
	NoKeys string
	// NoKeysField is the config attribute that decides NoKeys, if one
	// does ("keys"): the error says where the spec sets it.
	NoKeysField string
}

// FieldType is the type of one config attribute.
type FieldType int

// The config attribute types. Duration and distribution values are strings
// checked by the kind's Check function.
const (
	String FieldType = iota
	Number
	Int
	Bool
	StringList
	NumberList
)

var fieldTypeNames = [...]string{"string", "number", "int", "bool", "list(string)", "list(number)"}

func (t FieldType) String() string {
	if int(t) < len(fieldTypeNames) {
		return fieldTypeNames[t]
	}
	return fmt.Sprintf("FieldType(%d)", int(t))
}

func (t FieldType) cty() cty.Type {
	switch t {
	case Number, Int:
		return cty.Number
	case Bool:
		return cty.Bool
	case StringList:
		return cty.List(cty.String)
	case NumberList:
		return cty.List(cty.Number)
	}
	return cty.String
}

// Field declares one attribute of a node kind's config block.
type Field struct {
	Name     string
	Type     FieldType
	Required bool
	// Default is used when the attribute is absent; cty.NilVal means the
	// attribute is simply unset (Config.Has reports false).
	Default cty.Value
	Doc     string
	// Path says that the attribute (a String or StringList) names files
	// the node reads (ReadPath) or writes (WritePath); NotPath for the
	// others. A worker of a cluster resolves the paths of a job's
	// declared fields under the folders it allows and refuses a job whose
	// paths leave them (docs/cluster.md, Security). A path field's value
	// may use $VAR and a glob, as a corpus's does.
	Path PathUse
}

// PathUse says whether a config field names files, and which way they go.
type PathUse int

const (
	NotPath   PathUse = iota
	ReadPath          // the node reads the files the field names
	WritePath         // the node writes (creates or replaces) the file the field names
)

func (u PathUse) String() string {
	switch u {
	case ReadPath:
		return "read"
	case WritePath:
		return "write"
	}
	return "not a path"
}

// Kind describes a node kind to the loader: its config schema and its
// ports. A Catalog hands out Kinds; the runtime's registry adds the
// constructors.
type Kind struct {
	Name   string
	Doc    string
	Config []Field
	// Ports returns the kind's ports for a decoded config. Port types may
	// depend on the config (synthetic_source's type).
	Ports func(cfg *Config) []PortSpec
	// Check, if set, validates a decoded config beyond its types. Errors
	// of type *FieldError are reported at that attribute.
	Check func(cfg *Config) []error
	// Restores says that the kind's replicas are a group that saves its
	// state and restarts whole from its last save (a plugin's group kind
	// that says it restores): a stage of it may set restarts.
	Restores bool
	// Metrics declares the node metrics the kind publishes and how each
	// is merged over the stage's replicas; one it does not declare is
	// merged by MergeLast (a gauge) or MergeSum (a counter).
	Metrics []Metric
}

// Metric declares a node metric: its name, what it measures, and how the
// stage's figure is formed from its replicas' values.
type Metric struct {
	Name  string
	Doc   string
	Merge Merge
}

// Merge is how a metric's values on a stage's replicas make the stage's
// one figure, in one process or across hosts alike. Only replicas that
// published the metric take part: a replica that never set it does not
// pull a mean towards zero.
type Merge string

const (
	// MergeLast takes the value published most recently, by any replica:
	// a figure of the group as a whole, whichever member measured it (an
	// evaluation by the lead, then by the last member at the end). The
	// default for gauges (Metrics().Set).
	MergeLast Merge = "last"
	// MergeMean averages over the replicas (each one's latest value): a
	// per-replica figure such as a loss on the replica's own batch.
	MergeMean Merge = "mean"
	// MergeMax takes the largest: a count the replicas share, such as the
	// step of a data-parallel group, where some members left early.
	MergeMax Merge = "max"
	// MergeSum adds the replicas' values: the default for counters
	// (Metrics().Add).
	MergeSum Merge = "sum"
)

// MetricMerge is the rule for a metric of k: as declared, or the default
// for a gauge or a counter.
func (k *Kind) MetricMerge(name string, counter bool) Merge {
	if k != nil {
		for _, m := range k.Metrics {
			if m.Name == name && m.Merge != "" {
				return m.Merge
			}
		}
	}
	if counter {
		return MergeSum
	}
	return MergeLast
}

// FieldError is an error about one config attribute.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %v", e.Field, e.Err) }
func (e *FieldError) Unwrap() error { return e.Err }

// Catalog looks up node kinds by name ("synthetic_work", "checksum/crc").
type Catalog interface {
	Kind(name string) (*Kind, bool)
	// KindNames lists every known kind, for suggestions.
	KindNames() []string
}

// Config holds a stage's decoded config block. Getters panic on a name the
// kind's schema does not declare with that type: that is a bug in the node,
// not in the spec.
type Config struct {
	values map[string]cty.Value
	ranges map[string]hcl.Range
	block  hcl.Range
	stage  string
}

// Stage is the name of the stage the config belongs to ("" for one made
// with NewConfig), for messages a node's constructor writes.
func (c *Config) Stage() string {
	if c.stage == "" {
		return "STAGE"
	}
	return c.stage
}

// NewConfig builds a Config from Go values, for tests and programmatic
// graphs. Values must be convertible by gocty (int, float64, string, bool,
// []string, []float64).
func NewConfig(values map[string]cty.Value) *Config {
	c := &Config{values: map[string]cty.Value{}, ranges: map[string]hcl.Range{}}
	for k, v := range values {
		c.values[k] = v
	}
	return c
}

// Has reports whether the attribute is set (in the spec or by a default).
func (c *Config) Has(name string) bool {
	v, ok := c.values[name]
	return ok && !v.IsNull()
}

// Value returns the raw value of an attribute, or cty.NilVal.
func (c *Config) Value(name string) cty.Value { return c.values[name] }

// Names lists the set attributes, sorted.
func (c *Config) Names() []string {
	names := slices.Sorted(maps.Keys(c.values))
	return names
}

// Range returns where the attribute was written, or the config block's
// range when it came from a default.
func (c *Config) Range(name string) hcl.Range {
	if r, ok := c.ranges[name]; ok {
		return r
	}
	return c.block
}

// String returns a string attribute, or "" when unset.
func (c *Config) String(name string) string {
	if !c.Has(name) {
		return ""
	}
	return c.values[name].AsString()
}

// Float returns a number attribute, or 0 when unset.
func (c *Config) Float(name string) float64 {
	if !c.Has(name) {
		return 0
	}
	f, _ := c.values[name].AsBigFloat().Float64()
	return f
}

// Int returns a whole-number attribute, or 0 when unset.
func (c *Config) Int(name string) int {
	if !c.Has(name) {
		return 0
	}
	i, _ := c.values[name].AsBigFloat().Int64()
	return int(i)
}

// Bool returns a bool attribute, or false when unset.
func (c *Config) Bool(name string) bool {
	return c.Has(name) && c.values[name].True()
}

// Strings returns a list(string) attribute.
func (c *Config) Strings(name string) []string {
	if !c.Has(name) {
		return nil
	}
	var out []string
	for _, v := range c.values[name].AsValueSlice() {
		out = append(out, v.AsString())
	}
	return out
}

// Floats returns a list(number) attribute.
func (c *Config) Floats(name string) []float64 {
	if !c.Has(name) {
		return nil
	}
	var out []float64
	for _, v := range c.values[name].AsValueSlice() {
		f, _ := v.AsBigFloat().Float64()
		out = append(out, f)
	}
	return out
}

// Duration parses a string attribute as a Go duration; unset is 0.
func (c *Config) Duration(name string) (time.Duration, error) {
	if !c.Has(name) {
		return 0, nil
	}
	return time.ParseDuration(c.String(name))
}
