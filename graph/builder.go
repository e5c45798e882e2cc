package graph

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// Builder makes a Graph from Go calls: stages, the edges between their
// ports, then Build, which validates the whole graph and wires its queues.
// It is the one way a Graph is made: the HCL Loader turns each block of a
// spec into the same calls and builds with the same Build, so a graph built
// in Go gets every check a spec gets, with the same messages. A graph built
// in Go has no source file, so its diagnostics have no Subject; their
// Detail names the stage, edge or port instead:
//
//	stage "square": node kind "sqare" is not known; did you mean "square"? ...
//
// Diagnostics of the Stage and Edge calls are kept and returned by Build,
// so a caller makes every call and then checks once. A Builder makes one
// graph and is not safe for concurrent use.
type Builder struct {
	catalog Catalog
	g       *Graph
	diags   hcl.Diagnostics
	built   bool
	// fromSpec is set by the Loader, which reports a spec with no stage
	// itself, at the file.
	fromSpec bool

	declared map[string]hcl.Range // "stage x" -> first declaration
	// failedPlugins are the plugins that did not start (FailedPlugin):
	// their stages report nothing more.
	failedPlugins map[string]bool
	drafts        map[*Stage]*stageDraft
	refs          map[*Edge][2]*portRef
	// pendingConfig holds --set stage.NAME.config.KEY values until the
	// stage's schema is known.
	pendingConfig map[*Stage]map[string]string
	// fromSet marks the config attributes a --set gave, so that a kind's
	// check of them points at the flag, not at the file's overridden value.
	fromSet map[*Stage]map[string]bool
	// plugins is the Loader's Plugins hook, called before kinds resolve.
	plugins func(declared []*Plugin, referenced []string) hcl.Diagnostics
	// findPlugin is the Loader's FindPlugin hook.
	findPlugin func(p *Plugin) (string, error)
	// rebalance is the rebalance block as read (or RebalanceAll's), checked
	// once the stages and edges are (checkRebalance).
	rebalance *rebalanceDraft
	// eval evaluates an attribute of a spec's config block (the Loader's,
	// with its variables).
	eval func(a *hcl.Attribute, want cty.Type, what string) (cty.Value, bool)
}

// NewBuilder starts a graph named name (Graph.Name) whose node kinds come
// from catalog, such as a *nodes.Registry.
func NewBuilder(name string, catalog Catalog) *Builder {
	b := newBuilder(catalog, "")
	b.g.Name = name
	return b
}

func newBuilder(catalog Catalog, filename string) *Builder {
	return &Builder{
		catalog: catalog,
		g: &Graph{
			Filename: filename,
			stages:   map[string]*Stage{},
			edges:    map[string]*Edge{},
		},
		declared:      map[string]hcl.Range{},
		drafts:        map[*Stage]*stageDraft{},
		refs:          map[*Edge][2]*portRef{},
		pendingConfig: map[*Stage]map[string]string{},
	}
}

// Describe sets the graph's description (Graph.Description), as a
// pipeline block's description does.
func (b *Builder) Describe(description string) *Builder {
	b.g.Description = description
	return b
}

// A StageOption sets one attribute of a stage: Replicas, Devices,
// ConfigAttr, a Sim value.
type StageOption interface{ applyStage(*stageDraft) }

// An EdgeOption sets one attribute of an edge: a Policy (RoundRobin,
// Shared, KeyHash, or Policy("key_hash")), Capacity, CapacityBytes.
type EdgeOption interface{ applyEdge(*edgeDraft) }

type stageOption func(*stageDraft)

func (f stageOption) applyStage(d *stageDraft) { f(d) }

type edgeOption func(*edgeDraft)

func (f edgeOption) applyEdge(d *edgeDraft) { f(d) }

// Replicas sets how many replicas run the stage (default 1, at most
// MaxReplicas), as `replicas = n` does.
func Replicas(n int) StageOption {
	return stageOption(func(d *stageDraft) { d.replicas = cty.NumberIntVal(int64(n)) })
}

// Placement names the cluster workers the stage's replicas run on,
// replica i on workers[i % len(workers)], in a run across hosts.
func Placement(workers ...string) StageOption {
	return stageOption(func(d *stageDraft) {
		d.placement, d.placementGiven = append([]string(nil), workers...), true
	})
}

// Restarts sets how many times the stage's group may restart whole in one
// process when a rank's process dies, as `restarts = n` does: a group kind
// that restores (Kind.Restores).
func Restarts(n int) StageOption {
	return stageOption(func(d *stageDraft) { d.restarts = cty.NumberIntVal(int64(n)) })
}

// Devices lists where the stage's replicas run ("cpu", "cuda:N"); replica
// i uses devices[i % len(devices)]. The default is "cpu".
func Devices(devices ...string) StageOption {
	return stageOption(func(d *stageDraft) {
		d.devices, d.devicesGiven = append([]string(nil), devices...), true
	})
}

// ConfigAttr sets one attribute of the stage's config, as a line of its
// config block does. (It is not named Config: that is the type a node
// reads its decoded config from.) value is a Go value converted to the type
// the kind's schema declares: int (and the other integer types), float64,
// string, bool, []string, []float64, []int, a time.Duration (as its string,
// "40ms"), or a cty.Value. An unknown key or a value of the wrong type is a
// diagnostic of Build naming the stage and the key.
func ConfigAttr(key string, value any) StageOption {
	return stageOption(func(d *stageDraft) {
		d.config = append(d.config, configItem{key: key, value: value})
	})
}

// A Sim value is a StageOption too: Sim{ServiceTime: "lognormal(40ms, 0.2)"}
// sets what the simulator assumes for the stage, as its sim block does.
func (s Sim) applyStage(d *stageDraft) {
	d.sim = &Sim{ServiceTime: s.ServiceTime}
}

// Capacity bounds each of the edge's queues, in items (default
// DefaultCapacity).
func Capacity(n int) EdgeOption {
	return edgeOption(func(d *edgeDraft) { d.capacity = cty.NumberIntVal(int64(n)) })
}

// CapacityBytes also bounds each of the edge's queues in payload bytes
// (default none).
func CapacityBytes(n int64) EdgeOption {
	return edgeOption(func(d *edgeDraft) { d.capacityBytes = cty.NumberIntVal(n) })
}

// Stage adds a stage named name running node kind node ("sink",
// "PLUGIN/KIND"), as a stage block does. Problems are reported by Build.
func (b *Builder) Stage(name, node string, opts ...StageOption) *Builder {
	if !b.claim("stage", name, hcl.Range{}) {
		return b
	}
	d := &stageDraft{name: name, node: node}
	for _, o := range opts {
		o.applyStage(d)
	}
	b.addStage(d)
	return b
}

// Edge adds an edge named name from an output port to an input port, each
// written "STAGE.PORT" ("target.hidden"), as an edge block does. The policy
// defaults to DefaultPolicy and the capacity to DefaultCapacity. Problems
// are reported by Build.
func (b *Builder) Edge(name, from, to string, opts ...EdgeOption) *Builder {
	if !b.claim("edge", name, hcl.Range{}) {
		return b
	}
	d := &edgeDraft{name: name}
	for i, ref := range []string{from, to} {
		attr := [2]string{"from", "to"}[i]
		stage, port, ok := strings.Cut(ref, ".")
		if !ok || stage == "" || port == "" || strings.Contains(port, ".") {
			b.errorf(hcl.Range{}, "invalid port reference",
				"edge %q: %s must be a port reference \"STAGE.PORT\", such as \"target.hidden\"; got %q.", name, attr, ref)
			continue
		}
		r := &portRef{stage: stage, port: port}
		if i == 0 {
			d.from = r
		} else {
			d.to = r
		}
	}
	for _, o := range opts {
		o.applyEdge(d)
	}
	b.addEdge(d)
	return b
}

// Build validates the graph and wires its queues. It reports every problem
// in one pass, those of the Stage and Edge calls included; the Graph is nil
// when any diagnostic is an error, and warnings (an output port with no
// edge) come back alongside a valid Graph. Call it once.
func (b *Builder) Build() (*Graph, hcl.Diagnostics) {
	if b.built {
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "graph already built",
			Detail: fmt.Sprintf("graph %q: Build was already called; a Builder makes one graph.", b.g.Name)}}
	}
	b.built = true
	if len(b.g.Stages) == 0 && !b.fromSpec {
		b.errorf(hcl.Range{}, "no stage", "graph %q has no stage: a pipeline needs at least one; add one with Builder.Stage.", b.g.Name)
	}
	if b.catalog == nil {
		b.errorf(hcl.Range{}, "no catalog", "graph %q: the Builder has no Catalog to look node kinds up in.", b.g.Name)
		return nil, b.diags
	}
	b.check()
	diags := b.diags
	sortDiagnostics(diags)
	if diags.HasErrors() {
		return nil, diags
	}
	return b.g, diags
}

// stageDraft is one stage as declared, before its node kind is known: what
// Builder.Stage's options give, or what the Loader read from a stage block.
// The ranges say where the spec wrote each part; they are zero for a stage
// built in Go, whose diagnostics then name the stage instead.
type stageDraft struct {
	name, node     string    // node "" when missing or already reported
	replicas       cty.Value // a number; cty.NilVal when not given
	devices        []string
	devicesGiven   bool
	placement      []string
	placementGiven bool
	placementRange hcl.Range
	restarts       cty.Value // a number; cty.NilVal when not given
	restartsRange  hcl.Range
	config         []configItem // Builder.Stage's ConfigAttr options, in order
	configBody     hcl.Body     // the spec's config block, or nil
	sim            *Sim

	declRange, nameRange, nodeRange, replicasRange, devicesRange, configRange hcl.Range
}

type configItem struct {
	key   string
	value any
}

// edgeDraft is one edge as declared, before its ports are resolved.
type edgeDraft struct {
	name                    string
	from, to                *portRef // nil when missing or already reported
	policy                  Policy
	policyGiven             bool
	capacity, capacityBytes cty.Value // cty.NilVal when not given

	declRange, nameRange, fromRange, toRange, policyRange, capacityRange, capacityBytesRange hcl.Range
}

// portRef is a STAGE.PORT reference and where the spec wrote each half.
type portRef struct {
	stage, port           string
	stageRange, portRange hcl.Range
}

// claim records a declaration (kind is "stage", "edge", "variable",
// "plugin") and reports a duplicate or invalid name.
func (b *Builder) claim(kind, name string, r hcl.Range) bool {
	key := kind + " " + name
	if first, dup := b.declared[key]; dup {
		where := "is already declared"
		if !isZero(first) {
			where += " at " + at(first)
		}
		b.errorf(r, "duplicate "+kind+" name", "%s %q %s; each %s needs a unique name.", kind, name, where, kind)
		return false
	}
	b.declared[key] = r
	if !validName(name) {
		b.errorf(r, "invalid "+kind+" name", "%s", named(r, fmt.Sprintf("%s %q", kind, name),
			fmt.Sprintf("%q is not a valid name: use letters, digits, '_' and '-', starting with a letter or '_'.", name)))
	}
	return true
}

// addStage checks a claimed stage's attributes and adds it to the graph.
func (b *Builder) addStage(d *stageDraft) {
	s := &Stage{
		Name:          d.name,
		Node:          d.node,
		Replicas:      1,
		DeclRange:     d.declRange,
		NameRange:     d.nameRange,
		NodeRange:     orRange(d.nodeRange, d.declRange),
		ReplicasRange: orRange(d.replicasRange, d.nameRange),
		order:         len(b.g.Stages),
	}
	b.g.Stages = append(b.g.Stages, s)
	b.g.stages[s.Name] = s
	b.drafts[s] = d
	s.Config = &Config{block: orRange(d.configRange, d.declRange), stage: s.Name}
	b.stageAttrs(s, d)
}

// stageAttrs sets the attributes d gives (replicas, devices, sim) on s,
// checking each: for a stage being added, and for Graph.With's changes.
func (b *Builder) stageAttrs(s *Stage, d *stageDraft) {
	who := fmt.Sprintf("stage %q", s.Name)
	if d.replicas != cty.NilVal {
		if n, err := checkCount(d.replicas, "replicas"); err != nil {
			b.errorf(d.replicasRange, "invalid replicas", "%s", named(d.replicasRange, who, fmt.Sprintf("replicas %v.", err)))
		} else {
			s.Replicas = n
		}
	}
	if d.restarts != cty.NilVal {
		s.RestartsRange = d.restartsRange
		if n, err := checkRestarts(d.restarts); err != nil {
			b.errorf(d.restartsRange, "invalid restarts", "%s: restarts %v.", who, err)
		} else {
			s.Restarts = n
		}
	}
	if d.devicesGiven {
		s.Devices = d.devices
		_, _, plugin := strings.Cut(s.Node, "/")
		b.checkDevices(who, d.devices, d.devicesRange, plugin)
	}
	if d.placementGiven {
		s.Placement = d.placement
		if len(d.placement) == 0 {
			b.errorf(d.placementRange, "invalid placement", "%s", named(d.placementRange, who, "placement must name at least one worker, such as [\"w1\"]."))
		}
		for _, w := range d.placement {
			if strings.TrimSpace(w) == "" {
				b.errorf(d.placementRange, "invalid placement", "%s", named(d.placementRange, who, "placement names an empty worker."))
			}
		}
	}
	if d.sim != nil {
		s.Sim = d.sim
	}
	if s.Sim != nil && s.Sim.ServiceTime != "" {
		if err := CheckServiceTime(s.Sim.ServiceTime); err != nil {
			detail := fmt.Sprintf("%v.", err)
			if isZero(s.Sim.Range) {
				detail = fmt.Sprintf("%s: sim service_time %v.", who, err)
			}
			b.errorf(s.Sim.Range, "invalid service_time", "%s", detail)
		}
	}
}

// checkDevices checks a stage's devices. A plugin's stage (plugin) runs
// its node in the plugin's processes, which bring their own CUDA (PyTorch
// on the device dflow binds for them): it needs no CUDA backend in dflow.
func (b *Builder) checkDevices(who string, devices []string, r hcl.Range, plugin bool) {
	for _, dev := range devices {
		n, isCUDA := strings.CutPrefix(dev, "cuda:")
		switch {
		case dev == "cpu":
		case !isCUDA:
			b.errorf(r, "invalid device", "%s", named(r, who,
				fmt.Sprintf("Device %q is not known: use \"cpu\" or \"cuda:N\".", dev)))
		case strings.Trim(n, "0123456789") != "" || n == "":
			b.errorf(r, "invalid device", "%s", named(r, who,
				fmt.Sprintf("Device %q is not known: a GPU is \"cuda:N\" with N its index, such as \"cuda:0\".", dev)))
		case !CUDA && !plugin:
			b.errorf(r, "device not in this build", "%s", named(r, who,
				fmt.Sprintf("Device %q needs dflow's CUDA backend, and this dflow is built without it (a CUDA build is `go build -tags cuda`, "+
					"docs/models.md says how). Use \"cpu\", or a dflow built with -tags cuda.", dev)))
		}
	}
	if len(devices) == 0 {
		b.errorf(r, "invalid devices", "%s", named(r, who, "devices must list at least one device, such as [\"cpu\"]."))
	}
}

// addEdge checks a claimed edge's attributes and adds it to the graph.
func (b *Builder) addEdge(d *edgeDraft) {
	e := &Edge{
		Name:          d.name,
		Policy:        DefaultPolicy,
		Capacity:      DefaultCapacity,
		DeclRange:     d.declRange,
		NameRange:     d.nameRange,
		FromRange:     d.fromRange,
		ToRange:       d.toRange,
		PolicyRange:   orRange(d.policyRange, d.nameRange),
		CapacityRange: orRange(d.capacityRange, d.nameRange),
	}
	b.g.Edges = append(b.g.Edges, e)
	b.g.edges[e.Name] = e
	b.refs[e] = [2]*portRef{d.from, d.to}
	b.edgeAttrs(e, d)
}

// edgeAttrs sets the attributes d gives (policy, capacity,
// capacity_bytes) on e, checking each: for an edge being added, and for
// Graph.With's changes.
func (b *Builder) edgeAttrs(e *Edge, d *edgeDraft) {
	who := fmt.Sprintf("edge %q", e.Name)
	if d.policyGiven {
		e.Policy = d.policy
		if !e.Policy.Known() {
			b.errorf(d.policyRange, "unknown policy", "%s", policyError(e.Name, e.Policy))
		}
	}
	counts := []struct {
		name string
		v    cty.Value
		r    hcl.Range
		set  func(int)
	}{
		{"capacity", d.capacity, d.capacityRange, func(n int) { e.Capacity = n }},
		{"capacity_bytes", d.capacityBytes, d.capacityBytesRange, func(n int) { e.CapacityBytes = int64(n) }},
	}
	for _, c := range counts {
		if c.v == cty.NilVal {
			continue
		}
		n, err := checkCount(c.v, c.name)
		if err != nil {
			b.errorf(c.r, "invalid "+c.name, "%s", named(c.r, who, fmt.Sprintf("%s %v.", c.name, err)))
			continue
		}
		c.set(n)
	}
}

// goValue converts a ConfigAttr option's Go value to cty.
func goValue(v any) (cty.Value, error) {
	switch v := v.(type) {
	case cty.Value:
		return v, nil
	case string:
		return cty.StringVal(v), nil
	case bool:
		return cty.BoolVal(v), nil
	case time.Duration:
		return cty.StringVal(v.String()), nil
	case int:
		return cty.NumberIntVal(int64(v)), nil
	case int8:
		return cty.NumberIntVal(int64(v)), nil
	case int16:
		return cty.NumberIntVal(int64(v)), nil
	case int32:
		return cty.NumberIntVal(int64(v)), nil
	case int64:
		return cty.NumberIntVal(v), nil
	case uint:
		return cty.NumberUIntVal(uint64(v)), nil
	case uint8:
		return cty.NumberUIntVal(uint64(v)), nil
	case uint16:
		return cty.NumberUIntVal(uint64(v)), nil
	case uint32:
		return cty.NumberUIntVal(uint64(v)), nil
	case uint64:
		return cty.NumberUIntVal(v), nil
	case float32:
		return cty.NumberFloatVal(float64(v)), nil
	case float64:
		return cty.NumberFloatVal(v), nil
	case []string:
		return listOf(cty.String, v, cty.StringVal), nil
	case []float64:
		return listOf(cty.Number, v, cty.NumberFloatVal), nil
	case []int:
		return listOf(cty.Number, v, func(i int) cty.Value { return cty.NumberIntVal(int64(i)) }), nil
	case []bool:
		return listOf(cty.Bool, v, cty.BoolVal), nil
	}
	return cty.NilVal, fmt.Errorf("a Go %T is not a config value; use an int, float64, string, bool, time.Duration, []string, []float64 or []int", v)
}

func listOf[T any](elem cty.Type, xs []T, conv func(T) cty.Value) cty.Value {
	if len(xs) == 0 {
		return cty.ListValEmpty(elem)
	}
	vals := make([]cty.Value, len(xs))
	for i, x := range xs {
		vals[i] = conv(x)
	}
	return cty.ListVal(vals)
}

func (b *Builder) errorf(r hcl.Range, summary, detail string, args ...any) {
	b.diags = append(b.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  summary,
		Detail:   fmt.Sprintf(detail, args...),
		Subject:  subject(r),
	})
}

// isZero reports a range that is no position: that of a graph built in Go.
func isZero(r hcl.Range) bool { return r == hcl.Range{} }

// subject is a diagnostic's Subject or Context: nil for no position.
func subject(r hcl.Range) *hcl.Range {
	if isZero(r) {
		return nil
	}
	return r.Ptr()
}

func orRange(r, fallback hcl.Range) hcl.Range {
	if isZero(r) {
		return fallback
	}
	return r
}

// named prefixes detail with who ("stage \"x\": ...") when there is no
// position to say what the detail is about.
func named(r hcl.Range, who, detail string) string {
	if !isZero(r) {
		return detail
	}
	if c, n := utf8.DecodeRuneInString(detail); unicode.IsUpper(c) {
		if next, _ := utf8.DecodeRuneInString(detail[n:]); unicode.IsLower(next) {
			detail = string(unicode.ToLower(c)) + detail[n:]
		}
	}
	return who + ": " + detail
}
