package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// Cluster tests: loopback only, the workers are this test binary acting as
// dflow (DFLOW_AS_MAIN=1), every process is ours and killed by pid at the
// end.

// wantEdges asserts that every edge of rep produced and consumed n items.
func wantEdges(t *testing.T, rep *report.Report, n int64) {
	t.Helper()
	for name, e := range rep.Edges {
		if e.Produced != n || e.Consumed != n {
			t.Errorf("edge %s: produced %d, consumed %d, want %d each", name, e.Produced, e.Consumed, n)
		}
	}
}

// checkClusterReport asserts the seed's counts and that the replicas name
// the workers they ran on.
func checkClusterReport(t *testing.T, rep *report.Report, items int64, workers int) {
	t.Helper()
	if rep.Status != report.OK {
		t.Fatalf("status %s: %s", rep.Status, rep.Error)
	}
	wantEdges(t, rep, items)
	on := map[string]bool{}
	for name, st := range rep.Stages {
		for _, r := range st.Replicas {
			if r.Worker == "" {
				t.Errorf("%s[%d] names no worker", name, r.Index)
			}
			on[r.Worker] = true
		}
	}
	if len(on) != workers {
		t.Errorf("replicas ran on %v, want %d workers", on, workers)
	}
}

// TestLocalClusterSeed: dflow run specs/seed.hcl --local-cluster 3, the
// seed's 5 targets on 3 drafters over three worker processes, under both
// policies of hs: counts exact, the same summary as a local run.
func TestLocalClusterSeed(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"round_robin", "shared"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			out := filepath.Join(t.TempDir(), "r.json")
			// 120 items, not the seed's 300: each crosses race-built workers
			code, stdout, stderr := dflow(t, "run", "../../specs/seed.hcl", "--local-cluster", "3", "--report", out, "--interval", "500ms",
				"--var", "items=120", "--set", "edge.hs.policy="+policy, "--set", "stage.target.config.service_time=5ms", "--set", "stage.drafter.config.service_time=2ms")
			if code != exitOK || !strings.Contains(stdout, "run ok") || !strings.Contains(stdout, "edge  hs         "+policy) {
				t.Fatalf("code %d\n%s%s", code, stdout, stderr)
			}
			checkClusterReport(t, readReport(t, out), 120, 3)
		})
	}
}

// TestPlaceFlag: --place pins a stage's replicas to the workers named;
// the report says so.
func TestPlaceFlag(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "r.json")
	code, _, stderr := dflow(t, "run", "../../specs/seed.hcl", "--local-cluster", "2", "--report", out, "--place", "drafter=local2",
		"--var", "items=120", "--set", "stage.target.config.service_time=5ms", "--set", "stage.drafter.config.service_time=2ms")
	if code != exitOK || !strings.Contains(stderr, "drafter local2,local2,local2") {
		t.Fatalf("code %d\n%s", code, stderr)
	}
	rep := readReport(t, out)
	checkClusterReport(t, rep, 120, 2)
	for _, r := range rep.Stages["drafter"].Replicas {
		if r.Worker != "local2" {
			t.Errorf("drafter[%d] ran on %s", r.Index, r.Worker)
		}
	}
	if code, _, stderr := dflow(t, "run", "../../specs/seed.hcl", "--local-cluster", "2", "--place", "drafter=nobody"); code != exitFailed ||
		!strings.Contains(stderr, `no worker "nobody"`) {
		t.Errorf("an unknown worker: code %d\n%s", code, stderr)
	}
}

// proc is a dflow process of the test's.
type proc struct {
	cmd    *exec.Cmd
	out    *testutil.SyncBuffer
	waited chan struct{}
}

func startDflow(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startProc(t, dflowCmd(env, args...))
}

// dflowCmd is the command of this test binary acting as dflow.
func dflowCmd(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), "DFLOW_AS_MAIN=1"), env...)
	return cmd
}

// startProc starts cmd, killed at the end of the test if still running.
func startProc(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, out: &testutil.SyncBuffer{}, waited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.waited) }()
	t.Cleanup(func() {
		select {
		case <-p.waited:
		default:
			cmd.Process.Kill()
			<-p.waited
		}
		// This race-built binary, as dflow, says a race on its output
		// when it sees one, and would exit 66 only at its end, which a
		// killed process never reaches.
		if out := p.output(); strings.Contains(out, "WARNING: DATA RACE") {
			t.Errorf("%v saw a data race:\n%s", cmd.Args, out)
		}
	})
	return p
}

// wait waits for the process to exit, at most d.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.waited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("%v did not exit within %v:\n%s", p.cmd.Args[1:], d, p.out.String())
		return -1
	}
}

func (p *proc) output() string { return p.out.String() }

// natsServerOnce builds nats-server once for the tests of this process
// (on a cold cache, a dozen links of it at once starved the others).
var natsServerOnce = sync.OnceValues(func() (string, error) {
	return testutil.Built(repoRoot, "github.com/nats-io/nats-server/v2", nil)
})

// natsServer is a cluster's server, as workers and a coordinator join it.
type natsServer struct{ URL, Token string }

// startServer starts a nats-server process with JetStream for the test,
// built from the module (testutil.Built) without the race detector: in
// this race-built process, the server's own work was a third of what
// the cluster tests cost, and none of it is dflow's code. Where it cannot
// be built, the server is embedded in this process, as dflow run
// --local-cluster's is (TestLocalClusterSeed and internal/cluster test
// that one).
func startServer(t *testing.T) *natsServer {
	t.Helper()
	bin, err := natsServerOnce()
	if err != nil {
		t.Logf("cannot build nats-server (%v): the server is embedded", err)
		srv, err := cluster.StartServer(cluster.ServerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		return &natsServer{URL: srv.URL, Token: srv.Token}
	}
	dir := t.TempDir()
	token := cluster.NewToken()
	// -p -1: a free port, written to the ports file
	p := startDflowBin(t, bin, "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", filepath.Join(dir, "js"), "--auth", token, "--ports_file_dir", dir)
	var url string
	if !testutil.Within(20*time.Second, func() bool {
		files, _ := filepath.Glob(filepath.Join(dir, "*.ports"))
		if len(files) == 0 {
			return false
		}
		b, _ := os.ReadFile(files[0])
		var ports struct{ Nats []string }
		if json.Unmarshal(b, &ports) != nil || len(ports.Nats) == 0 {
			return false // not yet written whole
		}
		url = ports.Nats[0]
		return true
	}) {
		t.Fatalf("nats-server did not say where it listens:\n%s", p.output())
	}
	return &natsServer{URL: url, Token: token}
}

// TestWorkerWithoutToken: a worker without the cluster's token, or with
// a wrong one, is refused by the embedded server with words that say so.
func TestWorkerWithoutToken(t *testing.T) {
	t.Parallel()
	srv, err := cluster.StartServer(cluster.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	for _, env := range [][]string{{"DFLOW_CLUSTER_TOKEN="}, {"DFLOW_CLUSTER_TOKEN=wrong"}} {
		p := startDflow(t, env, "worker", "--join", srv.URL, "--name", "intruder")
		if code := p.wait(t, 20*time.Second); code != exitFailed || !strings.Contains(p.output(), "refused the connection") ||
			!strings.Contains(p.output(), "DFLOW_CLUSTER_TOKEN") {
			t.Errorf("%v: code %d\n%s", env, code, p.output())
		}
	}
	if !strings.HasPrefix(srv.URL, "nats://127.0.0.1:") {
		t.Errorf("the embedded server listens at %s, want loopback", srv.URL)
	}
}

// TestCredsFlag: --creds names a NATS credentials file for a server of
// one's own (internal/cluster's TestCredentials runs the seed on an
// operator-mode server with one): a file that is not there is named, a
// token refused by such a server says both ways in, and the embedded
// server, which takes a token, rejects the flag as a usage error.
func TestCredsFlag(t *testing.T) {
	srv := startServer(t)
	missing := filepath.Join(t.TempDir(), "none.creds")
	p := startDflow(t, nil, "worker", "--join", srv.URL, "--creds", missing)
	if code := p.wait(t, 20*time.Second); code != exitFailed || !strings.Contains(p.output(), missing) {
		t.Errorf("a missing file: code %d\n%s", code, p.output())
	}
	p = startDflow(t, []string{"DFLOW_CLUSTER_TOKEN="}, "worker", "--join", srv.URL)
	if code := p.wait(t, 20*time.Second); code != exitFailed || !strings.Contains(p.output(), "--creds") {
		t.Errorf("no token: code %d\n%s", code, p.output())
	}
	code, _, stderr := dflow(t, "run", "../../specs/seed.hcl", "--local-cluster", "2", "--creds", missing)
	if code != exitUsage || !strings.Contains(stderr, "takes a token") {
		t.Errorf("--creds with --local-cluster: code %d\n%s", code, stderr)
	}
	// the environment's credentials are for a server of one's own: the
	// workers --local-cluster starts join its embedded server with its token
	t.Setenv("DFLOW_CLUSTER_CREDS", missing)
	code, _, stderr = dflow(t, "run", "../../specs/seed.hcl", "--local-cluster", "1",
		"--set", "stage.target.config.service_time=1ms", "--set", "stage.drafter.config.service_time=1ms")
	if code != exitOK {
		t.Errorf("--local-cluster with DFLOW_CLUSTER_CREDS set: code %d\n%s", code, stderr)
	}
}

// TestServe: dflow run --serve ADDR coordinates with an embedded server
// for workers elsewhere: it prints how to join (the token named, not
// printed, when the user gave it), a standing worker joins
// with the token and runs its share, and when the coordinator (and with it
// the server) is gone the worker says so and leaves.
func TestServe(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	coord := startDflow(t, nil, "run", "../../specs/seed.hcl", "--serve", addr, "--workers", "1", "--token", "s3cret",
		"--set", "stage.target.config.service_time=1ms", "--set", "stage.drafter.config.service_time=1ms")
	coord.waitFor(t, "dflow worker --join nats://"+addr, 20*time.Second)
	// the token was the user's own: named, not printed (logs keep it)
	if !strings.Contains(coord.output(), "DFLOW_CLUSTER_TOKEN=<the token you gave>") || strings.Contains(coord.output(), "s3cret") {
		t.Errorf("the join line of a given token:\n%s", coord.output())
	}
	w := startDflow(t, []string{"DFLOW_CLUSTER_TOKEN=s3cret"}, "worker", "--join", "nats://"+addr, "--name", "far")
	if code := coord.wait(t, 60*time.Second); code != exitOK {
		t.Fatalf("coordinator: code %d\n%s", code, coord.output())
	}
	if code := w.wait(t, 30*time.Second); code != exitFailed || !strings.Contains(w.output(), "went away; leaving") {
		t.Errorf("the standing worker: code %d\n%s", code, w.output())
	}
	if !strings.Contains(w.output(), "run ") || !strings.Contains(w.output(), ": ok") {
		t.Errorf("the worker did not run its share:\n%s", w.output())
	}
}

// workers starts n worker processes joined to url: dflow as the README
// installs it, without the race detector. internal/cluster runs the
// workers' code (shares, queues, the data plane) under it, in process;
// here the coordinator is, in this process.
func workers(t *testing.T, url, token string, n int, extra ...string) []*proc {
	return workersOf(t, installed(t), url, token, n, extra...)
}

// workersOf starts n worker processes of bin, this test binary or a dflow
// (installed), joined to url.
func workersOf(t *testing.T, bin, url, token string, n int, extra ...string) []*proc {
	var ps []*proc
	for i := range n {
		ps = append(ps, workerOf(t, bin, url, token, fmt.Sprintf("w%d", i+1), extra...))
	}
	return ps
}

// workerOf starts the worker process `bin worker --join url --name name`:
// bin is this test binary, a dflow (installed) or an embedder's program
// whose worker takes dflow worker's flags.
func workerOf(t *testing.T, bin, url, token, name string, extra ...string) *proc {
	cmd := exec.Command(bin, append([]string{"worker", "--join", url, "--name", name}, extra...)...)
	cmd.Env = append(os.Environ(), "DFLOW_CLUSTER_TOKEN="+token) // DFLOW_AS_MAIN=1 from TestMain, for this binary
	return startProc(t, cmd)
}

// TestExternalServer: the seed over three workers on a nats-server process
// built from the module (github.com/nats-io/nats-server/v2, by testutil.Built), not
// the embedded one, started as docs/cluster.md's "server of your own"
// says: its config file written by the doc's line, the token in it and in
// no process's arguments.
func TestExternalServer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds nats-server")
	}
	dir := t.TempDir()
	bin, err := natsServerOnce()
	if err != nil {
		t.Skipf("cannot build nats-server: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	token := cluster.NewToken()
	// The doc's config line, run by sh, on this test's port and folder.
	conf := ownServerConf(t)
	conf = strings.ReplaceAll(conf, "10.0.0.5:4222", fmt.Sprintf("127.0.0.1:%d", port))
	conf = strings.ReplaceAll(conf, "/var/lib/dflow-nats", filepath.Join(dir, "js"))
	sh := exec.Command("sh", "-c", conf)
	sh.Dir, sh.Env = dir, append(os.Environ(), "DFLOW_CLUSTER_TOKEN="+token)
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", conf, err, out)
	}
	if fi, err := os.Stat(filepath.Join(dir, "nats.conf")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("nats.conf: %v, want it readable by its owner only", err)
	}
	srv := startDflowBin(t, bin, "-c", filepath.Join(dir, "nats.conf"))
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", srv.cmd.Process.Pid)); err == nil && bytes.Contains(cmdline, []byte(token)) {
		t.Errorf("the token is on nats-server's command line: %q", cmdline)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	if !testutil.Within(20*time.Second, func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		t.Fatalf("nats-server did not listen:\n%s", srv.output())
	}
	ws := workers(t, url, token, 3)
	out := filepath.Join(dir, "r.json")
	code, _, stderr := dflow(t, "run", "../../specs/seed.hcl", "--cluster", url, "--token", token, "--workers", "3", "--report", out,
		"--var", "items=120", "--set", "edge.hs.policy=shared", "--set", "stage.target.config.service_time=5ms", "--set", "stage.drafter.config.service_time=2ms")
	if code != exitOK {
		t.Fatalf("code %d\n%s\nworker 1:\n%s", code, stderr, ws[0].output())
	}
	checkClusterReport(t, readReport(t, out), 120, 3)
	for _, w := range ws {
		w.cmd.Process.Signal(os.Interrupt)
		w.wait(t, 10*time.Second)
	}
}

// ownServerConf is the command of docs/cluster.md that writes the config
// of a server of one's own (its lines joined where they end in a
// backslash).
func ownServerConf(t *testing.T) string {
	t.Helper()
	for _, b := range shBlocks(t, "../../docs/cluster.md") {
		if !slices.Contains(b, "nats-server -c nats.conf") {
			continue
		}
		joined := strings.ReplaceAll(strings.Join(b, "\n"), "\\\n", "")
		for _, l := range strings.Split(joined, "\n") {
			if strings.Contains(l, "> nats.conf") {
				return l
			}
		}
	}
	t.Fatal("docs/cluster.md shows no line that writes nats.conf before nats-server -c nats.conf")
	return ""
}

func startDflowBin(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	return startProc(t, exec.Command(bin, args...))
}

// coordinate runs a spec over the cluster from this process, calling
// during with the coordinator once the run has begun.
func coordinate(t *testing.T, srv *natsServer, n int, during func(*cluster.Coordinator), sets ...string) (*report.Report, error, time.Duration) {
	t.Helper()
	return coordinatePlaced(t, srv, n, nil, during, sets...)
}

// coordinatePlaced is coordinate with stages pinned to workers (--place).
func coordinatePlaced(t *testing.T, srv *natsServer, n int, place map[string][]string, during func(*cluster.Coordinator), sets ...string) (*report.Report, error, time.Duration) {
	t.Helper()
	return coordinateSpec(t, srv, "../../specs/seed.hcl", n, place, during, sets...)
}

// coordinateSpec is coordinatePlaced with the spec in file.
func coordinateSpec(t *testing.T, srv *natsServer, file string, n int, place map[string][]string, during func(*cluster.Coordinator), sets ...string) (*report.Report, error, time.Duration) {
	t.Helper()
	e := &env{stdout: &bytes.Buffer{}, stderr: &testutil.SyncBuffer{}, registry: nodes.Default.Clone()}
	defer e.closePlugins() // a spec's plugins, started to load it
	sf := &specFlags{sets: sets}
	g := e.load(sf, file)
	if g == nil {
		t.Fatal("spec")
	}
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := cluster.Connect(cluster.ConnOptions{URL: srv.URL, Token: srv.Token, Name: "dflow run " + file})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The coordinator as run.Cluster makes it, with the lease and ack
	// wait of the faults tests: short, so that a loss is found and its
	// items come back within a few seconds.
	c, err := cluster.NewCoordinator(context.Background(), cluster.CoordOptions{
		Conn: nc, Graph: g, Workers: n, Registry: e.registry,
		Job:      cluster.Job{Filename: file, Src: src, Sets: sets},
		Interval: 200 * time.Millisecond, Log: e.stderr, Pin: place,
		Timings: cluster.Timings{Lease: 2 * time.Second, AckWait: 3 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// during ends before the test does (it may report on t, and goleak
	// counts it otherwise); a run that failed early leaves it polling
	// until its own deadline.
	done := make(chan struct{})
	go func() {
		defer close(done)
		during(c)
	}()
	start := time.Now()
	rep, err := c.Run(ctx)
	took := time.Since(start)
	<-done
	t.Logf("the coordinator's log:\n%s", e.stderr.(*testutil.SyncBuffer).String()) // shown with -v, or when the test fails
	if ctx.Err() != nil {
		t.Fatalf("the run hung: %v", err)
	}
	return rep, err, took
}

// finishedSaid is the replicas the coordinator's log says had finished on
// a lost worker (not run again), as "stage[i]".
func finishedSaid(log string) map[string]bool {
	said := map[string]bool{}
	for _, m := range regexp.MustCompile(`\(([^()]*) had finished\)|had finished \(([^()]*)\)`).FindAllStringSubmatch(log, -1) {
		for _, r := range strings.Split(m[1]+m[2], ", ") {
			said[r] = true
		}
	}
	return said
}

// sinkGot polls the coordinator until the sink has n items.
func sinkGot(c *cluster.Coordinator, n int64, within time.Duration) bool {
	return testutil.Within(within, func() bool {
		for _, st := range c.Snapshot().Stages {
			if st.Name == "done" && len(st.Replicas) > 0 && st.Replicas[0].ItemsIn >= n {
				return true
			}
		}
		return false
	})
}

// TestWorkerKilled: a worker SIGKILLed mid-run. Its replicas are
// stateless (targets, an unsynchronized drafter, the sink): they restart on
// a live worker, what it had not finished comes back, and every count is
// exact: 200 items produced and consumed once on every edge, in and out of
// every stage once, wherever the kill fell. In "two a second apart" the
// second kill often falls when w2's targets have finished while w3's
// still held items: those stay finished (not restarted), and w3's items
// go to its restarts, not to a finished target whose consumer has ended.
func TestWorkerKilled(t *testing.T) {
	t.Parallel()
	const items = 200
	for _, tc := range []struct {
		name  string
		place map[string][]string
		after int64    // items at the sink before the kill
		sets  []string // more --set
		// also kills w3 too, a second before w2: w3 is counted lost a
		// lease (2s) after, when w2, the least loaded live worker (3
		// replicas against w1's 4), has been silent for only a second:
		// w3's restart picks w2, which does not answer, and goes to w1
		also bool
	}{
		// w2: targets 0 and 3 and drafter 1, no source, no sink
		{name: "targets", after: 60},
		// w2 also runs the sink, which then restarts elsewhere
		{name: "sink", place: map[string][]string{"done": {"w2"}}, after: 100},
		// one target on w2 rotating over the 3 drafters' queues: what it
		// sends again after the restart goes where it went first
		// (pinned apart from the reader: alone, the two would be a chain
		// on one worker, and both restart)
		{name: "rotation", place: map[string][]string{"reader": {"w1"}, "target": {"w2"}}, after: 60,
			sets: []string{"stage.target.replicas=1", "stage.target.config.service_time=5ms"}},
		{name: "two a second apart", after: 60, also: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := startServer(t)
			ws := workers(t, srv.URL, srv.Token, 3)
			rep, err, _ := coordinatePlaced(t, srv, 3, tc.place, func(c *cluster.Coordinator) {
				if !sinkGot(c, tc.after, 30*time.Second) {
					t.Error("the run did not get going")
					return
				}
				if tc.also {
					ws[2].cmd.Process.Signal(syscall.SIGKILL)
					time.Sleep(time.Second) // the scenario: w2 dies while w3's lease runs
				}
				ws[1].cmd.Process.Signal(syscall.SIGKILL)
			}, append([]string{"stage.reader.config.count=" + strconv.Itoa(items), "stage.drafter.config.sync=false", "stage.target.config.service_time=10ms", "stage.drafter.config.service_time=5ms"}, tc.sets...)...)
			if err != nil {
				t.Fatalf("%v\nw1:\n%s\nw2:\n%s\nw3:\n%s", err, ws[0].output(), ws[1].output(), ws[2].output())
			}
			if rep.Status != report.OK {
				t.Fatalf("status %s: %s", rep.Status, rep.Error)
			}
			wantEdges(t, rep, items)
			for _, stage := range []string{"target", "drafter", "done"} {
				var in, out int64
				for _, r := range rep.Stages[stage].Replicas {
					in += r.ItemsIn
					out += r.ItemsOut
				}
				want := int64(items)
				if stage == "done" {
					want = 0
				}
				if in != items || out != want {
					t.Errorf("stage %s: %d items in, %d out, want %d and %d", stage, in, out, items, want)
				}
			}
			restarted := false
			for _, r := range rep.Stages["target"].Replicas {
				restarted = restarted || strings.HasPrefix(r.Worker, "w2>") || tc.also && strings.HasPrefix(r.Worker, "w3>")
			}
			if !restarted {
				t.Errorf("no target replica restarted: %+v", rep.Stages["target"].Replicas)
			}
			if tc.place["done"] != nil && !strings.HasPrefix(rep.Stages["done"].Replicas[0].Worker, "w2>") {
				t.Errorf("the sink did not restart: %+v", rep.Stages["done"].Replicas)
			}
		})
	}
}

// crashEnv is run.Worker's test hook: a worker started with it set to
// STAGE:N kills itself (SIGKILL) right after the N-th item the replicas
// of that restartable stage send there, before the item it came from is
// committed.
const crashEnv = "DFLOW_TEST_CRASH_AFTER_SENDS"

// TestCrashAfterSend: the worst instant to lose a worker, made certain:
// w2 runs the only target, which rotates over the three synchronized
// drafters' queues on w1 and w3, and kills itself right after the 50th
// item the target sends, before the item it came from is committed. That
// item comes back, the restarted target sends it again to the queue the
// rotation had picked (the route record), JetStream drops the duplicate,
// the drafters stay in step (an even spread: no queue fills while another
// starves), and every count is exact.
func TestCrashAfterSend(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	var ws []*proc
	for i := range 3 {
		env := []string{"DFLOW_CLUSTER_TOKEN=" + srv.Token}
		if i == 1 {
			env = append(env, crashEnv+"=target:50")
		}
		ws = append(ws, startDflow(t, env, "worker", "--join", srv.URL, "--name", fmt.Sprintf("w%d", i+1)))
	}
	place := map[string][]string{"target": {"w2"}, "drafter": {"w1", "w3"}, "done": {"w3"}}
	rep, err, _ := coordinatePlaced(t, srv, 3, place, func(*cluster.Coordinator) {},
		"stage.target.replicas=1", "stage.target.config.service_time=2ms", "stage.drafter.config.service_time=1ms")
	if err != nil {
		t.Fatalf("%v\nw2:\n%s", err, ws[1].output())
	}
	select {
	case <-ws[1].waited:
	default:
		t.Fatal("w2 did not crash")
	}
	wantEdges(t, rep, 300)
	var in int64
	for _, r := range rep.Stages["drafter"].Replicas {
		in += r.ItemsIn
	}
	if in != 300 || rep.Stages["done"].Replicas[0].ItemsIn != 300 {
		t.Errorf("drafters took %d, the sink %d, want 300 each", in, rep.Stages["done"].Replicas[0].ItemsIn)
	}
	if w := rep.Stages["target"].Replicas[0].Worker; !strings.HasPrefix(w, "w2>") {
		t.Errorf("the target ran on %s, want a restart after w2", w)
	}
}

// TestSyncGroupLost: the seed's synchronized drafters (a group stepping
// together) with replica 1 on w2, SIGKILLed mid-run. The group steps on
// without it; its restart on a live worker rejoins the group at its first
// step, the items w2 had not finished come back to it, and every edge and
// stage counts 300 once.
func TestSyncGroupLost(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	ws := workers(t, srv.URL, srv.Token, 3)
	var killed time.Time
	rep, err, _ := coordinate(t, srv, 3, func(c *cluster.Coordinator) {
		if !sinkGot(c, 30, 30*time.Second) {
			t.Error("the run did not get going")
			return
		}
		killed = time.Now()
		ws[1].cmd.Process.Signal(syscall.SIGKILL)
	}, "stage.target.config.service_time=30ms", "stage.drafter.config.service_time=15ms")
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s: %v\nw2:\n%s", rep.Status, err, ws[1].output())
	}
	t.Logf("the run ended %v after the kill", time.Since(killed).Round(100*time.Millisecond))
	wantEdges(t, rep, 300)
	for _, stage := range []string{"target", "drafter", "done"} {
		var in int64
		for _, r := range rep.Stages[stage].Replicas {
			in += r.ItemsIn
		}
		if in != 300 {
			t.Errorf("stage %s took %d items, want 300", stage, in)
		}
	}
	if w := rep.Stages["drafter"].Replicas[1].Worker; !strings.HasPrefix(w, "w2>") {
		t.Errorf("drafter 1 ran on %s, want a restart after w2", w)
	}
}

// waitFor polls p's output for s.
func (p *proc) waitFor(t *testing.T, s string, within time.Duration) {
	t.Helper()
	if !testutil.Within(within, func() bool { return strings.Contains(p.output(), s) }) {
		t.Fatalf("no %q within %v:\n%s", s, within, p.output())
	}
}

// TestCoordinatorKilled: a coordinator SIGKILLed mid-run leaves no worker
// running its share: the worker sees the heartbeat stop and, started with
// --once as --local-cluster starts them, exits.
func TestCoordinatorKilled(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	w := startDflow(t, []string{"DFLOW_CLUSTER_TOKEN=" + srv.Token}, "worker", "--join", srv.URL, "--name", "w1", "--once")
	w.waitFor(t, "waiting for a job", 20*time.Second)
	coord := startDflow(t, nil, "run", "../../specs/seed.hcl", "--cluster", srv.URL, "--token", srv.Token, "--workers", "1",
		"--var", "items=100000")
	w.waitFor(t, "run ", 20*time.Second)
	coord.cmd.Process.Signal(syscall.SIGKILL)
	coord.wait(t, 10*time.Second)
	killed := time.Now()
	w.wait(t, 15*time.Second)
	if !strings.Contains(w.output(), "heartbeat stopped") {
		t.Errorf("worker output:\n%s", w.output())
	}
	t.Logf("the worker left %v after the coordinator was killed", time.Since(killed).Round(100*time.Millisecond))
}

// TestClusterDrain: Ctrl-C on the coordinator drains the whole cluster:
// exit 130, the report says interrupted, every edge balances over the
// workers.
func TestClusterDrain(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "r.json")
	coord := startDflow(t, nil, "run", "../../specs/seed.hcl", "--local-cluster", "2", "--var", "items=100000",
		"--interval", "200ms", "--report", out)
	coord.waitFor(t, "ETA", 60*time.Second)
	coord.cmd.Process.Signal(os.Interrupt)
	checkDrained(t, coord, out)
}

// checkDrained asserts a drained run: exit 130, the report interrupted,
// every edge balanced and not empty.
func checkDrained(t *testing.T, coord *proc, out string) {
	t.Helper()
	if code := coord.wait(t, 60*time.Second); code != exitInterrupted {
		t.Fatalf("code %d\n%s", code, coord.output())
	}
	rep := readReport(t, out)
	if rep.Status != report.Interrupted {
		t.Errorf("status %s: %s", rep.Status, rep.Error)
	}
	for name, e := range rep.Edges {
		if e.Produced != e.Consumed || e.Produced == 0 {
			t.Errorf("edge %s: produced %d, consumed %d", name, e.Produced, e.Consumed)
		}
	}
}

// TestPlacementAttribute: a stage's placement attribute in the spec pins
// its replicas as --place does (the flag, when given, wins).
func TestPlacementAttribute(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../../specs/seed.hcl")
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(t.TempDir(), "placed.hcl")
	placed := strings.Replace(string(src), "  replicas = 3\n", "  replicas  = 3\n  placement = [\"local2\"]\n", 1)
	if placed == string(src) {
		t.Fatal("the seed's drafter stage has changed: the test cannot place it")
	}
	os.WriteFile(spec, []byte(placed), 0o644)
	out := filepath.Join(t.TempDir(), "r.json")
	code, _, stderr := dflow(t, "run", spec, "--local-cluster", "2", "--report", out,
		"--set", "stage.target.config.service_time=5ms", "--set", "stage.drafter.config.service_time=2ms")
	if code != exitOK || !strings.Contains(stderr, "drafter local2,local2,local2") {
		t.Fatalf("code %d\n%s", code, stderr)
	}
	for _, r := range readReport(t, out).Stages["drafter"].Replicas {
		if r.Worker != "local2" {
			t.Errorf("drafter[%d] ran on %s", r.Index, r.Worker)
		}
	}
	if code, _, stderr := dflow(t, "validate", spec); code != exitOK {
		t.Errorf("validate: code %d\n%s", code, stderr)
	}
}

// TestDeadlockThroughPluginAcrossWorkers: the rotate-into-sync deadlock
// with its targets a plugin's stage, on --local-cluster 2: each worker
// runs the plugin for its replicas, and the coordinator names the cycle
// through them, each with its worker, and the fix; exit 1, not a hang.
func TestDeadlockThroughPluginAcrossWorkers(t *testing.T) {
	t.Parallel()
	bin, err := buildChecksum()
	if err != nil {
		t.Fatal(err)
	}
	spec := writeSpec(t, fmt.Sprintf("plugin \"checksum\" {\n  path = %q\n}\n", bin)+plugintest.DeadlockSpec("checksum/crc"))
	code, _, stderr := dflow(t, "run", spec, "--local-cluster", "2")
	if code != exitFailed {
		t.Fatalf("code %d, want %d\n%s", code, exitFailed, stderr)
	}
	for _, re := range []string{
		`deadlock: no replica can move`,
		`target\[2\] on local\d waits for input on tokens\[2\] \(empty\), fed by reader\[0\]`,
		`waits at stage drafter's group step for drafter\[2\] \(2 of 3 there\)`,
		`--set edge\.(hs|tokens)\.policy=shared`,
	} {
		if !regexp.MustCompile(re).MatchString(stderr) {
			t.Errorf("stderr does not match %s:\n%s", re, stderr)
		}
	}
}

// TestInterruptWhileWaiting: a Ctrl-C while the coordinator waits for
// --workers N (none come) ends it at once, exit 130, with nothing to
// drain or abort; not after the 30s wait, exit 1.
func TestInterruptWhileWaiting(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	coord := startDflow(t, nil, "run", "../../specs/seed.hcl", "--cluster", srv.URL, "--token", srv.Token, "--workers", "2")
	coord.waitFor(t, "dflow: running", 20*time.Second)
	coord.cmd.Process.Signal(os.Interrupt)
	// Within 20 s of the Ctrl-C, so before the 30 s wait for workers
	// ends, and with the interrupt's exit code, not the wait's.
	if code := coord.wait(t, 20*time.Second); code != exitInterrupted {
		t.Errorf("exit %d, want %d:\n%s", code, exitInterrupted, coord.output())
	}
	out := coord.output()
	if !strings.Contains(out, "interrupted while waiting for workers") || strings.Contains(out, "draining") ||
		strings.Contains(out, "aborting") || strings.Contains(out, "idle worker") {
		t.Errorf("output:\n%s", out)
	}
}

// TestJoinURLs: --serve on every interface (0.0.0.0, ::) tells the other
// hosts this host's addresses to join at, not loopback; a server bound to
// one address (loopback included) is joined there.
func TestJoinURLs(t *testing.T) {
	addrs := []net.Addr{
		&net.IPNet{IP: net.ParseIP("127.0.0.1"), Mask: net.CIDRMask(8, 32)},
		&net.IPNet{IP: net.ParseIP("::1"), Mask: net.CIDRMask(128, 128)},
		&net.IPNet{IP: net.ParseIP("2001:db8::5"), Mask: net.CIDRMask(64, 128)},
		&net.IPNet{IP: net.ParseIP("fe80::1"), Mask: net.CIDRMask(64, 128)},
		&net.IPNet{IP: net.ParseIP("10.0.0.5"), Mask: net.CIDRMask(24, 32)},
		&net.IPNet{IP: net.ParseIP("169.254.3.4"), Mask: net.CIDRMask(16, 32)},
	}
	host := "gpu-box"
	defer func(a func() ([]net.Addr, error), h func() (string, error)) { interfaceAddrs, hostname = a, h }(interfaceAddrs, hostname)
	interfaceAddrs = func() ([]net.Addr, error) { return addrs, nil }
	hostname = func() (string, error) { return host, nil }
	everywhere := []string{"nats://10.0.0.5:4222", "nats://[2001:db8::5]:4222", "nats://gpu-box:4222"}
	for _, c := range []struct {
		serve, url string
		want       []string
	}{
		{"0.0.0.0:4222", "nats://127.0.0.1:4222", everywhere},
		{"[::]:4222", "nats://127.0.0.1:4222", everywhere},
		{"0.0.0.0:0", "tls://127.0.0.1:38211", []string{"tls://10.0.0.5:38211", "tls://[2001:db8::5]:38211", "tls://gpu-box:38211"}},
		{"127.0.0.1:4222", "nats://127.0.0.1:4222", []string{"nats://127.0.0.1:4222"}},
		{":4222", "nats://127.0.0.1:4222", []string{"nats://127.0.0.1:4222"}},
		{"10.0.0.5:4222", "nats://10.0.0.5:4222", []string{"nats://10.0.0.5:4222"}},
	} {
		if got := joinURLs(c.serve, c.url); !slices.Equal(got, c.want) {
			t.Errorf("--serve %s: join at %q, want %q", c.serve, got, c.want)
		}
	}
	var out bytes.Buffer
	(&env{stderr: &out}).printJoin("0.0.0.0:4222", "nats://127.0.0.1:4222", "s3cret")
	if line := out.String(); !strings.Contains(line, "cluster server at nats://0.0.0.0:4222 (every interface of this host)") ||
		!strings.Contains(line, "DFLOW_CLUSTER_TOKEN=s3cret dflow worker --join nats://10.0.0.5:4222 (this host's other addresses: nats://[2001:db8::5]:4222, nats://gpu-box:4222)") ||
		strings.Contains(line, "127.0.0.1") {
		t.Errorf("the join line: %s", line)
	}
	// a token the user gave is not printed
	out.Reset()
	(&env{stderr: &out}).printJoin("0.0.0.0:4222", "nats://127.0.0.1:4222", "")
	if line := out.String(); !strings.Contains(line, "DFLOW_CLUSTER_TOKEN=<the token you gave> dflow worker --join") {
		t.Errorf("the join line of a given token: %s", line)
	}
	// a host with no address but loopback, and no name: loopback it is
	addrs, host = addrs[:2], ""
	if got := joinURLs("0.0.0.0:4222", "nats://127.0.0.1:4222"); !slices.Equal(got, []string{"nats://127.0.0.1:4222"}) {
		t.Errorf("loopback only: join at %q", got)
	}
}

// TestDataAddrFlag: dflow worker --data-addr says where the worker's
// data plane listens: large items' bytes reach the consumer's worker from
// there, and an address the worker cannot listen on fails its share,
// saying so.
func TestDataAddrFlag(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	spec := writeSpec(t, `
stage "src" {
  node = "synthetic_source"
  config {
    count      = 6
    size_bytes = 1048576
  }
}
stage "dst" {
  node = "sink"
}
edge "e" {
  from = src.out
  to   = dst.in
}
`)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ws := workers(t, srv.URL, srv.Token, 1, "--data-addr", addr)
	ws = append(ws, startDflow(t, []string{"DFLOW_CLUSTER_TOKEN=" + srv.Token}, "worker", "--join", srv.URL, "--name", "w2"))
	run := func() (int, string) {
		code, stdout, stderr := dflow(t, "run", spec, "--cluster", srv.URL, "--token", srv.Token, "--workers", "2", "--place", "src=w1", "--place", "dst=w2")
		return code, stdout + stderr // the summary, then what the run said
	}
	if code, stderr := run(); code != exitOK || !strings.Contains(stderr, "edge  e") {
		t.Fatalf("code %d\n%s\nw1:\n%s", code, stderr, ws[0].output())
	}
	for _, w := range ws {
		w.cmd.Process.Signal(os.Interrupt)
		w.wait(t, 10*time.Second)
	}
	// 192.0.2.1 (TEST-NET-1) is no address of this host: nothing can
	// listen there, and nothing is sent anywhere.
	workers(t, srv.URL, srv.Token, 1, "--data-addr", "192.0.2.1")
	startDflow(t, []string{"DFLOW_CLUSTER_TOKEN=" + srv.Token}, "worker", "--join", srv.URL, "--name", "w2")
	if code, stderr := run(); code != exitFailed || !strings.Contains(stderr, "data plane") || !strings.Contains(stderr, "192.0.2.1") {
		t.Errorf("an unusable --data-addr: code %d\n%s", code, stderr)
	}
}

// TestWorkerSilentWhileTaking: a worker that hangs as it takes its share
// (stopped, its announcements with it) fails the run once it has been
// silent for a lease, naming it: the coordinator waits for a share by
// the worker's announcements, which go on while it builds its nodes (a
// model's load may take minutes), not for a fixed time.
func TestWorkerSilentWhileTaking(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	w := startDflow(t, []string{"DFLOW_CLUSTER_TOKEN=" + srv.Token, "DFLOW_TEST_STOP_ON_JOB=1"}, "worker", "--join", srv.URL, "--name", "w1")
	w.waitFor(t, "waiting for a job", 20*time.Second)
	began := time.Now()
	coord := startDflow(t, nil, "run", "../../specs/seed.hcl", "--cluster", srv.URL, "--token", srv.Token, "--workers", "1",
		"--lease", "2s", "--var", "items=10", "--interval", "0")
	code := coord.wait(t, 60*time.Second)
	if took := time.Since(began); code != exitFailed || !strings.Contains(coord.output(), "worker w1 went silent for 2s while it took its share") || took > 25*time.Second {
		t.Errorf("code %d after %v\n%s", code, took.Round(time.Second), coord.output())
	}
}
