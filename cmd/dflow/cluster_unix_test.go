//go:build unix

package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLocalClusterTerminalInterrupt: Ctrl-C in a terminal reaches the
// whole foreground process group, the coordinator and the workers
// --local-cluster started. The workers leave it to the coordinator, so
// the run drains as with a Ctrl-C to the coordinator alone: exit 130,
// interrupted, every edge balanced, no worker aborted.
func TestLocalClusterTerminalInterrupt(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "r.json")
	cmd := dflowCmd(nil, "run", "../../specs/seed.hcl", "--local-cluster", "2", "--var", "items=100000",
		"--interval", "200ms", "--report", out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a group of its own, as a shell's job
	coord := startProc(t, cmd)
	coord.waitFor(t, "ETA", 60*time.Second)
	syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) // the terminal's Ctrl-C: the whole group
	checkDrained(t, coord, out)
	if strings.Contains(coord.output(), ": aborted") {
		t.Errorf("a worker aborted:\n%s", coord.output())
	}
}
