package host

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestPluginOutlivesItsForkingThread: Linux's Pdeathsig fires when the
// thread that started a process exits, not the process: a plugin started
// from a goroutine whose thread then ends must live on.
func TestPluginOutlivesItsForkingThread(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	path := wrapper(t, f.dir, "tp", "serve")
	type loaded struct {
		tid int
		err error
	}
	done := make(chan loaded, 1)
	var load func()
	load = func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if syscall.Gettid() == os.Getpid() {
			// The main thread, which Go never ends: again, on another
			// thread (this one is locked to this goroutine).
			go load()
			runtime.UnlockOSThread()
			return
		}
		_, err := f.h.Load("tp", path, f.reg)
		done <- loaded{syscall.Gettid(), err}
	}
	go load()
	l := <-done
	if l.err != nil {
		t.Fatal(l.err)
	}
	// The kernel has sent the Pdeathsig of the thread's children once the
	// thread is gone from /proc.
	task := fmt.Sprintf("/proc/self/task/%d", l.tid)
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, err := os.Stat(task)
		return os.IsNotExist(err)
	}, "thread %d to be gone from /proc", l.tid)
	// The catalog process answers Check for every config the spec
	// validates; the replicas have processes of their own.
	rep, err := f.run(fmt.Sprintf(passSpec, 200, 10, "tp/pass", 2), "stage.p.config.fail_after=1000")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Edges["b"].Produced != 200 {
		t.Errorf("%d items out", rep.Edges["b"].Produced)
	}
}
