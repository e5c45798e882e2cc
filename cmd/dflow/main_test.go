package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/nodes"
)

// dflow runs the CLI in-process and returns its exit code and streams.
func dflow(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, registry: nodes.Default.Clone()}
	code := e.main(args)
	return code, out.String(), errb.String()
}

func TestUsage(t *testing.T) {
	t.Parallel()
	if code, _, stderr := dflow(t); code != exitUsage || !strings.Contains(stderr, "dflow validate") {
		t.Errorf("no args: code %d, %q", code, stderr)
	}
	if code, stdout, _ := dflow(t, "--help"); code != 0 || !strings.Contains(stdout, "Exit codes") {
		t.Errorf("--help: code %d", code)
	}
	if code, _, stderr := dflow(t, "frobnicate"); code != exitUsage || !strings.Contains(stderr, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: code %d, %q", code, stderr)
	}
	if code, _, stderr := dflow(t, "validate", "--bogus"); code != exitUsage || !strings.Contains(stderr, "bogus") {
		t.Errorf("bad flag: code %d, %q", code, stderr)
	}
	if code, _, _ := dflow(t, "validate"); code != exitUsage {
		t.Errorf("validate without spec: code %d", code)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := dflow(t, "validate", "../../specs/seed.hcl", "../../specs/fan.hcl")
	if code != 0 || !strings.Contains(stdout, "2 of 2 specs valid") || stderr != "" {
		t.Errorf("valid specs: code %d, %q, %q", code, stdout, stderr)
	}
	bad := "../../graph/testdata/validate/unknown_stage.hcl"
	code, _, stderr = dflow(t, "validate", bad)
	if code != exitFailed || !strings.Contains(stderr, `unknown_stage.hcl:22:10: error: unknown stage`) ||
		!strings.Contains(stderr, `did you mean "target"?`) {
		t.Errorf("invalid spec: code %d\n%s", code, stderr)
	}
	// Flags after the spec, as the README writes them.
	code, stdout, _ = dflow(t, "validate", bad, "--json")
	var rep struct {
		Valid      bool
		ErrorCount int `json:"error_count"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || rep.Valid || rep.ErrorCount != 1 || code != exitFailed {
		t.Errorf("--json: code %d err %v %+v\n%s", code, err, rep, stdout)
	}
	// validate finds a --set that does not fit one of the spec's
	// problems, exit 1 (the commands that run it say usage, 2).
	code, _, stderr = dflow(t, "validate", "../../specs/seed.hcl", "--set", "edge.hs.policy=fair")
	if code != exitFailed || !strings.Contains(stderr, `--set edge.hs.policy=fair`) {
		t.Errorf("bad --set: code %d %s", code, stderr)
	}
	code, _, stderr = dflow(t, "validate", bad, "--set", "edge.nope.policy=shared")
	if code != exitFailed || !strings.Contains(stderr, `unknown stage`) || !strings.Contains(stderr, `--set edge.nope.policy=shared`) {
		t.Errorf("an invalid spec and a bad --set: code %d, want %d\n%s", code, exitFailed, stderr)
	}
	code, _, stderr = dflow(t, "validate", "no/such.hcl")
	if code != exitFailed || !strings.Contains(stderr, "no such file") {
		t.Errorf("missing file: code %d %s", code, stderr)
	}
}

func TestGraph(t *testing.T) {
	t.Parallel()
	for format, want := range map[string]string{
		"text":    "queue 2: target [2] -> drafter [2]",
		"dot":     `"target" -> "drafter" [label="hs: tokens, round_robin, cap 8, 2-2-1`,
		"mermaid": `s1 -->|"hs: tokens, round_robin, cap 8, 2-2-1"| s2`,
	} {
		code, stdout, stderr := dflow(t, "graph", "../../specs/seed.hcl", "--format", format)
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("%s: code %d, want %q in\n%s%s", format, code, want, stdout, stderr)
		}
	}
	code, stdout, _ := dflow(t, "graph", "--set", "edge.hs.policy=shared", "../../specs/seed.hcl")
	if code != 0 || !strings.Contains(stdout, "queue 0: target [0 1 2 3 4] -> drafter [0 1 2]") {
		t.Errorf("--set in graph: %s", stdout)
	}
	if code, _, _ := dflow(t, "graph", "../../specs/seed.hcl", "--format", "svg"); code != exitUsage {
		t.Errorf("bad format: code %d", code)
	}
}

// TestGraphWorkers: --workers says where a run on N workers puts each
// replica and how it carries each edge: a chain of restartable stages
// sits on one worker, its edges in process; pinned apart, they cross
// hosts.
func TestGraphWorkers(t *testing.T) {
	t.Parallel()
	spec := filepath.Join(t.TempDir(), "chain.hcl")
	os.WriteFile(spec, []byte(`stage "src" {
  node = "synthetic_source"
  config {
    count = 10
  }
}
stage "w" {
  node = "synthetic_work"
}
stage "dst" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = w.in
}
edge "b" {
  from = w.out
  to   = dst.in
}
`), 0o644)
	code, stdout, stderr := dflow(t, "graph", spec, "--workers", "2")
	if code != 0 || !regexp.MustCompile(`(?m)^  w +local1$`).MatchString(stdout) ||
		!regexp.MustCompile(`(?m)^  edge a +a chain's: in process`).MatchString(stdout) {
		t.Errorf("--workers 2: code %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = dflow(t, "graph", spec, "--workers", "2", "--place", "src=local1", "--place", "w=local2")
	if code != 0 || !regexp.MustCompile(`(?m)^  edge a +crosses hosts`).MatchString(stdout) ||
		!regexp.MustCompile(`(?m)^  dst +local2$`).MatchString(stdout) {
		t.Errorf("pinned apart: code %d\n%s%s", code, stdout, stderr)
	}
	for _, args := range [][]string{
		{"--workers", "2", "--place", "nope=local1"},
		{"--place", "w=local1"},
		{"--workers", "2", "--format", "dot"},
	} {
		if code, _, stderr := dflow(t, append([]string{"graph", spec}, args...)...); code != exitUsage {
			t.Errorf("%v: code %d, want %d\n%s", args, code, exitUsage, stderr)
		}
	}
}

func TestFmt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	messy := filepath.Join(dir, "messy.hcl")
	os.WriteFile(messy, []byte("stage \"a\" {\nnode=\"sink\"\n    replicas   = 2\n}\n"), 0o644)
	if code, stdout, _ := dflow(t, "fmt", "--check", messy); code != exitFailed || !strings.Contains(stdout, "messy.hcl") {
		t.Errorf("--check on messy file: code %d %q", code, stdout)
	}
	if code, _, _ := dflow(t, "fmt", messy); code != 0 {
		t.Errorf("fmt: code %d", code)
	}
	got, _ := os.ReadFile(messy)
	if want := "stage \"a\" {\n  node     = \"sink\"\n  replicas = 2\n}\n"; string(got) != want {
		t.Errorf("formatted:\n%s\nwant:\n%s", got, want)
	}
	if code, _, _ := dflow(t, "fmt", "--check", messy); code != 0 {
		t.Errorf("--check after fmt: code %d", code)
	}
	broken := filepath.Join(dir, "broken.hcl")
	os.WriteFile(broken, []byte("stage \"a\" {\n"), 0o644)
	if code, _, stderr := dflow(t, "fmt", broken); code != exitFailed || !strings.Contains(stderr, "broken.hcl:") {
		t.Errorf("broken file: code %d %q", code, stderr)
	}
	if b, _ := os.ReadFile(broken); string(b) != "stage \"a\" {\n" {
		t.Error("fmt changed a file with syntax errors")
	}
	// JSON syntax is not formatted: a usage error, before any file is
	// touched.
	if code, _, stderr := dflow(t, "fmt", messy, "../../graph/testdata/seed.hcl.json"); code != exitUsage || !strings.Contains(stderr, "not JSON") {
		t.Errorf("fmt of a JSON spec: code %d %q", code, stderr)
	}
	// Shipped specs are formatted.
	specs, _ := filepath.Glob("../../specs/*.hcl")
	args := append([]string{"fmt", "--check"}, specs...)
	if code, stdout, _ := dflow(t, args...); code != 0 {
		t.Errorf("specs not formatted: %s", stdout)
	}
}
