// Package testutil holds what the tests of several packages share: one
// way to wait for a condition, instead of a poll loop written in each,
// one way to build a program a test runs, and one TestMain.
package testutil

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Eventually polls cond until it holds, failing t (Fatalf) if it still
// does not after within: "timed out after 10s waiting for WHAT", with
// what formatted from what and args. It polls often at first (1 ms) and
// less as the wait grows (at most every 20 ms), so that a condition that
// holds at once costs nothing and a long wait costs little. Call it from
// the test's goroutine; elsewhere use Within.
func Eventually(t testing.TB, within time.Duration, cond func() bool, what string, args ...any) {
	t.Helper()
	if !Within(within, cond) {
		t.Fatalf("timed out after %v waiting for %s", within, fmt.Sprintf(what, args...))
	}
}

// Within polls cond as Eventually does and reports whether it held
// before within passed, for a goroutine other than the test's, or a test
// that says more than Eventually's message when it fails.
func Within(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		if cond() {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(min(pause, time.Until(deadline)+time.Millisecond))
	}
}

// RaceExitAtOnce makes the processes a test binary starts (workers,
// plugins, dflow itself) exit as soon as they are done when they are
// built with -race: the race runtime otherwise sleeps a second at exit
// (GORACE's atexit_sleep_ms, 1000 by default) so that goroutines still
// running may report, and a test that waits for its processes to end
// waits that second for each. A race is still reported when it happens, and a
// process that saw one still exits 66; only one found in that last
// second is missed. A GORACE that sets atexit_sleep_ms itself is kept.
// Call it from TestMain, in the parent, before any test starts a process.
func RaceExitAtOnce() {
	g := os.Getenv("GORACE")
	if strings.Contains(g, "atexit_sleep_ms") {
		return
	}
	os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0"))
}

// WaitingTests lets n tests marked t.Parallel run at once, where the
// package's tests mostly wait (on worker processes, leases, drains,
// timeouts) rather than compute, and the machine has fewer than n
// cores: go test's default is one at a time per core. A -parallel given
// on the command line stands. Call it from TestMain, before m.Run; it
// parses the flags.
func WaitingTests(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < n {
		flag.Set("test.parallel", fmt.Sprint(n))
	}
}

// Built returns the path of the program pkg, built in dir (with env
// added to the go command's) without the race detector, whatever the
// test binary's build or GOFLAGS say. It comes from the build cache,
// where go run keeps the programs it links, so that the same program is
// linked once for every test binary and run that asks for it (a link of
// dflow costs about 4 s of CPU), not once each; such a program has no
// debug information and no VCS stamp (go run's build). args come before
// pkg on the go command's line (build flags).
func Built(dir, pkg string, env []string, args ...string) (string, error) {
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if runtime.GOROOT() == "" {
		goCmd = "go"
	}
	env = append(append(os.Environ(), "GOFLAGS="+withoutRace(os.Getenv("GOFLAGS"))), env...)
	run := func(line ...string) ([]byte, error) {
		cmd := exec.Command(goCmd, line...)
		cmd.Dir, cmd.Env = dir, env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("go %s (in %s): %v\n%s", strings.Join(line, " "), dir, err, stderr.String())
		}
		return out, nil
	}
	// The go command links a program it does not hold yet in a folder
	// of its own, which it removes once the program (printf here) has
	// run, and keeps the program in the cache: asked again, it names
	// the cache's.
	for range 2 {
		out, err := run(append(append([]string{"run", "-exec", "printf %s"}, args...), pkg)...)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(string(out)); err == nil {
			return string(out), nil
		}
	}
	// No program stays in the cache (a GOCACHEPROG cache keeps none, or
	// the cache did not keep this one while other builds ran): built into
	// a folder of its own, which outlives the test process as the cache's
	// would.
	tmp, err := os.MkdirTemp("", "dflow-built-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(tmp, filepath.Base(dir))
	if _, err := run(append(append([]string{"build", "-o", bin}, args...), pkg)...); err != nil {
		return "", err
	}
	return bin, nil
}

// withoutRace is GOFLAGS less -race.
func withoutRace(goflags string) string {
	var keep []string
	for _, f := range strings.Fields(goflags) {
		if f != "-race" && f != "-race=true" && f != "--race" {
			keep = append(keep, f)
		}
	}
	return strings.Join(keep, " ")
}

// Main is a package's TestMain: it runs the tests, fails the binary if a
// goroutine they started is still running after them (goleak), and exits
// with their code at once (exit). The thread that plugins/host starts
// plugins from lives as long as the process, by design
// (plugins/host/proc_linux.go): it is no leak.
func Main(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/dflow-dev/dflow/plugins/host.forkingThread"), goleak.Cleanup(exit))
}

// exit ends a test binary with code as os.Exit does, without the second
// the race runtime otherwise sleeps first (GORACE's atexit_sleep_ms) so
// that goroutines still running may report a race: a race found while a
// test ran has failed it already (the testing package checks after each
// test, and code is not 0), and Main has just checked that no goroutine
// the tests started is left. go test runs two test binaries at a time on
// two cores, and 34 of them: the seconds add up. What is given up: a
// race reported after the last test (in a goroutine that goleak waits
// out as it ends, or in plugins/host's forking thread) prints its report
// but no longer makes the binary exit 66.
func exit(code int) { syscall.Exit(code) }

// SyncBuffer is a bytes.Buffer safe to read while a process writes it
// (an exec.Cmd's Stdout or Stderr).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
