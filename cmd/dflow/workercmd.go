package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/run"
)

// The cluster side of the CLI: dflow worker, and dflow run's --cluster,
// --local-cluster and --serve (docs/cluster.md).

const (
	tokenEnv = run.TokenEnv
	credsEnv = run.CredsEnv
	// localWorkerEnv marks a worker --local-cluster started: it shares
	// the coordinator's terminal, whose Ctrl-C is the coordinator's to
	// act on (a drain of every worker), so the worker does not leave on it.
	localWorkerEnv = run.LocalWorkerEnv
)

func cmdWorker(e *env, args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var o run.WorkerOptions
	fs.StringVar(&o.URL, "join", "", "the cluster's server, `URL` such as nats://10.0.0.5:4222 (the one dflow run --serve or --local-cluster prints, or a nats-server of your own with JetStream)")
	fs.StringVar(&o.Name, "name", "", "the worker's `NAME` in placements and reports: letters, digits, - and _ (default: this host's name and the process id, such as gpu1-4101)")
	fs.StringVar(&o.Token, "token", "", "the cluster's `TOKEN` (default $"+tokenEnv+")")
	fs.StringVar(&o.Creds, "creds", "", "a NATS credentials `FILE` (a user's JWT and seed), for a server of your own in operator mode, instead of a token (default $"+credsEnv+")")
	fs.StringVar(&o.CA, "tls-ca", "", "for a tls:// URL, the PEM `FILE` of the CA that signed the server's certificate")
	fs.BoolVar(&o.Once, "once", false, "leave after one run (dflow run --local-cluster starts its workers so)")
	fs.StringVar(&o.DataAddr, "data-addr", "", "where this worker's data plane listens, `HOST[:PORT]`: the other workers fetch large items' bytes there (default: this host's address on its route to the server, any free port)")
	folders := func(name, usage string, dirs *[]string) {
		fs.Func(name, usage, func(v string) error {
			*dirs = append(*dirs, v)
			return nil
		})
	}
	folders("plugins", "a `DIR` of plugins (executables dflow-plugin-NAME) this worker may start, before ./plugins and $DFLOW_PLUGIN_DIR; a job's plugin blocks are matched by name, never by their path (repeatable)", &o.PluginDirs)
	folders("write", "a `DIR` under which a job's nodes may write (and read) files: checkpoints, models (repeatable; default: the folder the worker runs in)", &o.Write)
	folders("read", "a `DIR` under which a job's nodes may read files, besides the --write folders, the folder the worker runs in and $GOROOT (repeatable)", &o.Read)
	pos, code, ok := parse(e, fs, args, "--join URL [--name NAME] [--token TOKEN | --creds FILE] [--data-addr HOST[:PORT]] [--plugins DIR] [--write DIR] [--read DIR]")
	if !ok {
		return code
	}
	if len(pos) != 0 {
		return usageErr(e, "worker", "takes no arguments, got %q", pos)
	}
	if o.URL == "" {
		return usageErr(e, "worker", "--join URL is required: the cluster's server")
	}
	if err := checkServerURL("--join", o.URL); err != nil {
		return usageErr(e, "worker", "%v", err)
	}
	// A folder that is not there: a typo would otherwise refuse every job.
	for _, f := range []struct {
		flag string
		dirs []string
	}{{"--plugins", o.PluginDirs}, {"--write", o.Write}, {"--read", o.Read}} {
		for _, d := range f.dirs {
			if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
				return usageErr(e, "worker", "%s %s: not a folder", f.flag, d)
			}
		}
	}
	o.Registry, o.Log = e.registry, e.stderr
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if e.signals != nil {
		local := os.Getenv(localWorkerEnv) == "1"
		go func() {
			for {
				select {
				case s := <-e.signals:
					if local && s == os.Interrupt {
						continue // the terminal's Ctrl-C: the coordinator drains us
					}
					cancel()
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	if err := run.Worker(ctx, o); err != nil {
		fmt.Fprintf(e.stderr, "dflow %v\n", err) // "dflow worker NAME: ..."
		return exitFailed
	}
	return exitOK
}

// serverSchemes are the URL schemes of a NATS server, as nats.go takes
// them.
var serverSchemes = []string{"nats", "tls", "ws", "wss"}

// checkServerURL checks the scheme of each of a flag's server URLs
// (nats.go takes a comma-separated list; HOST:PORT alone is nats://): a
// URL for a web server, http:// say, is a mistake worth naming before
// the connection fails with words about something else.
func checkServerURL(flagName, urls string) error {
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		scheme, rest, ok := strings.Cut(u, "://")
		if !ok || slices.Contains(serverSchemes, strings.ToLower(scheme)) {
			continue
		}
		want := "nats"
		if strings.EqualFold(scheme, "https") {
			want = "tls"
		}
		return fmt.Errorf("%s %q: %s:// is not the scheme of a NATS server; write %s://%s "+
			"(nats:// for a plain server, tls:// for one that speaks TLS, ws:// or wss:// through a websocket port)",
			flagName, u, scheme, want, rest)
	}
	return nil
}

// clusterFlags are dflow run's cluster flags.
type clusterFlags struct {
	url, token, creds, ca, serve, cert, key string
	local, workers                          int
	place                                   map[string][]string
	// localSet: --local-cluster was given (0 included)
	localSet bool
	// lease: --lease, over the spec's pipeline lease
	lease time.Duration
}

func (f *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "cluster", "", "run on the cluster whose server is at `URL` (nats:// or tls://): this process coordinates, the workers (dflow worker --join URL) run the replicas")
	fs.IntVar(&f.local, "local-cluster", 0, "try a cluster on this machine: an embedded server on loopback and `N` worker processes")
	fs.StringVar(&f.serve, "serve", "", "coordinate with an embedded server listening on `HOST:PORT` for workers on other hosts (:4222 is loopback only; 0.0.0.0:4222 exposes it); prints the URL and token to join")
	fs.IntVar(&f.workers, "workers", 0, "with --cluster or --serve, wait up to 30s for `N` idle workers (default: those that joined within 2s)")
	fs.StringVar(&f.creds, "creds", "", "with --cluster, a NATS credentials `FILE` (a user's JWT and seed) for a server of your own in operator mode, instead of a token (default $"+credsEnv+")")
	fs.StringVar(&f.token, "token", "", "the cluster's `TOKEN` (default $"+tokenEnv+"; --serve and --local-cluster make one up when none is given)")
	fs.DurationVar(&f.lease, "lease", 0, "on a cluster, how long a worker may stay silent before it is counted lost and its replicas restart elsewhere, a `DURATION` (default: the spec's pipeline lease, else 5s)")
	fs.Func("place", "on a cluster, put a stage's replicas on the workers named, `STAGE=W1,W2,...` (replica i on the i-th, round the list); the other stages spread evenly (repeatable)", func(v string) error {
		stage, ws, ok := strings.Cut(v, "=")
		if !ok || stage == "" || ws == "" {
			return errors.New("want STAGE=WORKER[,WORKER...], such as drafter=gpu1")
		}
		if f.place == nil {
			f.place = map[string][]string{}
		}
		f.place[stage] = strings.Split(ws, ",")
		return nil
	})
	fs.StringVar(&f.ca, "tls-ca", "", "for a tls:// server, the PEM `FILE` of its CA")
	fs.StringVar(&f.cert, "tls-cert", "", "with --serve, the embedded server's TLS certificate `FILE` (PEM); with --tls-key, the server speaks TLS only")
	fs.StringVar(&f.key, "tls-key", "", "with --serve, the TLS certificate's key `FILE` (PEM)")
}

func (f *clusterFlags) on() bool { return f.url != "" || f.local > 0 || f.serve != "" }

// visited records which of the flags were given, after fs is parsed.
func (f *clusterFlags) visited(fs *flag.FlagSet) {
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "local-cluster" {
			f.localSet = true
		}
	})
}

func (f *clusterFlags) check() error {
	n := 0
	for _, set := range []bool{f.url != "", f.local > 0, f.serve != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return errors.New("give one of --cluster, --local-cluster and --serve")
	case f.local < 0 || (f.localSet && f.local == 0):
		return fmt.Errorf("--local-cluster %d: wants a number of worker processes to start, at least 1 "+
			"(%d starts none; leave the flag out to run in this process)", f.local, f.local)
	case len(f.place) > 0 && n == 0:
		return errors.New("--place places replicas on a cluster's workers: give --cluster, --local-cluster or --serve")
	case (f.cert == "") != (f.key == ""):
		return errors.New("--tls-cert and --tls-key go together")
	case f.workers != 0 && f.url == "" && f.serve == "":
		return errors.New("--workers waits for workers of a cluster: give --cluster URL or --serve ADDR (--local-cluster N starts N)")
	case f.creds != "" && f.url == "":
		return errors.New("--creds is for a server of your own (--cluster URL); the embedded server of --serve and --local-cluster takes a token")
	case f.creds != "" && f.token != "":
		return errors.New("give --token or --creds, not both")
	}
	if f.url != "" {
		return checkServerURL("--cluster", f.url)
	}
	return nil
}

// cluster is the run.Cluster the flags ask for: the token or credentials
// from the environment when no flag gives them, the spec's overrides for
// the workers to load it with, the cluster's lines on stderr, and for
// --serve the line that tells how to join.
func (f *clusterFlags) cluster(e *env, sf *specFlags) *run.Cluster {
	token, creds := f.token, f.creds
	if token == "" && creds == "" { // the environment only when no flag says
		if f.url != "" {
			creds = os.Getenv(credsEnv)
		}
		if creds == "" {
			token = os.Getenv(tokenEnv)
		}
	}
	c := &run.Cluster{URL: f.url, Local: f.local, Serve: f.serve, Workers: f.workers,
		Token: token, Creds: creds, CA: f.ca, TLSCert: f.cert, TLSKey: f.key, Place: f.place, Lease: f.lease,
		Vars: sf.overrides().Vars, VarFiles: sf.varFiles, Sets: sf.sets, Log: e.stderr, WorkerCommand: e.workerCommand}
	if f.serve != "" {
		given := token != ""
		c.OnServe = func(url, token string) {
			if given {
				// the user's own: not printed where logs keep it (a pod's)
				token = ""
			}
			e.printJoin(f.serve, url, token)
		}
	}
	return c
}

// The host's addresses and name, for the join line of --serve; tests
// replace them.
var (
	interfaceAddrs = net.InterfaceAddrs
	hostname       = os.Hostname
)

// printJoin says where the embedded server of --serve ADDR listens and
// how a worker on another host joins it; token "" is one the user gave,
// named, not printed.
func (e *env) printJoin(serve, url, token string) {
	if token == "" {
		token = "<the token you gave>"
	}
	join := joinURLs(serve, url)
	at, others := url, ""
	if len(join) > 1 || join[0] != url {
		// every interface: the address it was given, with its port
		if u, err := neturl.Parse(url); err == nil {
			host, _, _ := net.SplitHostPort(serve)
			at = u.Scheme + "://" + net.JoinHostPort(host, u.Port()) + " (every interface of this host)"
		}
	}
	if len(join) > 1 {
		others = " (this host's other addresses: " + strings.Join(join[1:], ", ") + ")"
	}
	fmt.Fprintf(e.stderr, "dflow: cluster server at %s; on each host: %s=%s dflow worker --join %s%s\n", at, tokenEnv, token, join[0], others)
}

// joinURLs are the URLs at which other hosts reach the embedded server
// that listens on serve (--serve's HOST:PORT) and that this process
// reaches at url. A server bound to one address is reached there
// (loopback stays loopback: nothing beyond this machine can join). One
// bound to every interface (0.0.0.0 or ::, which Go binds for IPv4 and
// IPv6 alike) is reached at this host's addresses other than loopback
// and link-local, IPv4 first, then at its hostname; url when it has none.
func joinURLs(serve, url string) []string {
	host, _, err := net.SplitHostPort(serve)
	ip := net.ParseIP(host)
	if err != nil || ip == nil || !ip.IsUnspecified() {
		return []string{url}
	}
	u, err := neturl.Parse(url)
	if err != nil {
		return []string{url}
	}
	var v4, v6 []string
	addrs, _ := interfaceAddrs()
	for _, a := range addrs {
		var ip net.IP
		switch a := a.(type) {
		case *net.IPNet:
			ip = a.IP
		case *net.IPAddr:
			ip = a.IP
		}
		if ip == nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() {
			continue
		}
		join := u.Scheme + "://" + net.JoinHostPort(ip.String(), u.Port())
		if ip.To4() != nil {
			v4 = append(v4, join)
		} else {
			v6 = append(v6, join)
		}
	}
	join := append(v4, v6...)
	if name, err := hostname(); err == nil && name != "" && name != "localhost" {
		join = append(join, u.Scheme+"://"+net.JoinHostPort(name, u.Port()))
	}
	if len(join) == 0 {
		return []string{url}
	}
	return join
}
