package graph_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/hashicorp/hcl/v2"
)

const pluginSpec = `plugin "x" {
  path = "%PATH%"
}

stage "src" {
  node = "synthetic_source"
  config {
    count = 3
  }
}

stage "pass" {
  node = "x/pass"
}

stage "done" {
  node = "sink"
}

edge "a" {
  from = src.out
  to   = pass.in
}

edge "b" {
  from = pass.out
  to   = done.in
}
`

// pluginLoader is a Loader whose Plugins hook stands for dflow's: it
// records the path each declared plugin is started from and, where a file
// is there, registers the plugin's one kind, x/pass.
func pluginLoader(started *[]string) *graph.Loader {
	reg := testRegistry()
	return &graph.Loader{Catalog: reg, Plugins: func(declared []*graph.Plugin, referenced []string) hcl.Diagnostics {
		for _, p := range declared {
			*started = append(*started, p.Path)
			if _, err := os.Stat(p.Path); err == nil {
				reg.Register(nodes.Spec{Kind: graph.Kind{Name: p.Name + "/pass", Ports: func(*graph.Config) []graph.PortSpec {
					return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}, {Name: "out", Dir: graph.Out, SameAs: "in"}}
				}}})
			}
		}
		return nil
	}}
}

// specWithPlugin writes root/specs/p.hcl declaring plugin x at path, and
// an executable root/bin/dflow-plugin-x; it returns root.
func specWithPlugin(t *testing.T, path string) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"specs", "bin"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "dflow-plugin-x"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := strings.Replace(pluginSpec, "%PATH%", path, 1)
	if err := os.WriteFile(filepath.Join(root, "specs", "p.hcl"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestPluginPathFromSpecFolder: a plugin block's relative path is read
// from the folder of the spec that declares it, whatever folder dflow
// runs in (issue 28: a good spec failed when run from elsewhere), and an
// absolute one is kept.
func TestPluginPathFromSpecFolder(t *testing.T) {
	root := specWithPlugin(t, "../bin/dflow-plugin-x")
	want := filepath.Join(root, "bin", "dflow-plugin-x")
	elsewhere := t.TempDir()
	t.Chdir(elsewhere)
	rel, err := filepath.Rel(elsewhere, filepath.Join(root, "specs", "p.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{filepath.Join(root, "specs", "p.hcl"), rel} {
		var started []string
		g, diags := pluginLoader(&started).LoadFile(file)
		if diags.HasErrors() {
			t.Fatalf("%s from %s: %v", file, elsewhere, diags)
		}
		if len(started) != 1 || started[0] != want {
			t.Errorf("%s from %s: plugin started from %q, want %q", file, elsewhere, started, want)
		}
		if p := g.Plugins[0]; p.Path != want || p.Written != "../bin/dflow-plugin-x" {
			t.Errorf("Plugin{Path: %q, Written: %q}", p.Path, p.Written)
		}
	}

	t.Run("absolute", func(t *testing.T) {
		other := specWithPlugin(t, "")
		abs := filepath.Join(other, "bin", "dflow-plugin-x")
		root := specWithPlugin(t, abs)
		var started []string
		if _, diags := pluginLoader(&started).LoadFile(filepath.Join(root, "specs", "p.hcl")); diags.HasErrors() {
			t.Fatal(diags)
		}
		if len(started) != 1 || started[0] != abs {
			t.Errorf("plugin started from %q, want %q", started, abs)
		}
	})

	t.Run("in memory", func(t *testing.T) {
		// A spec loaded from memory under a bare name is in the folder
		// dflow runs in, as before.
		dir := specWithPlugin(t, "")
		t.Chdir(filepath.Join(dir, "bin"))
		var started []string
		src := strings.Replace(pluginSpec, "%PATH%", "dflow-plugin-x", 1)
		if _, diags := pluginLoader(&started).Load("p.hcl", []byte(src)); diags.HasErrors() {
			t.Fatal(diags)
		}
		if want := filepath.Join(dir, "bin", "dflow-plugin-x"); len(started) != 1 || started[0] != want {
			t.Errorf("plugin started from %q, want %q", started, want)
		}
	})
}

// TestPluginNotFound: a plugin whose executable is not where its path
// leads is one error, at the path, naming the full path tried (issue 28:
// the error showed ./dflow-plugin-x and not the folder searched); its
// stages add no "unknown node kind", and nothing is started.
func TestPluginNotFound(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		setup      func(root string) // before loading
		want       []string          // in the error's detail, after ROOT is replaced
	}{
		{name: "missing", path: "./dflow-plugin-x",
			want: []string{`no file at ROOT/specs/dflow-plugin-x`, `the path "./dflow-plugin-x", read from the folder of the spec file that declares it, ROOT/specs`}},
		{name: "written from where dflow runs", path: "bin/dflow-plugin-x",
			want: []string{`no file at ROOT/specs/bin/dflow-plugin-x`, `The folder dflow runs in has bin/dflow-plugin-x: from the spec's folder that is "../bin/dflow-plugin-x"`}},
		{name: "not executable", path: "../bin/dflow-plugin-x",
			setup: func(root string) { os.Chmod(filepath.Join(root, "bin", "dflow-plugin-x"), 0o644) },
			want:  []string{`a file that is not executable (chmod +x it) at ROOT/bin/dflow-plugin-x`}},
		{name: "folder", path: "../bin",
			want: []string{`a folder, not an executable, at ROOT/bin`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := specWithPlugin(t, tc.path)
			if tc.setup != nil {
				tc.setup(root)
			}
			t.Chdir(root) // where "bin/dflow-plugin-x" is
			var started []string
			_, diags := pluginLoader(&started).LoadFile(filepath.Join("specs", "p.hcl"))
			if len(started) != 0 {
				t.Errorf("plugin started from %q", started)
			}
			if len(diags) != 1 {
				t.Fatalf("want one error, got %v", diags)
			}
			d := diags[0]
			if d.Severity != hcl.DiagError || d.Summary != "plugin failed to start" || d.Subject == nil || d.Subject.Start.Line != 2 {
				t.Errorf("got %s at %v", d.Summary, d.Subject)
			}
			for _, w := range tc.want {
				if w = strings.ReplaceAll(w, "ROOT", root); !strings.Contains(d.Detail, w) {
					t.Errorf("detail %q\nlacks %q", d.Detail, w)
				}
			}
		})
	}
}
