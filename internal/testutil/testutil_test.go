package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	t.Parallel()
	n := 0
	if !Within(10*time.Second, func() bool { n++; return n == 5 }) || n != 5 {
		t.Errorf("Within stopped after %d calls, want 5", n)
	}
	n = 0
	if Within(30*time.Millisecond, func() bool { n++; return false }) {
		t.Error("Within held for a condition that never does")
	}
	if n < 2 {
		t.Errorf("Within called the condition %d times in 30ms", n)
	}
}

// fakeT records Fatalf instead of stopping the test.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper()                        {}
func (f *fakeT) Fatalf(format string, a ...any) { f.msg = fmt.Sprintf(format, a...) }

func TestEventuallyMessage(t *testing.T) {
	t.Parallel()
	f := &fakeT{}
	Eventually(f, 10*time.Millisecond, func() bool { return false }, "the %s to end", "run")
	if want := "timed out after 10ms waiting for the run to end"; !strings.Contains(f.msg, want) {
		t.Errorf("message %q, want %q", f.msg, want)
	}
	f.msg = ""
	Eventually(f, time.Second, func() bool { return true }, "nothing")
	if f.msg != "" {
		t.Errorf("a condition that held failed: %q", f.msg)
	}
}

// TestBuilt: a program built by Built runs, is built without the race
// detector whatever the test's build, is the same file when asked again
// (the build cache's, not linked anew), and a program that does not
// compile is an error that says why.
func TestBuilt(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the go command")
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":      "module example.com/hello\n\ngo 1.22\n",
		"main.go":     "package main\n\nimport (\n\t\"fmt\"\n\t\"runtime/debug\"\n)\n\nfunc main() {\n\tb, _ := debug.ReadBuildInfo()\n\tfor _, s := range b.Settings {\n\t\tif s.Key == \"-race\" {\n\t\t\tfmt.Print(\"race \")\n\t\t}\n\t}\n\tfmt.Print(\"hello\")\n}\n",
		"bad/go.mod":  "module example.com/bad\n\ngo 1.22\n",
		"bad/main.go": "package main\n\nfunc main() { undefined() }\n",
	}
	for name, text := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"GOWORK=off", "GOFLAGS=-mod=mod"}
	bin, err := Built(dir, ".", env)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin).Output(); err != nil || string(out) != "hello" {
		t.Errorf("%s: %q %v, want hello (and no -race)", bin, out, err)
	}
	if again, err := Built(dir, ".", env); err != nil || again != bin {
		t.Errorf("asked again: %s %v, want the same file %s", again, err, bin)
	}
	if _, err := Built(filepath.Join(dir, "bad"), ".", env); err == nil || !strings.Contains(err.Error(), "undefined") {
		t.Errorf("a program that does not compile: %v, want the compiler's words", err)
	}
}

// TestWithoutRace: Built's programs are built without -race whatever
// GOFLAGS says, and with the rest of it.
func TestWithoutRace(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                         "",
		"-race":                    "",
		"-mod=mod -race -trimpath": "-mod=mod -trimpath",
		"-race=true -v":            "-v",
		"-raceful":                 "-raceful",
	} {
		if got := withoutRace(in); got != want {
			t.Errorf("withoutRace(%q) = %q, want %q", in, got, want)
		}
	}
}
