//go:build unix && !linux

package host

import (
	"os/exec"
	"syscall"
)

// Without Pdeathsig (Linux only), a plugin's own process group, and the
// lifeline and parent watch of the SDK, end a plugin whose dflow ended.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func start(cmd *exec.Cmd) error { return cmd.Start() }

func killGroup(pgid int) {
	if pgid > 0 {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// exited cannot wait without reaping here: the group is killed only by
// Kill, while the process is not yet reaped.
func exited(int) bool { return false }

// processExists reports whether a process of that id exists (signal 0).
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
