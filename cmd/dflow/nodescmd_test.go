package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/nodes"
)

var updateNodeTable = flag.Bool("update", false, "rewrite the node table of docs/spec-language.md from the registry")

const specLanguageDoc = "../../docs/spec-language.md"

// TestNodeTable: the node table of docs/spec-language.md is what `dflow
// nodes --markdown` prints, so the doc cannot drift from the registry.
func TestNodeTable(t *testing.T) {
	doc, err := os.ReadFile(specLanguageDoc)
	if err != nil {
		t.Fatal(err)
	}
	code, want, stderr := dflow(t, "nodes", "--markdown")
	if code != exitOK || stderr != "" {
		t.Fatalf("nodes --markdown: code %d\n%s", code, stderr)
	}
	before, rest, ok1 := bytes.Cut(doc, []byte(nodeTableBegin+"\n"))
	got, after, ok2 := bytes.Cut(rest, []byte(nodeTableEnd+"\n"))
	if !ok1 || !ok2 || bytes.Contains(rest, []byte(nodeTableBegin)) {
		t.Fatalf("%s: want the node table between one %q line and one %q line", specLanguageDoc, nodeTableBegin, nodeTableEnd)
	}
	if string(got) == want {
		return
	}
	if *updateNodeTable {
		var b bytes.Buffer
		b.Write(before)
		b.WriteString(nodeTableBegin + "\n" + want + nodeTableEnd + "\n")
		b.Write(after)
		if err := os.WriteFile(specLanguageDoc, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the node table of %s", specLanguageDoc)
		return
	}
	t.Errorf("the node table of docs/spec-language.md is not what the registry says; regenerate it with\n"+
		"  go test ./cmd/dflow -run TestNodeTable -update\n"+
		"(or put the output of `go run ./cmd/dflow nodes --markdown` between its markers). First difference:\n%s",
		firstDiff(string(got), want))
}

// firstDiff shows the first line where two texts differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "  line " + strconv.Itoa(i+1) + " of the table\n  doc:      " + gl + "\n  registry: " + wl
		}
	}
	return ""
}

// noPlugins points plugin discovery at an empty folder (and the test runs
// in cmd/dflow, where there is no ./plugins).
func noPlugins(t *testing.T) {
	t.Setenv("DFLOW_PLUGIN_DIR", t.TempDir())
}

// TestNodesList: every registered kind is listed with each of its ports
// and config attributes, defaults and required ones marked.
func TestNodesList(t *testing.T) {
	noPlugins(t)
	code, stdout, stderr := dflow(t, "nodes")
	if code != exitOK || stderr != "" {
		t.Fatalf("nodes: code %d\n%s", code, stderr)
	}
	for _, name := range nodes.Default.KindNames() {
		k, _ := nodes.Default.Kind(name)
		if !strings.Contains(stdout, "node "+name+"\n  "+k.Doc[:20]) {
			t.Errorf("no %q with its doc in\n%s", name, stdout)
		}
		for _, f := range k.Config {
			if !strings.Contains(stdout, "  config "+f.Name+" "+f.Type.String()) {
				t.Errorf("%s: no config %s", name, f.Name)
			}
		}
	}
	for _, want := range []string{
		"  out out blob: the generated items\n",
		"  config count int (required): items to emit in all",
		`  config service_time string = "0s": time per item`,
		"  config speed list(number): one factor per replica",
		"  in  in any: items of any type\n  out out (the type of in): the same items, unchanged\n",
		"  config sync bool = false: replicas step together",
		"  in  in tokens: token batches\n  out hidden hidden_states: *items.HiddenStates\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("want %q in\n%s", want, stdout)
		}
	}
}

// TestNodesKind: one kind by name; a misspelt one exits 1 with the
// closest name; calling it wrong exits 2.
func TestNodesKind(t *testing.T) {
	noPlugins(t)
	code, stdout, _ := dflow(t, "nodes", "sink")
	want := "node sink\n  Consumes and drops every item.\n  in  in any: items of any type\n" +
		"  config service_time string = \"0s\": time per item: a Go duration or a distribution such as \"lognormal(40ms, 0.2)\"\n" +
		"  config speed list(number): one factor per replica: replica i takes service_time / speed[i % len(speed)]\n" +
		"  config seed int = 1: seed of the service-time draws; replica i uses seed+i\n" +
		"  config change_after int = 0: the stage's items (over its replicas in one process: on a cluster, each worker counts its own) after which each takes changed_service_time; 0: no change by count\n" +
		"  config change_at string = \"\": the time after the stage's start (\"30s\") from which each item takes changed_service_time; \"\": no change by time\n" +
		"  config changed_service_time string = \"\": service_time from the change (change_after or change_at) on; speed applies to it too\n"
	if code != exitOK || stdout != want {
		t.Errorf("nodes sink: code %d\n%s\nwant\n%s", code, stdout, want)
	}
	code, stdout, stderr := dflow(t, "nodes", "synthetic_wrok")
	if code != exitFailed || stdout != "" || !strings.Contains(stderr, `no node kind "synthetic_wrok"; did you mean "synthetic_work"?`) {
		t.Errorf("misspelt kind: code %d\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := dflow(t, "nodes", "nosuch/kind"); code != exitFailed || !strings.Contains(stderr, `no node kind "nosuch/kind"; 'dflow nodes' lists them all`) {
		t.Errorf("kind of a missing plugin: code %d\n%s", code, stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"nodes", "sink", "synthetic_work"}, "takes at most one KIND"},
		{[]string{"nodes", "--json", "--markdown"}, "choose one"},
		{[]string{"nodes", "sink", "--markdown"}, "leave out sink"},
		{[]string{"nodes", "--bogus"}, "bogus"},
	} {
		if code, _, stderr := dflow(t, c.args...); code != exitUsage || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "dflow nodes --help") {
			t.Errorf("%v: code %d, want 2 and %q:\n%s", c.args, code, c.want, stderr)
		}
	}
	code, stdout, _ = dflow(t, "help", "nodes")
	for _, w := range []string{"Usage: dflow nodes [KIND]", "closest name", "--json\n", "--markdown\n"} {
		if code != exitOK || !strings.Contains(stdout, w) {
			t.Errorf("help nodes: code %d, want %q in\n%s", code, w, stdout)
		}
	}
	if _, stdout, _ := dflow(t, "--help"); !strings.Contains(stdout, "dflow nodes") {
		t.Errorf("usage does not list nodes:\n%s", stdout)
	}
}

// TestNodesJSON: --json carries the same description for programs: a
// list, or one object for KIND.
func TestNodesJSON(t *testing.T) {
	noPlugins(t)
	code, stdout, _ := dflow(t, "nodes", "--json")
	var all []kindDoc
	if err := json.Unmarshal([]byte(stdout), &all); code != exitOK || err != nil || len(all) != len(nodes.Default.KindNames()) {
		t.Fatalf("nodes --json: code %d, %v, %d kinds\n%s", code, err, len(all), stdout)
	}
	code, stdout, _ = dflow(t, "nodes", "synthetic_source", "--json")
	var src map[string]any
	if err := json.Unmarshal([]byte(stdout), &src); code != exitOK || err != nil {
		t.Fatalf("nodes KIND --json: code %d, %v\n%s", code, err, stdout)
	}
	for _, want := range []string{
		`"name": "synthetic_source"`,
		`"direction": "out"`,
		"\"name\": \"count\",\n      \"type\": \"int\",\n      \"required\": true,",
		"\"name\": \"type\",\n      \"type\": \"string\",\n      \"required\": false,\n      \"default\": \"blob\",",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("want %q in\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, `"plugin"`) {
		t.Errorf("a built-in kind names a plugin:\n%s", stdout)
	}
}

// TestNodesPluginKinds: the kinds of the plugins found are listed too,
// `dflow nodes PLUGIN/KIND` starts that plugin, and `dflow plugins`
// prints each kind exactly as `dflow nodes` does (one renderer).
func TestNodesPluginKinds(t *testing.T) {
	bin, err := buildChecksum()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(bin)
	t.Setenv("DFLOW_PLUGIN_DIR", dir)
	code, stdout, stderr := dflow(t, "nodes")
	if code != exitOK || !strings.Contains(stdout, "node checksum/crc\n  from plugin checksum ("+bin+")\n") || !strings.Contains(stdout, "node synthetic_source\n") {
		t.Fatalf("nodes with a plugin: code %d\n%s%s", code, stdout, stderr)
	}
	code, one, stderr := dflow(t, "nodes", "checksum/crc")
	if code != exitOK || !strings.Contains(one, "  config crash_after int = 0") {
		t.Fatalf("nodes checksum/crc: code %d\n%s%s", code, one, stderr)
	}
	if !strings.Contains(stdout, one) {
		t.Errorf("nodes and nodes KIND differ: %q not in\n%s", one, stdout)
	}
	if code, _, stderr := dflow(t, "nodes", "crc"); code != exitFailed || !strings.Contains(stderr, `did you mean "checksum/crc"?`) {
		t.Errorf("nodes crc: code %d\n%s", code, stderr)
	}
	code, plugins, stderr := dflow(t, "plugins", dir)
	if code != exitOK {
		t.Fatalf("plugins: code %d\n%s", code, stderr)
	}
	// The same lines, indented under the plugin's heading, without the
	// "from plugin" line the heading makes redundant.
	var indented strings.Builder
	for _, l := range strings.SplitAfter(one, "\n") {
		if l != "" && !strings.HasPrefix(l, "  from plugin ") {
			indented.WriteString("  " + l)
		}
	}
	if want := "plugin checksum (" + bin + ")\n" + indented.String(); !strings.HasPrefix(plugins, want) {
		t.Errorf("dflow plugins prints\n%s\nwant, as dflow nodes does,\n%s", plugins, want)
	}
	code, stdout, _ = dflow(t, "nodes", "checksum/crc", "--json")
	if code != exitOK || !strings.Contains(stdout, `"plugin": "checksum"`) {
		t.Errorf("nodes checksum/crc --json: code %d\n%s", code, stdout)
	}
}

// TestNodesBrokenPlugin: a plugin that does not start is reported and
// makes the exit code 1, but the other kinds are still listed.
func TestNodesBrokenPlugin(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dflow-plugin-broken"), []byte("#!/bin/sh\necho no >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DFLOW_PLUGIN_DIR", dir)
	code, stdout, stderr := dflow(t, "nodes")
	if code != exitFailed || !strings.Contains(stdout, "node synthetic_source\n") || !strings.Contains(stderr, "dflow nodes: ") || !strings.Contains(stderr, "broken") {
		t.Errorf("nodes with a broken plugin: code %d\n%s%s", code, stdout, stderr)
	}
	if code, stdout, _ := dflow(t, "nodes", "sink"); code != exitOK || !strings.HasPrefix(stdout, "node sink\n") {
		t.Errorf("a built-in kind needs no plugin: code %d\n%s", code, stdout)
	}
}
