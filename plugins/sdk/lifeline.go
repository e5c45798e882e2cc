package sdk

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/plugins/internal/wire"
)

// parentPoll is how often a plugin checks that its parent is still the
// process that started it.
const parentPoll = 200 * time.Millisecond

// watchParent ends the plugin process when dflow has gone: at end-of-file
// on the lifeline (when dflow set one up), and when its parent changes
// (it was orphaned: dflow, or the wrapper script that started it, died).
// dflow also kills a plugin's process group when it closes it, and on
// Linux the kernel kills the process it started when it dies; this is
// the layer that reaches a plugin a wrapper started.
func watchParent() {
	if os.Getenv(wire.LifelineEnv) == "stdin" {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			parentGone("its lifeline, the plugin's stdin, closed")
		}()
	}
	if ppid := os.Getppid(); ppid > 1 { // 1: started by init, or in a container as its child
		go func() {
			for range time.Tick(parentPoll) {
				if os.Getppid() != ppid {
					parentGone(fmt.Sprintf("the plugin's parent, process %d, exited", ppid))
				}
			}
		}()
	}
}

func parentGone(why string) {
	fmt.Fprintf(Stderr, "dflow-plugin: dflow has gone (%s): exiting\n", why)
	os.Exit(1)
}

// recovered runs f, turning a panic into an error with the panic's value
// and the frames that raised it, as dflow's engine does for a node in
// process.
func recovered(f func()) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, panicFrames(debug.Stack()))
		}
	}()
	f()
	return nil
}

// panicFrames is the stack from the frame that panicked up to the SDK's
// call of the node, at most 8 frames: without the frames of debug.Stack,
// the deferred recover, panic itself and the runtime functions it went
// through, nor the SDK's and gRPC's below the node.
func panicFrames(stack []byte) string {
	lines := strings.Split(strings.TrimRight(string(stack), "\n"), "\n")
	if len(lines) > 0 && strings.HasPrefix(lines[0], "goroutine ") {
		lines = lines[1:]
	}
	// Frames are two lines each: the function, then its file and line.
	for i := 0; i+1 < len(lines); i += 2 {
		if strings.HasPrefix(lines[i], "panic(") {
			lines = lines[i+2:]
			for len(lines) > 1 && strings.HasPrefix(lines[0], "runtime.") {
				lines = lines[2:]
			}
			break
		}
	}
	// Up to the SDK's frames that called the node (gRPC's are below),
	// past those the node called (Replica.In panics on a port it lacks).
	sdkFrame := func(i int) bool { return strings.HasPrefix(lines[i], "github.com/dflow-dev/dflow/plugins/sdk.") }
	node := false
	for i := 0; i < len(lines); i += 2 {
		if !sdkFrame(i) {
			node = true
		} else if node {
			lines = lines[:i]
			break
		}
	}
	if len(lines) > 16 {
		lines = lines[:16]
	}
	return strings.Join(lines, "\n")
}
