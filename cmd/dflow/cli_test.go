package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// oneEdge is the smallest pipeline: a source into a sink.
const oneEdge = `
stage "src" {
  node = "synthetic_source"
  config {
    count = 20
  }
}
stage "out" {
  node = "sink"
}
edge "e" {
  from = src.out
  to   = out.in
}
`

func writeSpec(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "spec.hcl")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOutputsCheckedFirst: what run, sim, compare and plot will write at
// the end is checked before any work: an unwritable path, the spec
// itself, one file for both, a plot name that is not an image, --plot
// without a series. None of them gets as far as "dflow: running".
func TestOutputsCheckedFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spec := writeSpec(t, oneEdge)
	before, _ := os.ReadFile(spec)
	missing := filepath.Join(dir, "no", "such", "dir")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", spec, "--report", filepath.Join(missing, "r.json")}, exitFailed, "--report: cannot create"},
		{[]string{"run", spec, "--interval", "10ms", "--plot", filepath.Join(missing, "p.png")}, exitFailed, "--plot: cannot create"},
		{[]string{"run", spec, "--report", dir}, exitFailed, "is a directory"},
		{[]string{"run", spec, "--report", spec}, exitUsage, "names the input " + spec + " itself"},
		{[]string{"run", spec, "--interval", "10ms", "--plot", spec}, exitUsage, "must end in .png, .jpg or .jpeg"},
		{[]string{"run", spec, "--plot", filepath.Join(dir, "p.png"), "--interval", "0"}, exitUsage, "--interval 0 turns it off"},
		{[]string{"run", spec, "--interval", "10ms", "--plot", filepath.Join(dir, "p.gif")}, exitUsage, "must end in .png, .jpg or .jpeg"},
		{[]string{"run", spec, "--interval", "10ms", "--plot", filepath.Join(dir, "x.png"), "--report", filepath.Join(dir, "x.png")}, exitUsage, "name the same file"},
		{[]string{"sim", spec, "--report", filepath.Join(missing, "r.json")}, exitFailed, "--report: cannot create"},
		{[]string{"sim", spec, "--report", spec}, exitUsage, "itself"},
		{[]string{"compare", spec, "--edge", "e", "--sim", "--plot", filepath.Join(missing, "c.png")}, exitFailed, "--plot: cannot create"},
		{[]string{"plot", filepath.Join(dir, "r.json"), "-o", filepath.Join(dir, "r.svg")}, exitUsage, "-o: plot"},
	} {
		code, stdout, stderr := dflow(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) || strings.Contains(stderr, "dflow: running") || stdout != "" {
			t.Errorf("%v: code %d, want %d and %q before any work:\n%s", c.args, code, c.code, c.want, stderr)
		}
	}
	if after, _ := os.ReadFile(spec); !bytes.Equal(before, after) {
		t.Errorf("the spec was overwritten:\n%s", after)
	}
	// The checks leave no file behind, and a good path still works.
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("checks left files: %v", entries)
	}
	rj := filepath.Join(dir, "r.json")
	if code, _, stderr := dflow(t, "run", spec, "--report", rj); code != exitOK || len(readReport(t, rj).Stages) != 2 {
		t.Errorf("good --report: code %d\n%s", code, stderr)
	}
}

// TestPlotFormats: --plot and plot -o write the image format their name
// says, PNG or JPEG.
func TestPlotFormats(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rj := filepath.Join(dir, "r.json")
	jpg := filepath.Join(dir, "run.jpg")
	if code, _, stderr := dflow(t, "run", writeSpec(t, oneEdge), "--interval", "5ms", "--report", rj, "--plot", jpg); code != exitOK {
		t.Fatalf("code %d\n%s", code, stderr)
	}
	for path, magic := range map[string]string{jpg: "\xff\xd8\xff", filepath.Join(dir, "again.jpeg"): "\xff\xd8\xff", filepath.Join(dir, "again.png"): "\x89PNG"} {
		if path != jpg {
			if code, _, stderr := dflow(t, "plot", rj, "-o", path); code != exitOK {
				t.Fatalf("plot -o %s: code %d\n%s", path, code, stderr)
			}
		}
		if b, _ := os.ReadFile(path); !bytes.HasPrefix(b, []byte(magic)) {
			t.Errorf("%s starts % x, want % x", path, b[:min(len(b), 4)], magic)
		}
	}
}

// TestUsageErrors: every mistake in how a command is called exits 2 and
// says what was wrong, in terms of the command line.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	spec := writeSpec(t, oneEdge)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", spec, "--interval", "-1s"}, "must not be negative"},
		{[]string{"run", spec, "--interval", "100us"}, "at least 1ms"},
		{[]string{"sim", spec, "--interval", "-5s"}, "must not be negative"},
		{[]string{"sim", spec, "--interval", "1ns"}, "at least 1ms"},
		{[]string{"run", spec, "--var", "novalue"}, "want NAME=VALUE"},
		{[]string{"graph", spec, "--var", "=3"}, "want NAME=VALUE"},
		{[]string{"validate", spec, "--set", "edge.e.policy"}, "want edge.NAME.ATTR=VALUE"},
		{[]string{"sim", spec, "--set", "pipeline.x.y=1"}, "want edge.NAME.ATTR=VALUE"},
		{[]string{"compare", spec, "--edge", "nope", "--sim"}, `--edge "nope": ` + spec + ` has no edge of that name; its edges are e`},
		// a name or value the spec does not take, in the --set or --var
		// of a command that runs or draws it, is as wrong as compare's
		// --edge above (validate counts it among the spec's problems, 1)
		{[]string{"run", spec, "--set", "edge.missing.policy=shared"}, `--set edge.missing.policy=shared: no edge "missing"`},
		{[]string{"sim", spec, "--set", "edge.e.policy=fair"}, `policy "fair" is not known`},
		{[]string{"compare", spec, "--edge", "e", "--sim", "--set", "stage.nope.replicas=2"}, `no stage "nope"`},
		{[]string{"graph", spec, "--var", "nope=3"}, `declares no variable "nope"`},
		{[]string{"run", spec, "--set", "stage.out.replicas=0"}, `--set stage.out.replicas=0`},
		{[]string{"compare", spec, "--edge", "e", "--sim", "--policies", "round_robin,fair"}, `--policies: "fair" is not a policy; the policies are round_robin, shared`},
		// a cluster of no workers would run in this process, in silence
		{[]string{"run", spec, "--local-cluster", "0"}, "--local-cluster 0: wants a number of worker processes to start, at least 1"},
		{[]string{"run", spec, "--local-cluster", "-2"}, "at least 1"},
		// a web server's URL for a NATS server's
		{[]string{"run", spec, "--cluster", "http://10.0.0.5:4222"}, `--cluster "http://10.0.0.5:4222": http:// is not the scheme of a NATS server; write nats://10.0.0.5:4222`},
		{[]string{"run", spec, "--cluster", "nats://a:4222,https://b:4222"}, `https:// is not the scheme of a NATS server; write tls://b:4222`},
		{[]string{"worker", "--join", "http://10.0.0.5:4222"}, `--join "http://10.0.0.5:4222": http:// is not the scheme of a NATS server; write nats://10.0.0.5:4222`},
	} {
		code, stdout, stderr := dflow(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: code %d, want 2 and %q:\n%s", c.args, code, c.want, stderr)
		}
		if strings.Contains(stderr, "--set edge.nope") || strings.Contains(stdout, "items/s") {
			t.Errorf("%v: an internal override or a result shows:\n%s%s", c.args, stdout, stderr)
		}
	}
}

// TestVersion: --version prints the version; -ldflags -X main.version
// sets it; the report records it.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"--version", "-version", "version"} {
		if code, stdout, _ := dflow(t, arg); code != exitOK || !strings.HasPrefix(stdout, "dflow ") || len(stdout) < len("dflow x\n") {
			t.Errorf("%s: code %d, %q", arg, code, stdout)
		}
	}
	defer func(v string) { version = v }(version)
	version = "v9.8.7"
	if _, stdout, _ := dflow(t, "--version"); stdout != "dflow v9.8.7\n" {
		t.Errorf("with -X main.version: %q", stdout)
	}
}

// TestHelpInWords: a command's --help says what it does and what each
// flag is for, with placeholders and defaults, on stdout.
func TestHelpInWords(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"run", "--help"}, {"help", "run"}, {"run", "-h"}} {
		code, stdout, _ := dflow(t, args...)
		for _, want := range []string{
			"Usage: dflow run SPEC [flags]",
			"The first Ctrl-C drains",
			"--interval DURATION\n      print a status line",
			"(default 5s)",
			"--set PATH=VALUE",
			"--plot FILE\n",
		} {
			if code != exitOK || !strings.Contains(stdout, want) {
				t.Errorf("%v: code %d, want %q in\n%s", args, code, want, stdout)
			}
		}
		if strings.Contains(stdout, " value\n") || strings.Contains(stdout, " string\n") {
			t.Errorf("%v: a placeholder names a Go type, not what to write:\n%s", args, stdout)
		}
		// One default a flag: a usage that says it in words (--lease's
		// "the spec's pipeline lease, else 5s") gets no "(default 0s)".
		for _, f := range strings.Split(stdout, "\n  -")[1:] {
			if strings.Count(f, "(default") > 1 {
				t.Errorf("%v: two defaults in -%s", args, f)
			}
		}
		if words := strings.Join(strings.Fields(stdout), " "); !strings.Contains(words, "(default: the spec's pipeline lease, else 5s) --local-cluster") {
			t.Errorf("%v: --lease's default, in words and alone, is missing:\n%s", args, stdout)
		}
	}
	if code, stdout, _ := dflow(t, "validate", "--help"); code != exitOK || !strings.Contains(stdout, "--json\n      print the diagnostics as JSON") {
		t.Errorf("validate --help: code %d\n%s", code, stdout)
	}
}

// TestRunSays: the start line counts in words ("1 edge"), the report
// records the version, the start time and the overrides.
func TestRunSays(t *testing.T) {
	t.Parallel()
	spec := writeSpec(t, "variable \"n\" {\n  default = 20\n}\n"+strings.Replace(oneEdge, "count = 20", "count = var.n", 1))
	rj := filepath.Join(t.TempDir(), "r.json")
	start := time.Now()
	code, _, stderr := dflow(t, "run", spec, "--var", "n=7", "--set", "edge.e.capacity=3", "--report", rj)
	if code != exitOK || !strings.Contains(stderr, ": 2 stages, 2 replicas, 1 edge\n") {
		t.Fatalf("code %d\n%s", code, stderr)
	}
	rep := readReport(t, rj)
	if rep.Version == "" || rep.Started.Before(start.Add(-time.Second)) || rep.Started.After(time.Now()) {
		t.Errorf("version %q, started %v (the test started %v)", rep.Version, rep.Started, start)
	}
	if rep.Overrides.Vars["n"] != "7" || len(rep.Overrides.Sets) != 1 || rep.Overrides.Sets[0] != "edge.e.capacity=3" {
		t.Errorf("overrides %+v", rep.Overrides)
	}
	if got := rep.Stages["out"].Replicas[0].ItemsIn; got != 7 {
		t.Errorf("the override did not apply: %d items", got)
	}
	rj2 := filepath.Join(t.TempDir(), "s.json")
	if code, _, stderr := dflow(t, "sim", spec, "--set", "edge.e.policy=round_robin", "--report", rj2); code != exitOK {
		t.Fatalf("sim: code %d\n%s", code, stderr)
	}
	if rep := readReport(t, rj2); rep.Version == "" || rep.Started.IsZero() || len(rep.Overrides.Sets) != 1 {
		t.Errorf("sim report: version %q started %v overrides %+v", rep.Version, rep.Started, rep.Overrides)
	}
}

// TestValidateCounts: validate says how many of the specs are valid.
func TestValidateCounts(t *testing.T) {
	t.Parallel()
	good := writeSpec(t, oneEdge)
	code, stdout, _ := dflow(t, "validate", good, "../../graph/testdata/validate/cycle.hcl", "../../specs/seed.hcl")
	if code != exitFailed || stdout != "2 of 3 specs valid\n" {
		t.Errorf("code %d, stdout %q", code, stdout)
	}
	if code, stdout, _ := dflow(t, "validate", good); code != exitOK || stdout != "1 of 1 spec valid\n" {
		t.Errorf("code %d, stdout %q", code, stdout)
	}
}

// TestMissingCorpus: a corpus that is not there fails validate, at the
// attribute, as a missing model does; the main job's spec is valid.
func TestMissingCorpus(t *testing.T) {
	t.Chdir("../..") // the spec names the model relative to the repository
	code, _, stderr := dflow(t, "validate", "specs/dflash.hcl", "--var", "corpus=/no/such/corpus")
	for _, want := range []string{
		`stage "reader" (text_reader): path: "/no/such/corpus" matches no file or folder`,
		`stage "drafter" (drafter_train): eval: "/no/such/corpus" matches no file or folder`,
		"dflash.hcl:30:", // path = var.corpus
	} {
		if code != exitFailed || !strings.Contains(stderr, want) {
			t.Errorf("code %d, want %q in\n%s", code, want, stderr)
		}
	}
	if code, _, stderr := dflow(t, "validate", "specs/dflash.hcl"); code != exitOK {
		t.Errorf("main job: code %d\n%s", code, stderr)
	}
}

// TestMainJobMeasuresAcceptance: the main job measures the acceptance
// length during the run, so that the status line's acceptance_length is
// the latest, not the one measured at the start shown for the whole run.
func TestMainJobMeasuresAcceptance(t *testing.T) {
	t.Chdir("../..")
	l := &graph.Loader{Catalog: nodes.Default.Clone()}
	g, diags := l.LoadFile("specs/dflash.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	cfg := g.Stage("drafter").Config
	batches := g.Stage("reader").Config.Int("limit")
	steps := batches / g.Stage("drafter").Replicas
	if every := cfg.Int("eval_every"); every <= 0 || steps/every < 4 {
		t.Errorf("eval_every = %d over %d steps: acceptance_length is measured at the start and the end only", every, steps)
	}
}

// TestFmtNotText: fmt of a binary is one error, as validate's, and leaves
// the file alone.
func TestFmtNotText(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bin.hcl")
	junk := []byte("stage \"a\" {\n\x00\x01\x02{{{\xff\n}}}}\n")
	os.WriteFile(path, junk, 0o644)
	code, _, stderr := dflow(t, "fmt", path)
	if code != exitFailed || strings.Count(stderr, "error:") != 1 || !strings.Contains(stderr, "not UTF-8 text: a NUL byte at line 2, column 1") {
		t.Errorf("code %d:\n%s", code, stderr)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, junk) {
		t.Error("fmt changed the file")
	}
}

// TestKeyHashWithoutKeys: a key_hash edge fed by a source whose items
// carry no key (synthetic_source, keys = 0) is an error of validate at the
// edge's policy, with the line where the spec sets keys; run refuses the
// spec before it starts, instead of failing at the first item.
func TestKeyHashWithoutKeys(t *testing.T) {
	t.Parallel()
	spec := "../../graph/testdata/validate/key_hash_no_keys.hcl"
	code, stdout, stderr := dflow(t, "validate", spec)
	if code != exitFailed || !strings.Contains(stdout, "0 of 1 spec valid") ||
		!strings.Contains(stderr, "key_hash_no_keys.hcl:35:12: error: key_hash edge without keys") ||
		!strings.Contains(stderr, `but events.out (synthetic_source) emits items without keys: keys = 0`) ||
		!strings.Contains(stderr, `Stage "events" sets keys at ../../graph/testdata/validate/key_hash_no_keys.hcl:8.`) ||
		!strings.Contains(stderr, "key_hash_no_keys.hcl:41:12: error: key_hash edge without keys") {
		t.Errorf("validate: code %d\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := dflow(t, "run", spec); code != exitFailed || strings.Contains(stderr, "dflow: running") || !strings.Contains(stderr, "key_hash edge without keys") {
		t.Errorf("run: code %d\n%s", code, stderr)
	}
	// keys given: valid
	if code, _, stderr := dflow(t, "validate", spec, "--set", "stage.events.config.keys=4", "--set", "stage.unset.config.keys=4"); code != exitOK {
		t.Errorf("with keys: code %d\n%s", code, stderr)
	}
}
