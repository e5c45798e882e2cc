package run_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestEmbedExample builds and runs examples/embed, a module of its own
// that can import only dflow's public packages (Go forbids another
// module's internal/): the public API is enough to build a graph in Go,
// register a node kind, run it and print the report; and, with
// -local-cluster 2, to coordinate a cluster whose workers are the
// program itself (`embed worker ...`, run.Worker) with its own kinds.
func TestEmbedExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := builtEmbed(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "1000"}, "sum of squares of 1..1000 = 333833500\n"},
		{[]string{"-n", "1000", "-local-cluster", "2"}, "sum of squares of 1..1000 = 333833500, on workers [local1 local2]\n"},
	} {
		out, err := exec.CommandContext(ctx, bin, tc.args...).CombinedOutput()
		if err != nil {
			t.Fatalf("embed %s: %v\n%s", strings.Join(tc.args, " "), err, out)
		}
		for _, want := range []string{
			"run ok in",
			"stage square     in=1000   out=1000",
			"edge  n          shared      produced=1000 consumed=1000",
			tc.want,
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("embed %s: the output lacks %q:\n%s", strings.Join(tc.args, " "), want, out)
			}
		}
	}
}

// TestEmbedWorkerKilled: exactly once for an item type an embedder
// registers, a Go value type (examples/embed's int, with a wire encoding
// of its own), across a SIGKILLed worker. examples/embed runs on a local
// cluster of three of its own workers, the numbers and their squares
// crossing between them as ints; once the worker that runs only square
// replicas has done some of the work, it is killed. Its replicas restart
// on another worker, and the sum of the squares, the counts of every
// stage and edge and the run's status must all be exact: an int lost or
// handed on twice would change the sum.
func TestEmbedWorkerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to see a worker's CPU time")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := builtEmbed(t)
	const n = 200000
	cmd := exec.CommandContext(ctx, bin, "-n", strconv.Itoa(n), "-local-cluster", "3", "-log")
	var out strings.Builder
	cmd.Stdout = &out
	var log testutil.SyncBuffer
	cmd.Stderr = &log
	// The local workers write to the same stderr: once the coordinator is
	// gone (killed below on a failure, or by ctx), Wait waits for them to
	// leave, as they do once its embedded server has gone, within seconds.
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var runErr error
	ended := make(chan struct{})
	go func() { runErr = cmd.Wait(); close(ended) }()
	// On any failure, nothing of the run outlives the test.
	t.Cleanup(func() { cmd.Process.Kill(); <-ended })
	over := func() bool {
		select {
		case <-ended:
			return true
		default:
			return false
		}
	}
	// The victim: the worker that runs square replicas only (no numbers,
	// no sum), once the run has begun; its pid from the local cluster's
	// line.
	var victim string
	var pid int
	if !testutil.Within(time.Minute, func() bool {
		if over() {
			return true
		}
		for _, line := range strings.Split(log.String(), "\n") {
			if w, ok := strings.CutPrefix(line, "dflow worker "); ok {
				if name, reps, ok := strings.Cut(w, ": run "); ok {
					if _, what, ok := strings.Cut(reps, ": "); ok && strings.HasPrefix(what, "square[") && !strings.Contains(what, "numbers") && !strings.Contains(what, "sum") {
						victim = name
					}
				}
			}
		}
		if victim == "" || !strings.Contains(log.String(), "dflow: cluster run ") {
			return false
		}
		_, after, ok := strings.Cut(log.String(), victim+" (pid ")
		num, _, closed := strings.Cut(after, ")")
		if !ok || !closed {
			return false
		}
		var err error
		pid, err = strconv.Atoi(num)
		return err == nil
	}) {
		t.Fatalf("no worker running square replicas only, with its pid, within a minute:\n%s", log.String())
	}
	if over() {
		t.Fatalf("embed ended (%v) before a worker ran square replicas only:\n%s\n%s", runErr, out.String(), log.String())
	}
	// Some of the work done there: a third of a second of its CPU.
	if !testutil.Within(time.Minute, func() bool { return over() || cpuTicks(pid) >= 33 }) {
		t.Fatalf("worker %s (pid %d) did not spend a third of a second of CPU within a minute:\n%s", victim, pid, log.String())
	}
	if over() {
		t.Fatalf("embed ended (%v) before worker %s (pid %d) spent a third of a second of CPU:\n%s\n%s", runErr, victim, pid, out.String(), log.String())
	}
	p, err := os.FindProcess(pid)
	if err == nil {
		err = p.Kill() // SIGKILL
	}
	if err != nil {
		t.Fatalf("killing %s (pid %d): %v", victim, pid, err)
	}
	<-ended
	if runErr != nil {
		t.Fatalf("embed: %v\n%s\n%s", runErr, out.String(), log.String())
	}
	for _, want := range []string{
		"run ok in",
		fmt.Sprintf("stage square     in=%d out=%d", n, n),
		fmt.Sprintf("edge  n          shared      produced=%d consumed=%d", n, n),
		fmt.Sprintf("edge  s          shared      produced=%d consumed=%d", n, n),
		fmt.Sprintf("sum of squares of 1..%d = %d,", n, int64(n)*(n+1)*(2*n+1)/6),
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(log.String(), "restarting square[") {
		t.Errorf("no square replica restarted after %s was killed:\n%s", victim, log.String())
	}
}

// cpuTicks is the user and system CPU time process pid has spent, in
// clock ticks (a hundredth of a second on Linux), or 0 if it cannot be
// read.
func cpuTicks(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// after the command's name, in parentheses (the last ")": the name
	// may hold one): state is field 3, utime and stime fields 14 and 15
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return u + s
}

// builtEmbed builds examples/embed, a module of its own, once for the
// package's tests.
func builtEmbed(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../examples/embed")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := testutil.Built(dir, ".", []string{"GOWORK=off", "GOFLAGS="})
	if err != nil {
		t.Fatal(err)
	}
	return bin
}
