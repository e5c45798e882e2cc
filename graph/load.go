package graph

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"
)

// Loader reads pipeline specs. It remembers every file it parsed so that
// diagnostics can be printed with source snippets (Sources). A Loader is not
// safe for concurrent use.
type Loader struct {
	// Catalog resolves node kinds; required.
	Catalog Catalog
	// Vars are --var NAME=VALUE settings, applied over var files.
	Vars map[string]string
	// VarFiles are --var-file paths (NAME = VALUE attributes, native or
	// JSON syntax), applied in order over the defaults.
	VarFiles []string
	// Sets are --set overrides: "edge.NAME.policy=shared",
	// "edge.NAME.capacity=16", "edge.NAME.capacity_bytes=N",
	// "stage.NAME.replicas=3", "stage.NAME.config.KEY=VALUE".
	Sets []string
	// Plugins, if set, is called with the spec's plugin blocks and the
	// plugin names its stages reference ("NAME" of node "NAME/KIND")
	// before node kinds are resolved, so it can start the plugins and add
	// their kinds to the Catalog. Its diagnostics join the spec's.
	Plugins func(declared []*Plugin, referenced []string) hcl.Diagnostics
	// FindPlugin, if set, decides where each plugin block's executable is
	// instead of the block's path: a worker of a cluster starts only the
	// plugins of its own plugin folders, found by the block's name, never
	// a path the coordinator sent. It returns the executable to start
	// (Plugin.Path is set to it), or an error in words (which plugin,
	// where it looked) that fails the load at the block.
	FindPlugin func(p *Plugin) (string, error)

	parser *hclparse.Parser
}

// Sources returns the bytes of every file the loader parsed, by name.
func (l *Loader) Sources() map[string][]byte {
	out := map[string][]byte{}
	if l.parser == nil {
		return out
	}
	for name, f := range l.parser.Files() {
		out[name] = f.Bytes
	}
	return out
}

func (l *Loader) init() {
	if l.parser == nil {
		l.parser = hclparse.NewParser()
	}
}

// LoadFile reads and loads one spec file. Files ending in ".json" use the
// HCL JSON syntax.
func (l *Loader) LoadFile(filename string) (*Graph, hcl.Diagnostics) {
	src, err := os.ReadFile(filename)
	if err != nil {
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "cannot read spec",
			Detail:   err.Error(),
		}}
	}
	return l.Load(filename, src)
}

// Load parses and validates a spec held in memory. It reports every
// problem it finds in one pass; the Graph is nil when any diagnostic is an
// error. Warnings come back alongside a valid Graph.
func (l *Loader) Load(filename string, src []byte) (*Graph, hcl.Diagnostics) {
	l.init()
	if d := NotText(filename, src); d != nil {
		return nil, hcl.Diagnostics{d} // one error, not one per stray byte
	}
	var file *hcl.File
	var diags hcl.Diagnostics
	if strings.HasSuffix(filename, ".json") {
		file, diags = l.parser.ParseJSON(src, filename)
	} else {
		file, diags = l.parser.ParseHCL(src, filename)
	}
	if diags.HasErrors() {
		return nil, diags
	}
	d := &decoder{loader: l, filename: filename, Builder: newBuilder(l.Catalog, filename)}
	d.fromSpec = true
	d.plugins = l.Plugins
	d.findPlugin = l.FindPlugin
	d.eval = d.value
	d.decode(file.Body)
	g, buildDiags := d.Build()
	diags = append(diags, buildDiags...)
	sortDiagnostics(diags)
	if diags.HasErrors() {
		return nil, diags
	}
	return g, diags
}

var rootSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "pipeline", LabelNames: []string{"name"}},
		{Type: "variable", LabelNames: []string{"name"}},
		{Type: "plugin", LabelNames: []string{"name"}},
		{Type: "stage", LabelNames: []string{"name"}},
		{Type: "edge", LabelNames: []string{"name"}},
		{Type: "rebalance"},
	},
}

// NotText reports a file that is not UTF-8 text (a binary, a file in
// another encoding), or returns nil: the HCL parser would report every
// stray byte, and the first one tells it all.
func NotText(filename string, src []byte) *hcl.Diagnostic {
	bad, what := -1, ""
	if i := bytes.IndexByte(src, 0); i >= 0 {
		bad, what = i, "a NUL byte"
	}
	for i := 0; i < len(src) && (bad < 0 || i < bad); {
		r, n := utf8.DecodeRune(src[i:])
		if r == utf8.RuneError && n <= 1 {
			bad, what = i, fmt.Sprintf("an invalid byte 0x%02x", src[i])
			break
		}
		i += n
	}
	if bad < 0 {
		return nil
	}
	line := 1 + bytes.Count(src[:bad], []byte("\n"))
	col := 1 + utf8.RuneCount(src[bytes.LastIndexByte(src[:bad], '\n')+1:bad])
	return &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  "not a text file",
		Detail: fmt.Sprintf("%s is not UTF-8 text: %s at line %d, column %d. A spec is an HCL file (native syntax, or JSON for *.json), in UTF-8.",
			filename, what, line, col),
	}
}

// decoder holds the state of one Load: it reads the spec's blocks and
// turns each into the Builder's calls, with the ranges the blocks were
// written at, and the Builder checks and builds the graph.
type decoder struct {
	*Builder
	loader   *Loader
	filename string
	ctx      *hcl.EvalContext
}

func (d *decoder) decode(body hcl.Body) {
	content, diags := body.Content(rootSchema)
	d.diags = append(d.diags, diags...)

	var stages, edges, vars, rebalance []*hcl.Block
	for _, b := range content.Blocks {
		switch b.Type {
		case "pipeline":
			d.decodePipeline(b)
		case "variable":
			vars = append(vars, b)
		case "plugin":
			d.decodePlugin(b)
		case "stage":
			stages = append(stages, b)
		case "edge":
			edges = append(edges, b)
		case "rebalance":
			rebalance = append(rebalance, b)
		}
	}
	if len(stages) == 0 && !d.diags.HasErrors() {
		what := "defines no stage"
		if len(content.Blocks) == 0 {
			what = "is empty"
		}
		start := hcl.Range{Filename: d.filename, Start: hcl.InitialPos, End: hcl.InitialPos}
		d.errorf(start, "no stage", "The spec %s: a pipeline needs at least one stage block, such as\n\n"+
			"  stage \"reader\" {\n    node = \"synthetic_source\"\n    config {\n      count = 10\n    }\n  }", what)
	}
	d.ctx = d.evalContext(vars)
	for _, b := range stages {
		d.decodeStage(b)
	}
	for _, b := range edges {
		d.decodeEdge(b)
	}
	for _, b := range rebalance {
		d.decodeRebalance(b)
	}
	d.applySets()
}

// unique records a declaration and reports a duplicate name.
func (d *decoder) unique(b *hcl.Block) bool {
	return d.claim(b.Type, b.Labels[0], b.LabelRanges[0])
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		letter := r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !letter && (i == 0 || !(r == '-' || (r >= '0' && r <= '9'))) {
			return false
		}
	}
	return true
}

func (d *decoder) decodePipeline(b *hcl.Block) {
	if first, dup := d.declared["pipeline"]; dup {
		d.errorf(b.DefRange, "duplicate pipeline block",
			"A spec has at most one pipeline block; the first is at %s.", at(first))
		return
	}
	d.declared["pipeline"] = b.DefRange
	d.g.Name = b.Labels[0]
	content, diags := b.Body.Content(&hcl.BodySchema{
		Attributes: []hcl.AttributeSchema{{Name: "description"}, {Name: "lease"}},
	})
	d.diags = append(d.diags, diags...)
	if a, ok := content.Attributes["description"]; ok {
		d.g.Description, _ = d.stringAttr(a)
	}
	if a, ok := content.Attributes["lease"]; ok {
		if s, ok := d.stringAttr(a); ok {
			lease, err := time.ParseDuration(s)
			if err != nil || lease <= 0 {
				d.errorf(a.Expr.Range(), "invalid lease",
					"lease is how long a worker may stay silent before it is counted lost, a duration such as \"10s\"; got %q.", s)
			} else {
				d.g.Lease = lease
			}
		}
	}
}

func (d *decoder) decodePlugin(b *hcl.Block) {
	if !d.unique(b) {
		return
	}
	content, diags := b.Body.Content(&hcl.BodySchema{
		Attributes: []hcl.AttributeSchema{{Name: "path", Required: true}},
	})
	d.diags = append(d.diags, diags...)
	p := &Plugin{Name: b.Labels[0], DeclRange: b.DefRange}
	if a, ok := content.Attributes["path"]; ok {
		p.Written, _ = d.stringAttr(a)
		p.Path = PluginPath(d.filename, p.Written)
		p.PathRange = a.Expr.Range()
	}
	d.g.Plugins = append(d.g.Plugins, p)
}

// PluginPath is where a plugin block's path, as written in the spec file
// specFile, leads: an absolute path as it is, a relative one from the
// folder of specFile (not the folder dflow runs in), made absolute.
func PluginPath(specFile, path string) string {
	if path == "" || filepath.IsAbs(path) {
		return path
	}
	p := filepath.Join(filepath.Dir(specFile), path)
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

var stageSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "node", Required: true},
		{Name: "replicas"},
		{Name: "devices"},
		{Name: "placement"},
		{Name: "restarts"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "config"}, {Type: "sim"}},
}

func (d *decoder) decodeStage(b *hcl.Block) {
	if !d.unique(b) {
		return
	}
	s := &stageDraft{
		name:      b.Labels[0],
		declRange: b.DefRange,
		nameRange: b.LabelRanges[0],
		nodeRange: b.DefRange,
	}
	content, diags := b.Body.Content(stageSchema)
	d.diags = append(d.diags, diags...)
	if a, ok := content.Attributes["node"]; ok {
		s.node, _ = d.stringAttr(a)
		s.nodeRange = a.Expr.Range()
	}
	if a, ok := content.Attributes["replicas"]; ok {
		s.replicasRange = a.Expr.Range()
		if v, ok := d.value(a, cty.Number, "a whole number"); ok {
			s.replicas = v
		}
	}
	if a, ok := content.Attributes["devices"]; ok {
		s.devicesRange = a.Expr.Range()
		if v, ok := d.value(a, cty.List(cty.String), "a list of device names"); ok {
			s.devicesGiven = true
			for _, e := range v.AsValueSlice() {
				s.devices = append(s.devices, e.AsString())
			}
		}
	}
	if a, ok := content.Attributes["restarts"]; ok {
		s.restartsRange = a.Expr.Range()
		if v, ok := d.value(a, cty.Number, "a whole number"); ok {
			s.restarts = v
		}
	}
	if a, ok := content.Attributes["placement"]; ok {
		s.placementRange = a.Expr.Range()
		if v, ok := d.value(a, cty.List(cty.String), "a list of worker names"); ok {
			s.placementGiven = true
			for _, e := range v.AsValueSlice() {
				s.placement = append(s.placement, e.AsString())
			}
		}
	}
	hasConfig := false
	for _, blk := range content.Blocks {
		switch blk.Type {
		case "config":
			if hasConfig {
				d.errorf(blk.DefRange, "duplicate config block",
					"stage %q already has a config block; merge them into one.", s.name)
				continue
			}
			hasConfig = true
			s.configBody = blk.Body
			s.configRange = blk.DefRange
		case "sim":
			if s.sim != nil {
				d.errorf(blk.DefRange, "duplicate sim block",
					"stage %q already has a sim block; merge them into one.", s.name)
				continue
			}
			s.sim = d.decodeSim(blk)
		}
	}
	d.addStage(s)
}

// decodeSim reads a sim block; the Builder checks its service_time.
func (d *decoder) decodeSim(b *hcl.Block) *Sim {
	content, diags := b.Body.Content(&hcl.BodySchema{
		Attributes: []hcl.AttributeSchema{{Name: "service_time", Required: true}},
	})
	d.diags = append(d.diags, diags...)
	sim := &Sim{Range: b.DefRange}
	if a, ok := content.Attributes["service_time"]; ok {
		sim.ServiceTime, _ = d.stringAttr(a)
		sim.Range = a.Expr.Range()
	}
	return sim
}

var edgeSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "from", Required: true},
		{Name: "to", Required: true},
		{Name: "policy"},
		{Name: "capacity"},
		{Name: "capacity_bytes"},
	},
}

// CUDA reports whether this build runs nodes on CUDA devices: true in a
// build with -tags cuda (cuda.go), which has internal/nn's CUDA backend.
// Without it a stage naming "cuda:N" is an error at validate, naming the
// tag, rather than a run on the CPU that looks like one on the GPU; a
// plugin's stage ("PLUGIN/KIND") is not, its processes bringing their
// own CUDA.
var CUDA = false

func (d *decoder) decodeEdge(b *hcl.Block) {
	if !d.unique(b) {
		return
	}
	e := &edgeDraft{
		name:      b.Labels[0],
		declRange: b.DefRange,
		nameRange: b.LabelRanges[0],
	}
	content, diags := b.Body.Content(edgeSchema)
	d.diags = append(d.diags, diags...)
	for i, name := range []string{"from", "to"} {
		a, ok := content.Attributes[name]
		if !ok {
			continue
		}
		if i == 0 {
			e.fromRange = a.Expr.Range()
			e.from = d.portRef(a)
		} else {
			e.toRange = a.Expr.Range()
			e.to = d.portRef(a)
		}
	}
	if a, ok := content.Attributes["policy"]; ok {
		e.policyRange = a.Expr.Range()
		if s, ok := d.stringAttr(a); ok {
			e.policy, e.policyGiven = Policy(s), true
		}
	}
	counts := []struct {
		name string
		v    *cty.Value
		r    *hcl.Range
	}{
		{"capacity", &e.capacity, &e.capacityRange},
		{"capacity_bytes", &e.capacityBytes, &e.capacityBytesRange},
	}
	for _, c := range counts {
		if a, ok := content.Attributes[c.name]; ok {
			*c.r = a.Expr.Range()
			if v, ok := d.value(a, cty.Number, "a whole number"); ok {
				*c.v = v
			}
		}
	}
	d.addEdge(e)
}

func policyError(edge string, policy Policy) string {
	return fmt.Sprintf("edge %q: %v", edge, policy.check())
}

// portRef parses a bare STAGE.PORT traversal.
func (d *decoder) portRef(a *hcl.Attribute) *portRef {
	tr, diags := hcl.AbsTraversalForExpr(a.Expr)
	if !diags.HasErrors() && len(tr) == 2 {
		if port, ok := tr[1].(hcl.TraverseAttr); ok {
			return &portRef{stage: tr.RootName(), port: port.Name,
				stageRange: tr[0].SourceRange(), portRange: tr[1].SourceRange()}
		}
	}
	d.errorf(a.Expr.Range(), "invalid port reference",
		"%s must be a port reference STAGE.PORT with no quotes, like target.hidden.", a.Name)
	return nil
}

// checkVarRefs reports references to undeclared variables in expr.
func (d *decoder) checkVarRefs(expr hcl.Expression) bool {
	if d.ctx == nil {
		return true // hcl itself reports variables where none are allowed
	}
	ok := true
	declared := d.ctx.Variables["var"]
	for _, tr := range expr.Variables() {
		if tr.RootName() != "var" || len(tr) < 2 {
			continue
		}
		attr, isAttr := tr[1].(hcl.TraverseAttr)
		if !isAttr || declared.Type().HasAttribute(attr.Name) {
			continue
		}
		d.errorf(tr.SourceRange(), "undeclared variable", "%s",
			sentence(fmt.Sprintf("var.%s is not declared; add a variable %q block%s",
				attr.Name, attr.Name, DidYouMean(attr.Name, slices.Sorted(maps.Keys(declared.Type().AttributeTypes()))))))
		ok = false
	}
	return ok
}

// value evaluates an attribute and converts it to want.
func (d *decoder) value(a *hcl.Attribute, want cty.Type, what string) (cty.Value, bool) {
	if !d.checkVarRefs(a.Expr) {
		return cty.NilVal, false
	}
	v, diags := a.Expr.Value(d.ctx)
	d.diags = append(d.diags, diags...)
	if diags.HasErrors() || !v.IsWhollyKnown() {
		// Unknown values come from variables already reported.
		return cty.NilVal, false
	}
	cv, err := convertValue(v, want)
	if err != nil || cv.IsNull() {
		d.errorf(a.Expr.Range(), "invalid value for "+a.Name,
			"%s must be %s; got %s.", a.Name, what, describe(v))
		return cty.NilVal, false
	}
	return cv, true
}

func (d *decoder) stringAttr(a *hcl.Attribute) (string, bool) {
	v, ok := d.value(a, cty.String, "a string")
	if !ok {
		return "", false
	}
	return v.AsString(), true
}

// Limits on counts, so that a typo cannot ask for a million goroutines.
var countLimits = map[string]int{
	"replicas":       MaxReplicas,
	"capacity":       1 << 20,
	"capacity_bytes": 1 << 40,
}

// MaxReplicas bounds a stage's replica count.
const MaxReplicas = 1024

func checkCount(v cty.Value, name string) (int, error) {
	n, err := wholeNumber(v)
	switch {
	case err != nil:
		return 0, err
	case n < 1:
		return 0, fmt.Errorf("must be at least 1; got %d", n)
	case n > countLimits[name]:
		return 0, fmt.Errorf("must be at most %d; got %d", countLimits[name], n)
	}
	return n, nil
}

// MaxRestarts bounds a stage's restarts.
const MaxRestarts = 100

// checkRestarts checks a stage's restarts: a whole number from 0 to
// MaxRestarts.
func checkRestarts(v cty.Value) (int, error) {
	n, err := wholeNumber(v)
	switch {
	case err != nil:
		return 0, err
	case n < 0:
		return 0, fmt.Errorf("must be at least 0; got %d", n)
	case n > MaxRestarts:
		return 0, fmt.Errorf("must be at most %d; got %d", MaxRestarts, n)
	}
	return n, nil
}

func wholeNumber(v cty.Value) (int, error) {
	bf := v.AsBigFloat()
	if !bf.IsInt() {
		return 0, fmt.Errorf("must be a whole number; got %s", bf.Text('g', -1))
	}
	i, acc := bf.Int64()
	if acc != 0 || i > 1<<40 || i < -(1<<40) {
		return 0, fmt.Errorf("%s is out of range", bf.Text('g', -1))
	}
	return int(i), nil
}

// sortDiagnostics orders diagnostics for reading: those without a position
// (command-line problems) first, then by file and position.
func sortDiagnostics(diags hcl.Diagnostics) {
	sort.SliceStable(diags, func(i, j int) bool {
		a, b := diags[i].Subject, diags[j].Subject
		switch {
		case a == nil || b == nil:
			return a == nil && b != nil
		case a.Filename != b.Filename:
			return a.Filename < b.Filename
		}
		return a.Start.Byte < b.Start.Byte
	})
}
