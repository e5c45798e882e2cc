package plugintest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
)

// BThenA is an in-process node kind, "b_then_a", that takes count items
// from its input b, then count from a, then expects both to end: the
// consumer of ForkSpec. Each item must be a synthetic.Blob whose Data
// names its port and whose Seq counts from 0 on that port.
func BThenA(count int) nodes.Spec {
	return nodes.Spec{
		Kind: graph.Kind{Name: "b_then_a", Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "a", Dir: graph.In, Type: "blob"}, {Name: "b", Dir: graph.In, Type: "blob"}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				for _, port := range []string{"b", "a"} {
					for i := range count {
						item, err := r.In(port).Recv(ctx)
						if err != nil {
							return fmt.Errorf("%s after %d items: %w", port, i, err)
						}
						if b, ok := item.(*synthetic.Blob); !ok || string(b.Data) != port || b.Seq != int64(i) {
							return fmt.Errorf("item %d on %s is %v", i, port, item)
						}
					}
				}
				for _, port := range []string{"a", "b"} {
					if item, err := r.In(port).Recv(ctx); err != io.EOF {
						return fmt.Errorf("%s: %v (%v) after %d items, want the end", port, item, err, count)
					}
				}
				return nil
			}), nil
		},
	}
}

// ForkSpec is a pipeline in which stage f, of node kind fork (a plugin's:
// count items on each of its outputs a and b, sent concurrently), feeds
// BThenA over two edges that hold 4 items each.
func ForkSpec(fork string, count int) string {
	return fmt.Sprintf(`
stage "f" {
  node = %q
  config {
    count = %d
  }
}
stage "j" {
  node = "b_then_a"
}
edge "a" {
  from     = f.a
  to       = j.a
  capacity = 4
}
edge "b" {
  from     = f.b
  to       = j.b
  capacity = 4
}`, fork, count)
}

// SlowSpec is a pipeline that runs for minutes through stage p of node
// kind kind: a source of an item a millisecond, p, and a sink.
func SlowSpec(kind string, replicas int) string {
	return fmt.Sprintf(`
stage "src" {
  node = "synthetic_source"
  config {
    count        = 1000000
    service_time = "1ms"
  }
}
stage "p" {
  node     = %q
  replicas = %d
}
stage "done" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = p.in
}
edge "b" {
  from = p.out
  to   = done.in
}`, kind, replicas)
}

// Procs lists the processes whose command line contains marker.
func Procs(marker string) []int {
	out, _ := exec.Command("pgrep", "-f", regexp.QuoteMeta(marker)).Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// KillDflow starts dflow (a command that runs plugins), waits until want
// processes whose command lines contain marker run, kills dflow with
// SIGKILL, and fails t unless every one of them is gone within 10 s; it
// kills what is left.
func KillDflow(t testing.TB, dflow *exec.Cmd, marker string, want int) {
	t.Helper()
	if _, err := exec.LookPath("pgrep"); err != nil {
		t.Skip("no pgrep")
	}
	var stderr syncBuf
	dflow.Stderr = &stderr
	if err := dflow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		dflow.Process.Kill()
		dflow.Wait()
	}()
	if !testutil.Within(30*time.Second, func() bool { return len(Procs(marker)) >= want }) {
		t.Fatalf("%d plugin processes running, want %d; dflow's stderr:\n%s", len(Procs(marker)), want, stderr.String())
	}
	dflow.Process.Kill() // SIGKILL: dflow gets no say
	dflow.Wait()
	killed := time.Now()
	var left []int
	if testutil.Within(10*time.Second, func() bool { left = Procs(marker); return len(left) == 0 }) {
		t.Logf("%d plugin processes gone %v after dflow was killed", want, time.Since(killed).Round(time.Millisecond))
		return
	}
	ps, _ := exec.Command("ps", "-o", "pid,ppid,pgid,args", "-p", strings.Trim(fmt.Sprint(left), "[]")).CombinedOutput()
	for _, pid := range left {
		if p, err := os.FindProcess(pid); err == nil {
			p.Kill()
		}
	}
	t.Fatalf("plugin processes outlived a SIGKILLed dflow by 10 s:\n%s", ps)
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// DeadlockSpec is specs/seed.hcl wired to deadlock (as in the engine's
// TestDeadlockNamed) with target, a plugin's kind, as the five targets:
// the reader rotates over them, target 2 alone feeds drafter 2, and the
// drafters step together, so the cycle runs through the plugin stage.
func DeadlockSpec(target string) string {
	return fmt.Sprintf(deadlockSpec, target)
}

const deadlockSpec = `
stage "reader" {
  node = "synthetic_source"
  config {
    count = 3000
  }
}
stage "target" {
  node     = "%s"
  replicas = 5
}
stage "drafter" {
  node     = "synthetic_work"
  replicas = 3
  config {
    service_time = "100us"
    sync         = true
  }
}
stage "done" {
  node = "sink"
}
edge "tokens" {
  from     = reader.out
  to       = target.in
  policy   = "round_robin"
  capacity = 4
}
edge "hs" {
  from     = target.out
  to       = drafter.in
  policy   = "round_robin"
  capacity = 4
}
edge "trained" {
  from = drafter.out
  to   = done.in
}
`

// Sink is a node kind for tests: one input port "in" of type portType
// (graph.Any takes all), whose replicas call each on every item until the
// end of input; an error from each fails the replica.
func Sink(name, portType string, each func(item any) error) nodes.Spec {
	return nodes.Spec{
		Kind: graph.Kind{Name: name, Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: portType}}
		}},
		New: func(*graph.Config) (nodes.Node, error) {
			return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
				in := r.In("in")
				for {
					item, err := in.Recv(ctx)
					if err == io.EOF {
						return nil
					}
					if err != nil {
						return err
					}
					if err := each(item); err != nil {
						return err
					}
				}
			}), nil
		},
	}
}
