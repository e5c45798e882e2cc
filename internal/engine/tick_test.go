package engine

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// TestTickers: both tickers tick about every period, and stop releases a
// wait in progress at once (the run's end must not wait for a tick).
func TestTickers(t *testing.T) {
	t.Parallel()
	kernel, err := newKernelTicker(time.Millisecond)
	if runtime.GOOS == "linux" && err != nil {
		t.Fatalf("no timerfd ticker on Linux: %v", err)
	}
	tickers := map[string]ticker{"go": newGoTicker(time.Millisecond)}
	if err == nil {
		tickers["kernel"] = kernel
	}
	for name, tk := range tickers {
		t.Run(name, func(t *testing.T) {
			tk.wait() // the ticks missed so far come as one
			start := time.Now()
			for i := 0; i < 20; i++ {
				if !tk.wait() {
					t.Fatal("wait returned false before stop")
				}
			}
			if d := time.Since(start); d < 19*time.Millisecond {
				t.Fatalf("20 ticks of 1ms in %v", d)
			}
			released := make(chan bool)
			go func() { released <- tk.wait() }()
			tk.stop()
			select {
			case ok := <-released:
				if ok {
					// The wait may have caught a tick just before stop;
					// the next one must see the stop.
					if tk.wait() {
						t.Fatal("wait after stop returned true")
					}
				}
			case <-time.After(10 * time.Second):
				t.Fatal("stop did not release a wait in progress")
			}
			tk.stop() // idempotent
		})
	}
}

// TestKernelTickerWaitsOnIO: the sampler's ticker keeps no Go timer
// pending on Linux: a goroutine blocked in it shows in a stack dump as
// waiting on I/O, not on a timer or a channel fed by one.
func TestKernelTickerWaitsOnIO(t *testing.T) {
	// Not parallel: it reads every goroutine's stack, other tests' runs too.
	if runtime.GOOS != "linux" {
		t.Skip("the kernel ticker is Linux's timerfd")
	}
	tk, err := newKernelTicker(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer tk.stop()
	go tk.wait()
	testutil.Eventually(t, 10*time.Second, func() bool {
		buf := make([]byte, 1<<20)
		return containsIOWait(string(buf[:runtime.Stack(buf, true)]))
	}, "a goroutine waiting on the timerfd in IO wait")
}

func containsIOWait(stacks string) bool {
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, "[IO wait") && strings.Contains(g, "kernelTicker") {
			return true
		}
	}
	return false
}

// TestObserveInterval: series points come every Interval even when it is
// shorter than SampleEvery (the sampler then ticks at the Interval).
func TestObserveInterval(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	funcKind(reg, "slow", false, true, func(ctx context.Context, r nodes.Replica) error {
		out := r.Out("out")
		for i := range 40 {
			time.Sleep(5 * time.Millisecond) // the work: 200ms in all
			if err := out.Send(ctx, i); err != nil {
				return err
			}
		}
		return nil
	})
	funcKind(reg, "sink", true, false, func(ctx context.Context, r nodes.Replica) error {
		return readAll(ctx, r.In("in"))
	})
	observed := 0
	rep, err := Run(context.Background(), loadPair(t, reg, "slow", "sink", 1, 1, graph.Shared), Options{
		Registry: reg, SampleEvery: time.Second, Interval: 10 * time.Millisecond,
		Observe: func(*report.Snapshot) { observed++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	// 200ms at 10ms: about 20, fewer on a loaded machine; a sampler
	// ticking at SampleEvery would manage none (and one last series point).
	if observed < 4 || len(rep.Series) < 4 {
		t.Errorf("%d observe calls and %d series points over %.0fms at a 10ms interval", observed, len(rep.Series), rep.WallSeconds*1000)
	}
}
