package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster"
	"github.com/dflow-dev/dflow/internal/engine"
)

// Cluster says where a run across hosts runs (docs/cluster.md): the
// workers of a NATS JetStream server (URL), Local worker processes on
// this machine around an embedded loopback server, or an embedded server
// listening at Serve for workers on other hosts. Exactly one of URL, Local
// and Serve is set. This process coordinates: it places the replicas,
// merges the workers' figures into one snapshot and one report, finds
// deadlocks across workers and restarts a lost worker's replicas.
type Cluster struct {
	// URL is the server of a cluster of one's own (nats:// or tls://,
	// comma-separated for several), whose workers were started with
	// `dflow worker --join URL`.
	URL string
	// Local starts an embedded server on loopback and that many worker
	// processes (WorkerCommand), named local1, local2, ...; they leave
	// when the run ends. The host's cores are shared: unless the
	// environment sets GOMAXPROCS, each worker, and this process while
	// the run goes, runs Go code on LocalProcs(Local) of them.
	Local int
	// Serve starts an embedded server listening on HOST:PORT (":4222" is
	// loopback only, "0.0.0.0:4222" every interface) for workers on other
	// hosts; OnServe learns its URL and token.
	Serve string
	// Workers, with URL or Serve, is how many idle workers to wait for
	// (up to 30s); 0 takes those that joined within 2s. Local waits for
	// its own.
	Workers int
	// Token is the cluster's token: the server's with URL, the embedded
	// server's with Serve and Local (made up when empty). Creds, with URL
	// only and instead of a token, is a NATS credentials file (a user's
	// JWT and seed) for a server in operator mode. CA is the PEM file of
	// a tls:// server's CA; TLSCert and TLSKey, with Serve, make the
	// embedded server speak TLS only.
	Token, Creds, CA, TLSCert, TLSKey string
	// Place puts a stage's replicas on the workers named, replica i on
	// Place[stage][i mod len]; the other stages spread evenly.
	Place map[string][]string
	// Lease is how long a worker may stay silent before it is counted
	// lost and its replicas restart elsewhere; 0 takes the spec's
	// pipeline lease, else 5s.
	Lease time.Duration

	// The workers load the graph from its HCL source, not from this
	// process's memory: Src (nil: the file the graph was loaded from,
	// graph.Graph.Filename, so a graph built in Go cannot run on a
	// cluster), with the variables, variable files and overrides it was
	// loaded with (graph.Loader's Vars, VarFiles and Sets).
	Src      []byte
	Vars     map[string]string
	VarFiles []string
	Sets     []string

	// WorkerCommand is what Local starts as each worker process, before
	// the arguments of `dflow worker` (worker --join URL --name localN
	// --once, and the folders the spec's plugins and path fields need);
	// the default is this program's own executable, which is right for
	// the dflow command and for a program that answers those arguments
	// with Worker (its workers then have its own kinds). Another Go
	// program names the dflow executable: []string{"dflow"} (found on
	// $PATH) or a path; those workers have dflow's kinds (the built-in
	// ones and plugins).
	WorkerCommand []string
	// Log gets the cluster's lines: where the local cluster's server
	// listens and its workers' pids, the local workers' own output, the
	// placement, each fault. Default os.Stderr.
	Log io.Writer
	// OnServe, when set, is called once Serve's embedded server listens,
	// with the URL this process reaches it at and the token a worker
	// joins with.
	OnServe func(url, token string)
}

// The environment of dflow's cluster commands: TokenEnv holds the token
// a worker joins with and CredsEnv a NATS credentials file (dflow worker
// and dflow run read them when no flag says); LocalWorkerEnv marks a
// worker that Cluster.Local started, which leaves the terminal's Ctrl-C
// to the coordinator (that drains its workers). Local workers get the
// embedded server's token in TokenEnv and none of the caller's
// credentials.
const (
	TokenEnv       = "DFLOW_CLUSTER_TOKEN"
	CredsEnv       = "DFLOW_CLUSTER_CREDS"
	LocalWorkerEnv = "DFLOW_LOCAL_WORKER"
)

func (c *Cluster) check() error {
	n := 0
	for _, set := range []bool{c.URL != "", c.Local != 0, c.Serve != ""} {
		if set {
			n++
		}
	}
	switch {
	case n != 1:
		return errors.New("a cluster run wants exactly one of Cluster.URL, Cluster.Local and Cluster.Serve")
	case c.Local < 0:
		return fmt.Errorf("Cluster.Local %d: wants a number of worker processes, at least 1", c.Local)
	case c.Creds != "" && c.URL == "":
		return errors.New("Cluster.Creds is for a server of your own (Cluster.URL); the embedded server of Serve and Local takes a token")
	case c.Creds != "" && c.Token != "":
		return errors.New("give Cluster.Token or Cluster.Creds, not both")
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("Cluster.TLSCert and Cluster.TLSKey go together")
	}
	return nil
}

// coordinate starts what c asks for (the embedded server, the local
// workers), connects and makes the coordinator, waiting for the workers
// until ctx ends. cleanup stops what it started, in reverse.
func coordinate(ctx context.Context, c *Cluster, g *graph.Graph, opts Options, moves engine.RebalanceFor) (co *cluster.Coordinator, cleanup func(), err error) {
	var stops []func()
	cleanup = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	if err := c.check(); err != nil {
		return nil, cleanup, err
	}
	log := c.Log
	if log == nil {
		log = os.Stderr
	}
	src := c.Src
	if src == nil {
		if g.Filename == "" {
			return nil, cleanup, errors.New("a cluster's workers load the graph from its HCL source: give Cluster.Src (a graph built in Go has none)")
		}
		if src, err = os.ReadFile(g.Filename); err != nil {
			return nil, cleanup, fmt.Errorf("a cluster's workers load the graph from its HCL source: %w (give Cluster.Src)", err)
		}
	}
	url, token := c.URL, c.Token
	embedded := c.Local > 0 || c.Serve != ""
	if embedded {
		srv, err := cluster.StartServer(cluster.ServerOptions{Addr: c.Serve, Token: token, TLSCert: c.TLSCert, TLSKey: c.TLSKey})
		if err != nil {
			return nil, cleanup, err
		}
		stops = append(stops, srv.Shutdown)
		url, token = srv.URL, srv.Token
		if c.Serve != "" && c.OnServe != nil {
			c.OnServe(url, token)
		}
	}
	// A local worker that exits before the run has started ends the wait
	// for workers at once, with its name (its output is above).
	joinCtx, joinFailed := context.WithCancelCause(ctx)
	defer joinFailed(nil)
	workers := c.Workers
	if c.Local > 0 {
		workers = c.Local
		if os.Getenv("GOMAXPROCS") == "" {
			was := runtime.GOMAXPROCS(LocalProcs(c.Local))
			stops = append(stops, func() { runtime.GOMAXPROCS(was) })
		}
		stop, err := startLocal(c, g, url, token, log, joinFailed)
		stops = append(stops, stop)
		if err != nil {
			return nil, cleanup, err
		}
	}
	conn := cluster.ConnOptions{URL: url, Token: token, Creds: c.Creds, CA: c.CA, Name: "dflow run " + g.Filename, Log: log}
	nc, err := cluster.Connect(conn)
	for try := 1; err != nil && embedded && try < 4; try++ {
		// The server this run started itself: a connection cut while it
		// was busy (a loaded host) is tried again, with the same options
		// (a TLS server's CA included).
		time.Sleep(time.Duration(try) * 200 * time.Millisecond)
		nc, err = cluster.Connect(conn)
	}
	if err != nil {
		if embedded {
			err = fmt.Errorf("the embedded server this run started: %w", err)
		}
		return nil, cleanup, err
	}
	stops = append(stops, nc.Close)
	if c.Local > 0 {
		stops = append(stops, func() { cluster.Dismiss(nc, localNames(c.Local)...) })
	}
	timings := cluster.Timings{Lease: c.Lease}
	if timings.Lease == 0 {
		timings.Lease = g.Lease
	}
	co, err = cluster.NewCoordinator(joinCtx, cluster.CoordOptions{
		Conn: nc, Graph: g, Workers: workers, Registry: opts.Registry,
		Job:      cluster.Job{Filename: g.Filename, Src: src, Vars: c.Vars, VarFiles: c.VarFiles, Sets: c.Sets},
		Interval: opts.Interval, Observe: opts.Observe, Drain: opts.Drain, Grace: opts.Grace, Log: log, Pin: c.Place,
		Timings: timings, Rebalance: moves,
	})
	if err != nil {
		if cause := context.Cause(joinCtx); cause != nil && joinCtx.Err() != nil && ctx.Err() == nil {
			err = cause
		}
		return nil, cleanup, err
	}
	return co, cleanup, nil
}

func localNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("local%d", i+1)
	}
	return names
}

// hostProcs is how many cores this process's Go code could use as it
// started (the runtime's default GOMAXPROCS: the host's, or its cgroup's
// limit).
var hostProcs = runtime.GOMAXPROCS(0)

// LocalProcs is how many cores each process of a cluster of n local
// workers runs Go code on (its GOMAXPROCS): the host's shared by the n
// workers and the process that coordinates them, at least one. Each Go
// process that may use every core keeps threads spinning for work and
// wakes one for each item that moves, and n+1 of them on a few cores spent
// more time handing the cores over than moving items (docs/performance.md,
// "Across hosts").
func LocalProcs(n int) int { return max(1, hostProcs/(n+1)) }

// startLocal starts the Local worker processes, joining url with token;
// a worker that exits calls exited with why. stop waits for them to
// leave (5s, then kills them).
func startLocal(c *Cluster, g *graph.Graph, url, token string, log io.Writer, exited func(error)) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	command := c.WorkerCommand
	if len(command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return stop, fmt.Errorf("the local workers run this executable: %w; set Cluster.WorkerCommand", err)
		}
		command = []string{exe}
	}
	env := localEnv(os.Environ(), token, c.Local)
	// They run on this host for this user, as a run in one process does:
	// they may start the spec's own plugins and touch the files its path
	// fields name (a standing worker allows only its own).
	localArgs := localWorkerArgs(g)
	var procs []string // "local1 (pid 4101)": what to kill to try a fault
	for i, name := range localNames(c.Local) {
		args := append(append(append([]string{}, command[1:]...), "worker", "--join", url, "--name", name, "--once"), localArgs...)
		cmd := exec.Command(command[0], args...)
		cmd.Env = env
		cmd.Stderr = log
		if err := cmd.Start(); err != nil {
			return stop, fmt.Errorf("starting local worker %d (%s): %v", i+1, command[0], err)
		}
		procs = append(procs, fmt.Sprintf("%s (pid %d)", name, cmd.Process.Pid))
		waited := make(chan struct{})
		go func() {
			err := cmd.Wait()
			exited(fmt.Errorf("local worker %s exited (%v) before the run started; its output is above", name, err))
			close(waited)
		}()
		stops = append(stops, func() {
			select {
			case <-waited:
			case <-time.After(5 * time.Second):
				cmd.Process.Kill() // ours, by pid
				<-waited
			}
		})
	}
	fmt.Fprintf(log, "dflow: local cluster: server at %s, %d worker processes: %s\n", url, c.Local, strings.Join(procs, ", "))
	return stop, nil
}

// localEnv is the environment of n local workers, from this process's
// (environ): they get the embedded server's token and nothing else of the
// cluster's environment (credentials are for a server of one's own),
// leave the terminal's Ctrl-C to the coordinator, which drains them
// (LocalWorkerEnv), and share the host's cores (LocalProcs) unless
// GOMAXPROCS says otherwise.
func localEnv(environ []string, token string, n int) []string {
	var env []string
	procs := true
	for _, kv := range environ {
		if !strings.HasPrefix(kv, TokenEnv+"=") && !strings.HasPrefix(kv, CredsEnv+"=") {
			env = append(env, kv)
		}
		procs = procs && (!strings.HasPrefix(kv, "GOMAXPROCS=") || kv == "GOMAXPROCS=")
	}
	env = append(env, TokenEnv+"="+token, LocalWorkerEnv+"=1")
	if procs {
		env = append(env, "GOMAXPROCS="+strconv.Itoa(LocalProcs(n)))
	}
	return env
}

// localWorkerArgs are the flags of a worker Local starts: the folder of
// each plugin the spec declares (--plugins) and the folders its path
// fields lead to (--write, --read).
func localWorkerArgs(g *graph.Graph) []string {
	var args []string
	seen := map[string]bool{}
	add := func(flag, dir string) {
		if !seen[flag+dir] {
			seen[flag+dir] = true
			args = append(args, flag, dir)
		}
	}
	for _, p := range g.Plugins {
		if p.Path != "" {
			add("--plugins", filepath.Dir(p.Path))
		}
	}
	write, read := cluster.SpecFolders(g)
	if wd, err := os.Getwd(); err == nil {
		add("--write", wd) // the default stays
	}
	for _, d := range write {
		add("--write", d)
	}
	for _, d := range read {
		add("--read", d)
	}
	return args
}
