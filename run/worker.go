package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/host"
)

// WorkerOptions say which cluster a worker joins and what it may run.
// URL is the only field a worker needs; the zero value of each other
// field is what `dflow worker` does without the flag of the same name.
type WorkerOptions struct {
	// URL is the cluster's server (nats:// or tls://, comma-separated
	// for several): the one `dflow run --serve` or --local-cluster
	// prints, or a nats-server of one's own with JetStream.
	URL string
	// Name is the worker's name in placements and reports: letters,
	// digits, - and _. Default: this host's name and the process id
	// (gpu1-4101).
	Name string
	// Token is the cluster's token; Creds instead a NATS credentials
	// file (a user's JWT and seed) for a server of one's own in operator
	// mode. Both empty: $DFLOW_CLUSTER_CREDS (CredsEnv), else
	// $DFLOW_CLUSTER_TOKEN (TokenEnv), which is how Cluster.Local hands
	// its workers the token. CA is the PEM file of a tls:// server's CA.
	Token, Creds, CA string
	// Registry has the node kinds the worker builds: a job's spec is
	// loaded with it, so it must have every kind the coordinator's has
	// (the workers of one cluster load the same spec). nodes.Default
	// when nil. The worker registers the kinds of the plugins it starts
	// in a copy, taken when Worker starts.
	Registry *nodes.Registry
	// PluginDirs are folders of plugins (executables dflow-plugin-NAME)
	// the worker may start, before ./plugins and $DFLOW_PLUGIN_DIR. A
	// job's plugin blocks are matched by name in these folders, never by
	// the path the spec gives.
	PluginDirs []string
	// Write are the folders under which a job's nodes may write (and
	// read) files: checkpoints, models; default the folder the worker
	// runs in. Read are folders they may only read, besides Write, the
	// folder the worker runs in and $GOROOT. A job whose path fields
	// lead elsewhere is refused before any of its replicas starts.
	Write, Read []string
	// DataAddr is where the worker's data plane listens, HOST[:PORT]:
	// the other workers fetch large items' bytes there. Default: this
	// host's address on its route to the server, any free port.
	DataAddr string
	// Once makes the worker leave after one job (Cluster.Local starts
	// its workers so), and when the coordinator that gave it is gone.
	Once bool
	// Log gets the worker's lines (joined, each job started and ended,
	// a connection cut) and its plugins' stderr. Default os.Stderr.
	Log io.Writer
}

// Worker joins the cluster at o.URL and runs the replicas that
// coordinators place on it (each job's share, and the restarts of a lost
// worker's replicas), as `dflow worker` does, until ctx is done (nil),
// the server is gone for good (an error, or nil with Once) or, with
// Once, its job has ended. The plugins it started are stopped when it
// returns. Its errors begin with "worker NAME:".
//
// A program that is its own local cluster's worker (Cluster.Local with
// WorkerCommand naming the program) calls Worker when started as `PROGRAM
// worker --join URL --name NAME --once [--plugins DIR] [--write DIR]
// [--read DIR]`.
func Worker(ctx context.Context, o WorkerOptions) error {
	if o.Name == "" {
		host, _ := os.Hostname()
		o.Name = defaultWorkerName(host)
	}
	if !nameChars.MatchString(o.Name) {
		return fmt.Errorf("worker name %q: use letters, digits, - and _", o.Name)
	}
	fail := func(err error) error { return fmt.Errorf("worker %s: %w", o.Name, err) }
	if o.URL == "" {
		return fail(errors.New("WorkerOptions.URL is empty: give the cluster's server, such as nats://10.0.0.5:4222"))
	}
	if o.Token == "" && o.Creds == "" { // the environment only when no option says
		if o.Creds = os.Getenv(CredsEnv); o.Creds == "" {
			o.Token = os.Getenv(TokenEnv)
		}
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	reg := nodes.Default
	if o.Registry != nil {
		reg = o.Registry
	}
	reg = reg.Clone()
	roots, dirs, err := workerRoots(o)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var serverGone atomic.Bool
	nc, err := cluster.Connect(cluster.ConnOptions{URL: o.URL, Token: o.Token, Creds: o.Creds, CA: o.CA, Name: "dflow worker " + o.Name,
		OnClosed: func() { serverGone.Store(true); cancel() }, Log: o.Log})
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	plugins := host.New(o.Log)
	defer plugins.Close()
	err = cluster.RunWorker(ctx, cluster.WorkerOptions{Name: o.Name, Conn: nc, Registry: reg, Log: o.Log, Once: o.Once, DataAddr: o.DataAddr,
		AfterSend: crashAfterSends(os.Getenv(crashEnv)),
		Roots:     &roots,
		Load: func(job *cluster.Job) (*graph.Graph, error) {
			if os.Getenv(stopEnv) != "" {
				stopSelf() // a test hook: stalled while it takes its share
			}
			l := &graph.Loader{Catalog: reg, Vars: job.Vars, VarFiles: job.VarFiles, Sets: job.Sets,
				Plugins:    plugins.LoaderHook(reg, dirs),
				FindPlugin: workerPlugin(dirs)}
			g, diags := l.Load(job.Filename, job.Src)
			if diags.HasErrors() {
				return nil, diags
			}
			return g, nil
		}})
	if err != nil {
		return fail(err)
	}
	if serverGone.Load() && ctx.Err() != nil {
		// The server went past reconnecting: an embedded one (dflow run
		// --serve, --local-cluster) goes with its coordinator.
		gone := fmt.Errorf("the cluster's server at %s went away; leaving", o.URL)
		if !o.Once {
			return fail(gone)
		}
		fmt.Fprintf(o.Log, "dflow worker %s: %v\n", o.Name, gone)
	}
	return nil
}

// workerPlugin is a worker's FindPlugin: the plugin a job's block names is
// the executable dflow-plugin-NAME in the worker's own plugin folders,
// whatever path the block gives.
func workerPlugin(dirs []string) func(p *graph.Plugin) (string, error) {
	return func(p *graph.Plugin) (string, error) {
		if path, ok := host.Find(p.Name, dirs); ok {
			return path, nil
		}
		return "", fmt.Errorf("this worker has no plugin %q: no executable %s%s in its plugin folders %s "+
			"(a worker starts only plugins of its own folders, found by name, never the spec's path %q; "+
			"put the plugin there, or start the worker with --plugins DIR)",
			p.Name, host.Prefix, p.Name, strings.Join(dirs, ", "), p.Written)
	}
}

// workerRoots are a worker's plugin folders (PluginDirs, then ./plugins
// and $DFLOW_PLUGIN_DIR), made absolute, and the folders a job may write
// (Write, else the working folder) and read (Read, the working folder
// and $GOROOT, besides the write folders). A folder given that is not
// there is an error: a typo would otherwise refuse every job.
func workerRoots(o WorkerOptions) (cluster.Roots, []string, error) {
	for i, ds := range [][]string{o.PluginDirs, o.Write, o.Read} {
		for _, d := range ds {
			if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
				return cluster.Roots{}, nil, fmt.Errorf("WorkerOptions.%s: %s is not a folder", []string{"PluginDirs", "Write", "Read"}[i], d)
			}
		}
	}
	var dirs []string
	for _, d := range append(slices.Clone(o.PluginDirs), host.Dirs()...) {
		if a, err := filepath.Abs(d); err == nil {
			d = a
		}
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	roots := cluster.DefaultRoots()
	if len(o.Write) > 0 {
		roots.Read = append(roots.Read, roots.Write...) // the working folder stays readable
		roots.Write = slices.Clone(o.Write)
	}
	roots.Read = append(roots.Read, o.Read...)
	return roots, dirs, nil
}

// crashEnv is a test hook: a worker started with it set to STAGE:N kills
// itself (SIGKILL) right after the N-th item the replicas of that
// restartable stage send there, before the item it came from is
// committed (cmd/dflow's TestCrashAfterSend).
const crashEnv = "DFLOW_TEST_CRASH_AFTER_SENDS"

// stopEnv is a test hook: a worker started with it set stops itself
// (SIGSTOP) as a job comes, before it has taken its share: silent, as a
// host that hangs (cmd/dflow's TestWorkerSilentWhileTaking).
const stopEnv = "DFLOW_TEST_STOP_ON_JOB"

func crashAfterSends(v string) func(stage string) {
	stage, count, _ := strings.Cut(v, ":")
	n, err := strconv.ParseInt(count, 10, 64)
	if err != nil || n <= 0 {
		return nil
	}
	var sent atomic.Int64
	return func(s string) {
		if s == stage && sent.Add(1) == n {
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				p.Kill() // SIGKILL: nothing after it runs
			}
		}
	}
}

var (
	nameChars    = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	notNameChars = regexp.MustCompile(`[^A-Za-z0-9_-]`)
)

// defaultWorkerName is the name of a worker given none, on the host
// named host: the host's name, in the letters a name allows, and this
// process's id (gpu1-4101).
func defaultWorkerName(host string) string {
	if host == "" {
		host = "worker"
	}
	return notNameChars.ReplaceAllString(host, "-") + "-" + strconv.Itoa(os.Getpid())
}
