package python

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestPackage runs the SDK's own tests (tests/test_*.py: the item codec,
// steps in lockstep, the collectives, shared memory, the replica and the
// service without a network) with the system Python: under pytest where
// it has it (Debian: python3-pytest), else under unittest, which they are
// written for too.
func TestPackage(t *testing.T) {
	needModules(t, "grpc", "google.protobuf", "numpy")
	runner := "unittest"
	args := []string{"-m", "unittest", "discover", "-s", "tests", "-v"}
	if exec.Command(system, "-m", "pytest", "--version").Run() == nil {
		runner = "pytest"
		args = []string{"-m", "pytest", "-p", "no:cacheprovider", "-v", "tests"}
	} else {
		t.Logf("%s has no pytest (Debian: python3-pytest): the tests run under unittest", system)
	}
	cmd := exec.Command(system, args...)
	// This folder first on sys.path (python -m puts the working
	// directory there), not a dflowplugin installed elsewhere; nothing
	// written beside the sources.
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", system, strings.Join(args, " "), err, out)
	}
	// Each runner says how many ran; none is a failure (unittest exits 0
	// when discovery finds nothing).
	n := 0
	re := regexp.MustCompile(`(?m)^Ran (\d+) tests? in`)
	if runner == "pytest" {
		re = regexp.MustCompile(`(\d+) passed`)
	}
	if m := re.FindSubmatch(out); m != nil {
		n, _ = strconv.Atoi(string(m[1]))
	}
	if n == 0 {
		t.Fatalf("%s ran no tests:\n%s", runner, out)
	}
	t.Logf("%s: %d tests passed", runner, n)
}
