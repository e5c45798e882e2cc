package host

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin/runner"
)

// pipeGrace is how long, after a plugin's process group was killed, dflow
// keeps reading its stdout and stderr before it closes them: a process
// that left the group (setsid) and holds them open cannot hold dflow.
var pipeGrace = time.Second

// proc runs one plugin process for go-plugin (ClientConfig.RunnerFunc) so
// that no process of the plugin's tree outlives dflow or holds it:
//
//   - the plugin runs in a process group of its own, which is killed
//     whole when dflow kills the plugin or the plugin's first process
//     exits (a wrapper script's children with it), and only while that
//     process is not yet reaped, so that the group's id cannot have been
//     reused;
//   - on Linux the kernel kills it with SIGKILL when dflow dies
//     (Pdeathsig), and it is started from one thread that never exits,
//     since Pdeathsig fires when the thread that started it exits;
//   - its stdin is a lifeline (wire.LifelineEnv): a pipe whose write end
//     only dflow holds, closed when dflow dies, however it dies, on which
//     the SDK and the Python module exit, in every process of the tree
//     that inherited it;
//   - the start timeout holds whatever the tree does: a killed plugin's
//     pipes are closed after pipeGrace, so that a process that keeps them
//     open does not keep go-plugin waiting on them.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr io.ReadCloser
	lifeline       *os.File // the write end of the plugin's stdin
	path           string
	pid            int

	mu     sync.Mutex
	reaped bool // the first process is reaped: its group id may be reused
}

// newProc is the RunnerFunc of a plugin at path: cmd carries the
// environment go-plugin gives plugins, and env is added to it.
// The proc made is stored in *made.
func newProc(path string, made **proc, env []string) func(hclog.Logger, *exec.Cmd, string) (runner.Runner, error) {
	return func(_ hclog.Logger, spec *exec.Cmd, _ string) (runner.Runner, error) {
		exe := path
		if !strings.ContainsRune(exe, filepath.Separator) {
			// A file in the folder dflow runs in, as the plugin block and
			// discovery of "." mean it; exec would look it up in $PATH.
			exe = "." + string(filepath.Separator) + exe
		}
		cmd := exec.Command(exe)
		cmd.Env = append(append(spec.Env, env...), wire.LifelineEnv+"=stdin")
		cmd.SysProcAttr = sysProcAttr()
		p := &proc{cmd: cmd, path: path}
		*made = p
		var err error
		if p.stdout, err = cmd.StdoutPipe(); err != nil {
			return nil, err
		}
		if p.stderr, err = cmd.StderrPipe(); err != nil {
			return nil, err
		}
		return p, nil
	}
}

func (p *proc) Start(context.Context) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	p.cmd.Stdin = r
	err = start(p.cmd)
	r.Close() // the plugin's now, or no one's
	if err != nil {
		w.Close()
		return err
	}
	p.lifeline = w
	p.pid = p.cmd.Process.Pid
	return nil
}

// Wait waits for the plugin's first process, kills what is left of its
// group before reaping it, and closes the lifeline.
func (p *proc) Wait(context.Context) error {
	gone := exited(p.pid)
	p.mu.Lock()
	if gone && !p.reaped {
		killGroup(p.pid)
	}
	p.reaped = true
	p.mu.Unlock()
	err := p.cmd.Wait()
	p.lifeline.Close()
	return err
}

// Kill kills the plugin's process group, and closes its pipes after
// pipeGrace if something still holds them.
func (p *proc) Kill(context.Context) error {
	if p.pid == 0 {
		return nil // never started
	}
	p.mu.Lock()
	if !p.reaped {
		killGroup(p.pid)
	}
	p.mu.Unlock()
	err := p.cmd.Process.Kill()
	p.lifeline.Close()
	time.AfterFunc(pipeGrace, func() {
		p.stdout.Close()
		p.stderr.Close()
	})
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

func (p *proc) Stdout() io.ReadCloser { return p.stdout }
func (p *proc) Stderr() io.ReadCloser { return p.stderr }
func (p *proc) Name() string          { return p.path }
func (p *proc) ID() string {
	if p.pid == 0 {
		return ""
	}
	return strconv.Itoa(p.pid)
}
func (p *proc) Diagnose(context.Context) string { return "" }

func (p *proc) PluginToHost(network, addr string) (string, string, error) { return network, addr, nil }
func (p *proc) HostToPlugin(network, addr string) (string, string, error) { return network, addr, nil }
