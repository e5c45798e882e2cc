//go:build !unix

package host

import (
	"os/exec"
	"syscall"
)

// Elsewhere (Windows) there are no process groups to kill: the lifeline
// and the SDK's parent watch end a plugin whose dflow ended.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func start(cmd *exec.Cmd) error { return cmd.Start() }

func killGroup(int) {}

func exited(int) bool { return false }

// processExists cannot tell here: no folder is swept.
func processExists(int) bool { return true }
