package graph

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// FailedPlugin, as the Extra of a diagnostic that Loader.Plugins returns,
// names a plugin that failed to start: the stages that use its kinds then
// add no "unknown node kind" of their own to that error.
type FailedPlugin string

// check resolves node kinds, decodes configs, connects edges to ports and
// reports everything wrong with the graph as a whole.
func (b *Builder) check() {
	if b.plugins != nil {
		seen := map[string]bool{}
		var referenced []string
		for _, s := range b.g.Stages {
			if name, _, ok := strings.Cut(s.Node, "/"); ok && !seen[name] {
				seen[name] = true
				referenced = append(referenced, name)
			}
		}
		declared, missing := b.findPlugins()
		referenced = slices.DeleteFunc(referenced, func(name string) bool {
			return slices.ContainsFunc(missing, func(d *hcl.Diagnostic) bool { return d.Extra == FailedPlugin(name) })
		})
		pd := append(b.plugins(declared, referenced), missing...)
		for _, d := range pd {
			if name, ok := d.Extra.(FailedPlugin); ok {
				if b.failedPlugins == nil {
					b.failedPlugins = map[string]bool{}
				}
				b.failedPlugins[string(name)] = true
			}
		}
		b.diags = append(b.diags, pd...)
	}
	for _, s := range b.g.Stages {
		b.resolveStage(s)
	}
	for _, e := range b.g.Edges {
		b.connect(e)
	}
	cyclic := b.checkCycles()
	b.resolveTypes(cyclic)
	for _, e := range b.g.Edges {
		b.checkTypes(e)
		if e.From != nil && e.To != nil {
			e.Queues = Wire(e.Policy, e.From.Stage.Replicas, e.To.Stage.Replicas)
		}
	}
	b.checkUnconnected()
	b.checkRestarts()
	b.checkRebalance()
}

// checkRestarts checks that a stage with restarts is a group kind that
// restores, whose items go nowhere downstream: a restart trains again on
// the items since the group's last save, and what it sent on them would
// be sent twice.
func (b *Builder) checkRestarts() {
	for _, s := range b.g.Stages {
		if s.Restarts == 0 || s.Kind == nil {
			continue
		}
		r := orRange(s.RestartsRange, s.NameRange)
		if !s.Kind.Restores {
			b.errorf(r, "restarts on a kind that does not restore", "stage %q: restarts = %d needs a plugin group kind that restores (restores = True in Python, Sync and Moves in a Go plugin): "+
				"its ranks start again from the group's last save. Kind %q does not; remove restarts.", s.Name, s.Restarts, s.Node)
			continue
		}
		for _, p := range s.Outputs {
			if len(p.Edges) > 0 {
				b.errorf(r, "restarts on a stage with output edges", "stage %q: restarts = %d, but its output %q feeds edge %q: a restart trains again on the items since the group's last save, "+
					"and what it sent on them would be sent twice. Restarts are for a stage whose outputs go nowhere (a trainer that writes its checkpoint); remove restarts or the edge.",
					s.Name, s.Restarts, p.Name, p.Edges[0].Name)
				break
			}
		}
	}
}

// findPlugins returns the declared plugins whose executables are there,
// and a diagnostic for each one that is not at the path it names, with
// the full path tried (a FailedPlugin: its stages then report nothing of
// their own).
func (b *Builder) findPlugins() (found []*Plugin, missing hcl.Diagnostics) {
	for _, p := range b.g.Plugins {
		if b.findPlugin != nil {
			path, err := b.findPlugin(p)
			if err != nil {
				subject := p.DeclRange.Ptr()
				if p.PathRange.Filename != "" {
					subject = p.PathRange.Ptr()
				}
				missing = append(missing, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "plugin refused",
					Detail: err.Error(), Subject: subject, Extra: FailedPlugin(p.Name)})
				continue
			}
			p.Path = path
			found = append(found, p)
			continue
		}
		if p.Path == "" { // no path attribute, already reported
			found = append(found, p)
			continue
		}
		problem := ""
		switch fi, err := os.Stat(p.Path); {
		case errors.Is(err, fs.ErrNotExist):
			problem = "no file"
		case err != nil:
			problem = err.Error()
		case fi.IsDir():
			problem = "a folder, not an executable,"
		case runtime.GOOS != "windows" && fi.Mode()&0o111 == 0:
			problem = "a file that is not executable (chmod +x it)"
		}
		if problem == "" {
			found = append(found, p)
			continue
		}
		detail := fmt.Sprintf("Plugin %q: %s at %s", p.Name, problem, p.Path)
		if !filepath.IsAbs(p.Written) {
			dir := PluginPath(p.DeclRange.Filename, ".")
			detail += fmt.Sprintf(" (the path %q, read from the folder of the spec file that declares it, %s)", p.Written, dir)
			if here, err := filepath.Abs(p.Written); err == nil && problem == "no file" {
				// What the path meant when it was read from the folder
				// dflow runs in.
				if fi, err := os.Stat(here); err == nil && !fi.IsDir() {
					if rel, err := filepath.Rel(dir, here); err == nil {
						detail += fmt.Sprintf(". The folder dflow runs in has %s: from the spec's folder that is %q", p.Written, rel)
					}
				}
			}
		}
		missing = append(missing, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "plugin failed to start",
			Detail: detail + ".", Subject: p.PathRange.Ptr(), Extra: FailedPlugin(p.Name)})
	}
	return found, missing
}

func (b *Builder) resolveStage(s *Stage) {
	if s.Node == "" {
		return // missing or invalid node attribute, already reported
	}
	k, ok := b.catalog.Kind(s.Node)
	if name, _, plugin := strings.Cut(s.Node, "/"); !ok && plugin && b.failedPlugins[name] {
		return // the plugin's failure to start is the error
	}
	if !ok {
		b.errorf(s.NodeRange, "unknown node kind", "stage %q: node kind %q is not known%s",
			s.Name, s.Node, hinted(DidYouMean(s.Node, b.catalog.KindNames()), b.kindHint(s.Node)))
		return
	}
	s.Kind = k
	b.decodeConfig(s, k)
	if k.Ports == nil {
		return
	}
	for _, ps := range k.Ports(s.Config) {
		p := &Port{Stage: s, Name: ps.Name, Dir: ps.Dir, Type: ps.Type, noKeys: ps.NoKeys, noKeysField: ps.NoKeysField}
		if ps.Dir == In {
			s.Inputs = append(s.Inputs, p)
		} else {
			s.Outputs = append(s.Outputs, p)
		}
	}
}

func (b *Builder) kindHint(node string) string {
	if plugin, _, ok := strings.Cut(node, "/"); ok {
		for _, p := range b.g.Plugins {
			if p.Name == plugin {
				return fmt.Sprintf(" Plugin %q (%s) offers no such kind; `dflow plugins` lists what it offers.", plugin, p.Path)
			}
		}
		return fmt.Sprintf(" No plugin %q is declared in this spec or found in ./plugins or $DFLOW_PLUGIN_DIR.", plugin)
	}
	return " Known kinds: " + strings.Join(b.catalog.KindNames(), ", ") + "."
}

// decodeConfig decodes the stage's config block against the kind's schema.
func (b *Builder) decodeConfig(s *Stage, k *Kind) {
	cfg := s.Config
	cfg.values = map[string]cty.Value{}
	cfg.ranges = map[string]hcl.Range{}
	schema := &hcl.BodySchema{}
	fields := map[string]Field{}
	for _, f := range k.Config {
		schema.Attributes = append(schema.Attributes, hcl.AttributeSchema{Name: f.Name, Required: f.Required && b.pendingConfig[s][f.Name] == ""})
		fields[f.Name] = f
	}
	if body := b.drafts[s].configBody; body != nil {
		content, diags := body.Content(schema)
		b.diags = append(b.diags, b.configDiags(s, diags)...)
		for _, a := range byPosition(content.Attributes) {
			name := a.Name
			f := fields[name]
			if v, ok := b.eval(a, f.Type.cty(), "of type "+f.Type.String()); ok {
				if err := checkField(f, v); err != nil {
					b.errorf(a.Expr.Range(), "invalid value for "+name, "stage %q: config attribute %s %v.", s.Name, name, err)
					continue
				}
				cfg.values[name] = v
				cfg.ranges[name] = a.Expr.Range()
			}
		}
	} else {
		b.goConfig(s, k, fields)
		given := map[string]bool{} // a value given but refused is reported as such, not as missing too
		for _, item := range b.drafts[s].config {
			given[item.key] = true
		}
		for _, f := range k.Config {
			if _, set := cfg.values[f.Name]; !set && f.Required && !given[f.Name] && b.pendingConfig[s][f.Name] == "" {
				b.errorf(s.NameRange, "missing config attribute",
					"stage %q: node %q needs config attribute %q: %s", s.Name, k.Name, f.Name, f.Doc)
			}
		}
	}
	b.applyPendingConfig(s, fields)
	for _, f := range k.Config {
		if _, set := cfg.values[f.Name]; !set && f.Default != cty.NilVal {
			cfg.values[f.Name] = f.Default
		}
	}
	if k.Check == nil {
		return
	}
	for _, err := range k.Check(cfg) {
		r := cfg.block
		var fe *FieldError
		if errors.As(err, &fe) {
			if b.fromSet[s][fe.Field] {
				// The value came from the command line: say so, with no
				// position in the file, whose value was overridden.
				b.diags = append(b.diags, &hcl.Diagnostic{
					Severity: hcl.DiagError,
					Summary:  "invalid --set",
					Detail: sentence(fmt.Sprintf("--set stage.%s.config.%s=%s: stage %q (%s): %v",
						s.Name, fe.Field, b.pendingConfig[s][fe.Field], s.Name, k.Name, err)),
				})
				continue
			}
			r = cfg.Range(fe.Field)
		}
		b.errorf(r, "invalid config", "stage %q (%s): %v.", s.Name, k.Name, err)
	}
}

// goConfig decodes the ConfigAttr options of a stage built in Go, as the
// config block of a spec is decoded: each value converted to the type the
// kind's schema declares.
func (b *Builder) goConfig(s *Stage, k *Kind, fields map[string]Field) {
	for _, item := range b.drafts[s].config {
		f, ok := fields[item.key]
		if !ok {
			b.errorf(hcl.Range{}, "unknown config attribute", "%s", sentence(fmt.Sprintf(
				"stage %q (node %q): node %q has no config attribute %q%s",
				s.Name, s.Node, k.Name, item.key, DidYouMean(item.key, slices.Sorted(maps.Keys(fields))))))
			continue
		}
		if _, dup := s.Config.values[item.key]; dup {
			b.errorf(hcl.Range{}, "duplicate config attribute",
				"stage %q: config attribute %s is given twice; give it once.", s.Name, item.key)
			continue
		}
		v, err := goValue(item.value)
		if err == nil {
			var cv cty.Value
			if cv, err = convertValue(v, f.Type.cty()); err != nil || cv.IsNull() {
				err = fmt.Errorf("must be of type %s; got %s", f.Type, describe(v))
			}
			v = cv
		}
		if err == nil {
			err = checkField(f, v)
		}
		if err != nil {
			b.errorf(hcl.Range{}, "invalid value for "+item.key, "stage %q: config attribute %s %v.", s.Name, item.key, err)
			continue
		}
		s.Config.values[item.key] = v
	}
}

// configDiags adds the stage name to hcl's own schema diagnostics.
func (b *Builder) configDiags(s *Stage, diags hcl.Diagnostics) hcl.Diagnostics {
	for _, diag := range diags {
		diag.Detail = fmt.Sprintf("stage %q (node %q): %s", s.Name, s.Node, diag.Detail)
	}
	return diags
}

func (b *Builder) applyPendingConfig(s *Stage, fields map[string]Field) {
	for name, raw := range b.pendingConfig[s] {
		f, ok := fields[name]
		var err error
		var v cty.Value
		if !ok {
			err = fmt.Errorf("node %q has no config attribute %q%s", s.Node, name, DidYouMean(name, slices.Sorted(maps.Keys(fields))))
		} else if v, err = ParseValue(raw, f.Type.cty()); err == nil {
			err = checkField(f, v)
		}
		if err != nil {
			b.diags = append(b.diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "invalid --set",
				Detail:   sentence(fmt.Sprintf("--set stage.%s.config.%s=%s: %v", s.Name, name, raw, err)),
			})
			continue
		}
		s.Config.values[name] = v
		delete(s.Config.ranges, name) // the file's value no longer counts
		if b.fromSet == nil {
			b.fromSet = map[*Stage]map[string]bool{}
		}
		if b.fromSet[s] == nil {
			b.fromSet[s] = map[string]bool{}
		}
		b.fromSet[s][name] = true
	}
}

func checkField(f Field, v cty.Value) error {
	if f.Type == Int {
		if _, err := wholeNumber(v); err != nil {
			return err
		}
	}
	return nil
}

// connect resolves an edge's STAGE.PORT references.
func (b *Builder) connect(e *Edge) {
	refs := b.refs[e]
	e.From = b.resolvePort(e, refs[0], Out, e.FromRange)
	e.To = b.resolvePort(e, refs[1], In, e.ToRange)
	if e.From != nil {
		e.From.Edges = append(e.From.Edges, e)
	}
	if e.To != nil {
		e.To.Edges = append(e.To.Edges, e)
	}
}

func (b *Builder) resolvePort(e *Edge, ref *portRef, dir Direction, r hcl.Range) *Port {
	if ref == nil {
		return nil
	}
	stageName, portName := ref.stage, ref.port
	s := b.g.stages[stageName]
	if s == nil {
		b.errorf(ref.stageRange, "unknown stage", "%s", sentence(fmt.Sprintf("edge %q: stage %q is not defined%s",
			e.Name, stageName, DidYouMean(stageName, slices.Sorted(maps.Keys(b.g.stages))))))
		return nil
	}
	if s.Kind == nil {
		return nil // the stage's node is unknown, already reported
	}
	p := s.Port(portName)
	attr := map[Direction]string{In: "to", Out: "from"}[dir]
	if p == nil {
		ports := s.Outputs
		if dir == In {
			ports = s.Inputs
		}
		var names []string
		for _, p := range ports {
			names = append(names, p.Name)
		}
		list := "none"
		if len(names) > 0 {
			list = strings.Join(names, ", ")
		}
		b.errorf(ref.portRange, "unknown port", "%s", sentence(fmt.Sprintf(
			"edge %q: stage %q (node %q) has no %s port %q; its %s ports are: %s%s",
			e.Name, s.Name, s.Node, dir, portName, dir, list, DidYouMean(portName, names))))
		return nil
	}
	if p.Dir != dir {
		b.errorf(r, "wrong port direction",
			"edge %q: %s is an %s port, but %q must name an %s port.", e.Name, p, p.Dir, attr, dir)
		return nil
	}
	return p
}

// resolveTypes fills in the types of SameAs output ports from what feeds
// their input, following the graph to a fixed point.
func (b *Builder) resolveTypes(cyclic bool) {
	sameAs := map[*Port]string{}
	for _, s := range b.g.Stages {
		if s.Kind == nil || s.Kind.Ports == nil {
			continue
		}
		for _, ps := range s.Kind.Ports(s.Config) {
			if ps.SameAs != "" {
				p := s.Port(ps.Name)
				sameAs[p] = ps.SameAs
				p.Type = ""
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for p, src := range sameAs {
			if p.Type != "" {
				continue
			}
			if t, ok := inputType(p.Stage.Port(src)); ok {
				p.Type = t
				changed = true
			}
		}
	}
	for p := range sameAs {
		if p.Type == "" {
			p.Type = Any
		}
	}
}

// inputType is the type of items arriving at an input port: the common
// type of its edges' sources, Any when they differ or none is connected,
// and not ok while a source is still unresolved.
func inputType(in *Port) (string, bool) {
	if in == nil {
		return Any, true
	}
	t := ""
	for _, e := range in.Edges {
		if e.From == nil {
			continue
		}
		switch {
		case e.From.Type == "":
			return "", false
		case t == "":
			t = e.From.Type
		case t != e.From.Type:
			t = Any
		}
	}
	if t == "" {
		t = in.Type
	}
	return t, true
}

// Compatible reports whether items of type from may flow into a port of
// type to.
func Compatible(from, to string) bool {
	return from == to || from == Any || to == Any
}

func (b *Builder) checkTypes(e *Edge) {
	if e.From == nil || e.To == nil || Compatible(e.From.Type, e.To.Type) {
		return
	}
	b.diags = append(b.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  "type mismatch",
		Detail: fmt.Sprintf("edge %q: %s emits %q items but %s takes %q; connect ports of the same type.",
			e.Name, e.From, e.From.Type, e.To, e.To.Type),
		Subject: subject(e.ToRange),
		Context: subject(hcl.RangeBetween(e.FromRange, e.ToRange)),
	})
}

// CheckKeys reports, as errors at the edge's policy, each key_hash edge
// from a port whose node says its items carry no key (PortSpec.NoKeys,
// synthetic_source with keys = 0): the edge routes every item by its key,
// so the run would fail at its first item (nodes.ErrNoKey). dflow
// validate and every dflow command that loads a spec run it on the
// loaded graph, as they run the deadlock check. The Loader and the
// Builder do not: a graph with such an edge still builds, and its run
// fails as it always has, which the runtime's own tests of that failure
// rely on.
func CheckKeys(g *Graph) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, e := range g.Edges {
		if e.Policy != KeyHash || e.From == nil || e.From.noKeys == "" {
			continue
		}
		s := e.From.Stage
		where := ""
		if f := e.From.noKeysField; f != "" && s.Config != nil {
			if r, ok := s.Config.ranges[f]; ok && !isZero(r) { // written in the spec
				where = fmt.Sprintf(" Stage %q sets %s at %s:%d.", s.Name, f, r.Filename, r.Start.Line)
			}
		}
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "key_hash edge without keys",
			Detail: fmt.Sprintf("edge %q: policy key_hash sends each item to the consumer replica its key picks, but %s (%s) emits items without keys: %s.%s "+
				"Give its items keys, or choose another policy: %q or %q.",
				e.Name, e.From, s.Node, e.From.noKeys, where, Shared, RoundRobin),
			Subject: subject(e.PolicyRange),
		})
	}
	return diags
}

func (b *Builder) checkUnconnected() {
	for _, s := range b.g.Stages {
		for _, p := range s.Inputs {
			if len(p.Edges) == 0 && !b.mentions(p) {
				b.errorf(s.NameRange, "input port with no edge",
					"stage %q: input port %q (%s) has no edge feeding it; add an edge with to = %s.",
					s.Name, p.Name, p.Type, p)
			}
		}
		for _, p := range s.Outputs {
			if len(p.Edges) == 0 {
				b.diags = append(b.diags, &hcl.Diagnostic{
					Severity: hcl.DiagWarning,
					Summary:  "output port with no edge",
					Detail: fmt.Sprintf("stage %q: output port %q (%s) has no edge; its items are dropped.",
						s.Name, p.Name, p.Type),
					Subject: subject(s.NameRange),
				})
			}
		}
	}
}

// mentions reports whether some edge names the port but failed to resolve
// (a wrong direction), so the missing edge is not reported twice.
func (b *Builder) mentions(p *Port) bool {
	for _, e := range b.g.Edges {
		for _, ref := range b.refs[e] {
			if ref != nil && ref.stage == p.Stage.Name && ref.port == p.Name {
				return true
			}
		}
	}
	return false
}

// byPosition returns attributes in source order, so diagnostics come out
// in a stable reading order.
func byPosition(attrs hcl.Attributes) []*hcl.Attribute {
	out := make([]*hcl.Attribute, 0, len(attrs))
	for _, a := range attrs {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Range.Start.Byte < out[j].Range.Start.Byte })
	return out
}
