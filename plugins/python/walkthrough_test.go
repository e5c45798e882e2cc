package python

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// step is one block of the walkthrough, in the doc's order: a file to
// write, commands to run, or output they print.
type step struct {
	what string // "file NAME", "run" or "output"
	text string
}

// walkthrough returns the steps of docs/plugins.md's section title: each
// code block right after a line `<!-- walkthrough: WHAT -->`, its
// indentation (a list item's) taken off.
func walkthrough(t *testing.T, doc []byte, title string) []step {
	t.Helper()
	_, section, ok := strings.Cut(string(doc), "\n"+title+"\n")
	if !ok {
		t.Fatalf("docs/plugins.md has no section %q", title)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	lines := strings.Split(section, "\n")
	var steps []step
	for i := 0; i < len(lines); i++ {
		what, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "<!-- walkthrough: ")
		if !ok {
			continue
		}
		what = strings.TrimSuffix(what, " -->")
		if i+1 >= len(lines) || !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "```") {
			t.Fatalf("docs/plugins.md: no code block right after %q", lines[i])
		}
		indent := lines[i+1][:len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " "))]
		var body []string
		for i += 2; ; i++ {
			if i >= len(lines) {
				t.Fatalf("docs/plugins.md: the code block of %q does not end", what)
			}
			if strings.TrimSpace(lines[i]) == "```" {
				break
			}
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		steps = append(steps, step{what, strings.Join(body, "\n") + "\n"})
	}
	return steps
}

// busy is the one part of a summary line that changes from run to run.
var busy = regexp.MustCompile(`busy=\[[^\]]*\]`)

func normalize(s string) string {
	var out []string
	for _, l := range strings.Split(busy.ReplaceAllString(s, "busy=[...]"), "\n") {
		out = append(out, strings.TrimRight(l, " "))
	}
	return strings.Join(out, "\n")
}

// TestWalkthrough follows docs/plugins.md's "Writing a plugin in Python"
// as a new user would, in one shell: from an empty folder, with dflow's
// clone at ~/dflow (HOME is a folder whose dflow is this clone), the
// python3 first on PATH whatever it is (pyenv's, without grpcio, on the
// development machine), it writes the doc's files and runs its commands
// as they are written there, and checks that what they print is what the
// doc shows (issue 28: from an empty folder, "No module named
// 'dflowplugin'", and nothing said where the module is).
func TestWalkthrough(t *testing.T) {
	needModules(t, "grpc", "google.protobuf", "numpy")
	if testing.Short() {
		t.Skip("builds dflow")
	}
	doc, err := os.ReadFile("../../docs/plugins.md")
	if err != nil {
		t.Fatal(err)
	}
	steps := walkthrough(t, doc, "## Writing a plugin in Python")
	clone, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	if err := os.Symlink(clone, filepath.Join(home, "dflow")); err != nil {
		t.Fatal(err)
	}
	// The commands, and the files written as a shell would, in order.
	var script strings.Builder
	script.WriteString("set -ex\n")
	var outputs []string
	files := 0
	for _, s := range steps {
		switch name, ok := strings.CutPrefix(s.what, "file "); {
		case ok:
			files++
			fmt.Fprintf(&script, "cat > '%s' << 'DFLOW_WALKTHROUGH_EOF'\n%sDFLOW_WALKTHROUGH_EOF\n", name, s.text)
		case s.what == "run":
			script.WriteString(s.text)
		case s.what == "output":
			outputs = append(outputs, normalize(s.text))
		default:
			t.Fatalf("docs/plugins.md: walkthrough step %q is not a file, run or output", s.what)
		}
	}
	if files < 2 || len(outputs) < 2 || !strings.Contains(script.String(), "./dflow run upper.hcl") {
		t.Fatalf("the walkthrough is not what this test expects (%d files, %d outputs):\n%s", files, len(outputs), script.String())
	}
	sh := filepath.Join(t.TempDir(), "walkthrough.sh")
	if err := os.WriteFile(sh, []byte(script.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	// The user's environment with HOME elsewhere: Go's caches and
	// settings stay where they are, so that building dflow is not a build
	// from nothing.
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "HOME" && k != "DFLOW_PLUGIN_DIR" {
			env = append(env, kv)
		}
	}
	vars := []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOENV"}
	goenv, err := exec.Command("go", append([]string{"env"}, vars...)...).Output()
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range strings.SplitN(string(goenv), "\n", len(vars)) {
		env = append(env, vars[i]+"="+strings.TrimSpace(v))
	}
	env = append(env, "HOME="+home)

	dir := t.TempDir() // the empty folder
	cmd := exec.Command("sh", sh)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	if err != nil {
		t.Fatalf("the walkthrough failed: %v", err)
	}
	got := []string{normalize(stdout.String()), normalize(stderr.String())}
	for _, want := range outputs {
		if !strings.Contains(got[0], want) && !strings.Contains(got[1], want) {
			t.Errorf("the walkthrough printed no\n%s", want)
		}
	}
	if strings.Contains(stderr.String(), "dflow-python:") {
		t.Errorf("the launcher complained")
	}
}
