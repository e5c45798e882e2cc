package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/host"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// kindDoc is one node kind as `dflow nodes` and `dflow plugins` describe
// it, in text, JSON and Markdown: one description, whoever defines the
// kind.
type kindDoc struct {
	Name string `json:"name"`
	// Plugin and Path say which plugin executable offers the kind; empty
	// for a built-in kind.
	Plugin string `json:"plugin,omitempty"`
	Path   string `json:"path,omitempty"`
	Doc    string `json:"doc"`
	// Group: a plugin's group kind, whose replicas step together (each a
	// rank, its stage a replica group).
	Group bool `json:"group,omitempty"`
	// Restores: a group kind that saves and restores its state, so that
	// on a cluster it restarts whole after a lost worker.
	Restores bool       `json:"restores,omitempty"`
	Ports    []portDoc  `json:"ports"`
	Config   []fieldDoc `json:"config"`
	// Metrics are the node metrics the kind declares, with how the
	// stage's figure merges its replicas' (graph.Merge).
	Metrics []metricDoc `json:"metrics,omitempty"`
}

// mergeWords say how a stage's figure comes from its replicas'.
var mergeWords = map[string]string{
	string(graph.MergeLast): "the latest any replica set",
	string(graph.MergeMean): "the mean over replicas",
	string(graph.MergeMax):  "the largest of the replicas'",
	string(graph.MergeSum):  "summed over replicas",
}

// metricDoc is one declared node metric.
type metricDoc struct {
	Name  string `json:"name"`
	Merge string `json:"merge"`
	Doc   string `json:"doc"`
}

// portDoc is one port, for the kind's default config (a port's type may
// depend on the config: synthetic_source's type, target_forward's model).
type portDoc struct {
	Name      string `json:"name"`
	Direction string `json:"direction"`      // "in" or "out"
	Type      string `json:"type,omitempty"` // empty when SameAs is set
	SameAs    string `json:"same_as,omitempty"`
	Doc       string `json:"doc"`
}

// fieldDoc is one config attribute.
type fieldDoc struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Required bool   `json:"required"`
	// Default is the value an absent attribute takes, as JSON (which is
	// also how it is written in HCL); absent when there is none.
	Default json.RawMessage `json:"default,omitempty"`
	Doc     string          `json:"doc"`
}

// describeKind builds the description of a registered kind, with the
// ports its default config has.
func describeKind(k *graph.Kind) kindDoc {
	d := newKindDoc(k.Name, k.Doc, k.Config, k.Ports(defaultConfig(k.Config)))
	for _, m := range k.Metrics {
		d.Metrics = append(d.Metrics, metricDoc{Name: m.Name, Merge: string(k.MetricMerge(m.Name, false)), Doc: m.Doc})
	}
	return d
}

// pluginKindDoc builds the description of a kind a plugin reported.
func pluginKindDoc(plugin, path string, k host.KindInfo) kindDoc {
	d := newKindDoc(k.Name, k.Doc, k.Config, k.Ports)
	d.Plugin, d.Path, d.Group, d.Restores = plugin, path, k.Group, k.Restores
	return d
}

func newKindDoc(name, doc string, fields []graph.Field, ports []graph.PortSpec) kindDoc {
	d := kindDoc{Name: name, Doc: doc, Ports: []portDoc{}, Config: []fieldDoc{}}
	for _, p := range ports {
		dir := "in"
		if p.Dir == graph.Out {
			dir = "out"
		}
		pd := portDoc{Name: p.Name, Direction: dir, Type: p.Type, SameAs: p.SameAs, Doc: p.Doc}
		if pd.SameAs != "" {
			pd.Type = ""
		}
		d.Ports = append(d.Ports, pd)
	}
	for _, f := range fields {
		fd := fieldDoc{Name: f.Name, Type: f.Type.String(), Required: f.Required, Doc: f.Doc}
		if f.Default != cty.NilVal && !f.Default.IsNull() {
			if b, err := ctyjson.Marshal(f.Default, f.Default.Type()); err == nil {
				fd.Default = b
			}
		}
		d.Config = append(d.Config, fd)
	}
	return d
}

// defaultConfig is the config of a stage that sets no attribute.
func defaultConfig(fields []graph.Field) *graph.Config {
	vals := map[string]cty.Value{}
	for _, f := range fields {
		if f.Default != cty.NilVal {
			vals[f.Name] = f.Default
		}
	}
	return graph.NewConfig(vals)
}

// portType is what a port carries, in words.
func (p portDoc) portType() string {
	if p.SameAs != "" {
		return "(the type of " + p.SameAs + ")"
	}
	return p.Type
}

// writeKind prints one kind in text, every line after indent: its name,
// its doc, whether it is a group kind, a line per port (direction, name,
// type, doc) and a line per config attribute (name, type, default or
// required, doc). withSource adds which plugin offers it (`dflow
// plugins` says so in its heading).
func writeKind(w io.Writer, k kindDoc, indent string, withSource bool) {
	fmt.Fprintf(w, "%snode %s\n", indent, k.Name)
	in := indent + "  "
	if withSource && k.Plugin != "" {
		fmt.Fprintf(w, "%sfrom plugin %s (%s)\n", in, k.Plugin, k.Path)
	}
	if k.Doc != "" {
		fmt.Fprintf(w, "%s\n", wrap(k.Doc, 76-len(in), in))
	}
	if k.Group {
		fmt.Fprintf(w, "%sgroup kind: its replicas step together, each a rank with torchrun's environment\n", in)
	}
	if k.Restores {
		fmt.Fprintf(w, "%srestores: the group restarts whole from its last save, on a cluster when a worker is lost, in one process when a rank's process dies (restarts)\n", in)
	}
	for _, p := range k.Ports {
		line := fmt.Sprintf("%s%-3s %s %s", in, p.Direction, p.Name, p.portType())
		if p.Doc != "" {
			line += ": " + p.Doc
		}
		fmt.Fprintln(w, line)
	}
	for _, f := range k.Config {
		fmt.Fprintf(w, "%sconfig %s\n", in, f.summary())
	}
	for _, m := range k.Metrics {
		fmt.Fprintf(w, "%smetric %s (%s): %s\n", in, m.Name, mergeWords[m.Merge], m.Doc)
	}
}

// summary is "NAME TYPE = DEFAULT: DOC", or "NAME TYPE (required): DOC".
func (f fieldDoc) summary() string {
	s := f.Name + " " + f.Type
	if f.Default != nil {
		s += " = " + string(f.Default)
	}
	if f.Required {
		s += " (required)"
	}
	if f.Doc != "" {
		s += ": " + f.Doc
	}
	return s
}

// builtinKinds describes every kind of reg, sorted by name.
func builtinKinds(reg *nodes.Registry) []kindDoc {
	var out []kindDoc
	for _, name := range reg.KindNames() {
		if k, ok := reg.Kind(name); ok {
			out = append(out, describeKind(k))
		}
	}
	return out
}

// pluginKinds starts the plugins found in dirs (all of them, or only the
// one named) and describes their kinds. A plugin that fails to start is
// reported on stderr and makes ok false; the others are still listed.
func (e *env) pluginKinds(dirs []string, only string) (kinds []kindDoc, ok bool) {
	found := host.Discover(dirs)
	ok = true
	for _, name := range slices.Sorted(maps.Keys(found)) {
		if only != "" && name != only {
			continue
		}
		infos, err := e.host().Load(name, found[name], e.registry)
		if err != nil {
			fmt.Fprintf(e.stderr, "dflow nodes: %v\n", err)
			ok = false
			continue
		}
		for _, k := range infos {
			kinds = append(kinds, pluginKindDoc(name, found[name], k))
		}
	}
	return kinds, ok
}

const nodesUsage = "[KIND] [--json | --markdown]"

func cmdNodes(e *env, args []string) int {
	fs := flag.NewFlagSet("nodes", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the kinds as JSON: a list, or one object for KIND")
	markdown := fs.Bool("markdown", false, "print the built-in kinds as the Markdown of docs/spec-language.md's node table (no plugins)")
	pos, code, ok := parse(e, fs, args, nodesUsage)
	if !ok {
		return code
	}
	switch {
	case len(pos) > 1:
		return usageErr(e, "nodes", "takes at most one KIND; got %d arguments (%s)", len(pos), strings.Join(pos, " "))
	case *asJSON && *markdown:
		return usageErr(e, "nodes", "--json and --markdown are two outputs; choose one")
	case *markdown && len(pos) == 1:
		return usageErr(e, "nodes", "--markdown prints the whole table of built-in kinds; leave out %s", pos[0])
	}
	if *markdown {
		writeMarkdown(e.stdout, builtinKinds(e.registry))
		return exitOK
	}
	builtin := builtinKinds(e.registry)
	if len(pos) == 1 {
		return e.showKind(pos[0], builtin, *asJSON)
	}
	plugged, pluginsOK := e.pluginKinds(host.Dirs(), "")
	all := append(builtin, plugged...)
	if *asJSON {
		writeJSON(e.stdout, all)
	} else {
		bw := bufio.NewWriter(e.stdout)
		for i, k := range all {
			if i > 0 {
				fmt.Fprintln(bw)
			}
			writeKind(bw, k, "", true)
		}
		bw.Flush()
	}
	if !pluginsOK {
		return exitFailed
	}
	return exitOK
}

// showKind prints one kind. A built-in kind needs no plugin started; for
// PLUGIN/KIND only that plugin is; a kind not found starts every plugin,
// to suggest the closest name among all kinds.
func (e *env) showKind(name string, builtin []kindDoc, asJSON bool) int {
	kinds := builtin
	if i := slices.IndexFunc(kinds, func(k kindDoc) bool { return k.Name == name }); i < 0 {
		plugin, _, isPlugin := strings.Cut(name, "/")
		if !isPlugin {
			plugin = ""
		}
		plugged, _ := e.pluginKinds(host.Dirs(), plugin)
		kinds = append(kinds, plugged...)
		if isPlugin && len(plugged) == 0 {
			// PLUGIN/KIND of a plugin that is not there, or did not
			// start: suggest among every kind.
			more, _ := e.pluginKinds(host.Dirs(), "")
			kinds = append(kinds, more...)
		}
	}
	i := slices.IndexFunc(kinds, func(k kindDoc) bool { return k.Name == name })
	if i < 0 {
		names := make([]string, len(kinds))
		for j, k := range kinds {
			names[j] = k.Name
		}
		fmt.Fprintf(e.stderr, "dflow nodes: no node kind %q%s; 'dflow nodes' lists them all\n", name, graph.DidYouMean(name, names))
		return exitFailed
	}
	if asJSON {
		writeJSON(e.stdout, kinds[i])
	} else {
		writeKind(e.stdout, kinds[i], "", true)
	}
	return exitOK
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// Markers around the generated node table in docs/spec-language.md.
const (
	nodeTableBegin = "<!-- nodes:begin: generated from the node registry by `go run ./cmd/dflow nodes --markdown`; edit the kinds' docs in nodes/, not here -->"
	nodeTableEnd   = "<!-- nodes:end -->"
)

// writeMarkdown prints the node reference of docs/spec-language.md: one
// table of every kind (ports, required config, what it does), then a
// section per kind with its ports and a table of its config.
func writeMarkdown(w io.Writer, kinds []kindDoc) {
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	fmt.Fprint(bw, "| node | in | out | required config | does |\n| --- | --- | --- | --- | --- |\n")
	for _, k := range kinds {
		var in, out, req []string
		for _, p := range k.Ports {
			s := fmt.Sprintf("`%s` (%s)", p.Name, mdPortType(p))
			if p.Direction == "in" {
				in = append(in, s)
			} else {
				out = append(out, s)
			}
		}
		for _, f := range k.Config {
			if f.Required {
				req = append(req, "`"+f.Name+"`")
			}
		}
		fmt.Fprintf(bw, "| [`%s`](#%s) | %s | %s | %s | %s |\n", k.Name, anchor(k.Name),
			strings.Join(in, ", "), strings.Join(out, ", "), strings.Join(req, ", "), mdCell(k.Doc))
	}
	fmt.Fprint(bw, "\nPort types are those of the default config, without the parameters a model adds (`hidden_states(d=128,layers=0,2,3)` is `hidden_states`).\n")
	for _, k := range kinds {
		fmt.Fprintf(bw, "\n### `%s`\n\n", k.Name)
		if k.Doc != "" {
			fmt.Fprintf(bw, "%s\n\n", k.Doc)
		}
		for _, p := range k.Ports {
			dir := "input"
			if p.Direction == "out" {
				dir = "output"
			}
			fmt.Fprintf(bw, "- %s `%s` (%s)", dir, p.Name, mdPortType(p))
			if p.Doc != "" {
				fmt.Fprintf(bw, ": %s", mdText(p.Doc))
			}
			fmt.Fprintln(bw)
		}
		if len(k.Config) == 0 {
			fmt.Fprint(bw, "\nNo config.\n")
			continue
		}
		fmt.Fprint(bw, "\n| config | type | default | meaning |\n| --- | --- | --- | --- |\n")
		for _, f := range k.Config {
			def := "unset"
			switch {
			case f.Required:
				def = "required"
			case f.Default != nil:
				def = "`" + string(f.Default) + "`"
			}
			fmt.Fprintf(bw, "| `%s` | %s | %s | %s |\n", f.Name, f.Type, strings.ReplaceAll(def, "|", `\|`), mdCell(f.Doc))
		}
		if len(k.Metrics) > 0 {
			fmt.Fprint(bw, "\n| metric | over replicas | meaning |\n| --- | --- | --- |\n")
			for _, m := range k.Metrics {
				fmt.Fprintf(bw, "| `%s` | %s | %s |\n", m.Name, mergeWords[m.Merge], mdCell(m.Doc))
			}
		}
	}
}

// mdPortType is a port's type for the docs: without the parameters a
// config's files add (target_forward's hidden_states(d=128,layers=0,2,3)
// is hidden_states), so that the table does not depend on which models
// are where it is generated.
func mdPortType(p portDoc) string {
	if p.SameAs != "" {
		return "the type of `" + p.SameAs + "`"
	}
	t := p.Type
	if i := strings.IndexByte(t, '('); i > 0 && strings.HasSuffix(t, ")") {
		t = t[:i]
	}
	return "`" + t + "`"
}

// anchor is the id GitHub gives a "### `name`" heading.
func anchor(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// mdText keeps a doc string's characters from being read as Markdown.
func mdText(s string) string {
	return strings.NewReplacer("*", `\*`, "<", "&lt;", "\n", " ").Replace(s)
}

// mdCell is mdText inside a table cell, where | ends the cell.
func mdCell(s string) string {
	return strings.ReplaceAll(mdText(s), "|", `\|`)
}
