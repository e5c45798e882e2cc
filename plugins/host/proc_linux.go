package host

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"unsafe"
)

func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// starts are the plugin commands to start on the forking thread.
var (
	starts    = make(chan startReq)
	startOnce sync.Once
)

type startReq struct {
	cmd  *exec.Cmd
	done chan error
}

// start starts cmd from one goroutine locked to its thread for good: the
// kernel sends a child its Pdeathsig when the thread that forked it exits,
// and Go ends a thread whose goroutine exits locked to it.
func start(cmd *exec.Cmd) error {
	startOnce.Do(func() { go forkingThread() })
	done := make(chan error, 1)
	starts <- startReq{cmd, done}
	return <-done
}

// forkingThread is the goroutine that starts plugins, locked to its
// thread; it never ends (the tests' leak check knows it).
func forkingThread() {
	runtime.LockOSThread() // never unlocked: the thread lives as long as dflow
	for req := range starts {
		req.done <- req.cmd.Start()
	}
}

func killGroup(pgid int) {
	if pgid > 0 {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// exited waits until process pid has exited, without reaping it
// (waitid with WNOWAIT), so that its group can still be killed safely,
// and reports whether it could.
func exited(pid int) bool {
	const pPID, wExited, wNoWait = 1, 4, 0x1000000
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), wExited|wNoWait, 0, 0)
		if errno != syscall.EINTR {
			return errno == 0
		}
	}
}

// processExists reports whether a process of that id exists (signal 0).
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
