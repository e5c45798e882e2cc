package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/proto"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// Prefix names plugin executables found by discovery: dflow-plugin-NAME.
const Prefix = "dflow-plugin-"

// DefaultStartTimeout bounds how long a plugin may take to start, unless
// Host.StartTimeout says otherwise: long enough for a Python plugin that
// imports PyTorch on a loaded host (its import alone took over 10s on two
// shared cores, and takes longer with CUDA).
const DefaultStartTimeout = 60 * time.Second

// Host owns the plugin processes dflow started. Close kills them all.
type Host struct {
	Stderr io.Writer // plugin stderr is forwarded here, prefixed
	// PoolBytes is the size of each of the two shared-memory pools a
	// replica of a plugin that takes them gets (0: 256 MiB): what its items
	// by reference may occupy at most, each way (docs/plugin-protocol.md, Shared
	// memory). Set it before the run.
	PoolBytes int64
	// StartTimeout bounds how long a plugin may take to start, and each
	// of its answers about its kinds (Describe, Check); 0:
	// DefaultStartTimeout. Set it before the first Load.
	StartTimeout time.Duration
	// GroupPlace, when set, says where a replica of a group kind runs as
	// its torch.distributed rank sees it: rank 0's address and port, its
	// rank among the group's members on its host, and their devices
	// (Place). A cluster sets it, since there the members sit on several
	// hosts and MASTER_ADDR is rank 0's host as the others reach it. nil:
	// the whole group runs in this process's host: MASTER_ADDR 127.0.0.1,
	// a free port chosen for each run of the stage, local rank = rank.
	GroupPlace func(r nodes.Replica) (Place, error)
	mu         sync.Mutex
	procs      map[*plugin.Client]*proc // the processes running, by their go-plugin client
	loaded     map[string]string        // plugin name -> path
	sockets    string                   // the folder of the plugins' socket folders (sockets.go), once made
	tempDir    string                   // where that folder goes, for tests ("": the system's)
	logger     hclog.Logger             // go-plugin's, for tests (nil: none)
}

// New returns a host forwarding plugin stderr to w.
func New(w io.Writer) *Host {
	return &Host{Stderr: w, procs: map[*plugin.Client]*proc{}, loaded: map[string]string{}}
}

func (h *Host) startTimeout() time.Duration {
	if h.StartTimeout > 0 {
		return h.StartTimeout
	}
	return DefaultStartTimeout
}

func (h *Host) poolBytes() int64 {
	if h.PoolBytes > 0 {
		return h.PoolBytes
	}
	return wire.DefaultPoolBytes
}

// SetStderr changes where plugin stderr is forwarded from now on.
func (h *Host) SetStderr(w io.Writer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Stderr = w
}

// log is where plugin stderr is forwarded now (nil: nowhere).
func (h *Host) log() io.Writer {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.Stderr == nil {
		return io.Discard
	}
	return h.Stderr
}

// Close kills every plugin process still running, and removes the
// folder of their sockets.
func (h *Host) Close() {
	h.mu.Lock()
	procs := h.procs
	h.procs = map[*plugin.Client]*proc{}
	dir := h.sockets
	h.sockets = ""
	h.mu.Unlock()
	for c, p := range procs {
		end(c, p)
	}
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// Dirs are where discovery looks: ./plugins, then $DFLOW_PLUGIN_DIR.
func Dirs() []string {
	dirs := []string{"plugins"}
	if d := os.Getenv("DFLOW_PLUGIN_DIR"); d != "" {
		dirs = append(dirs, filepath.SplitList(d)...)
	}
	return dirs
}

// Find returns the path of plugin NAME in the discovery dirs.
func Find(name string, dirs []string) (string, bool) {
	for _, d := range dirs {
		p := filepath.Join(d, Prefix+name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// Discover lists the plugins in dirs by name.
func Discover(dirs []string) map[string]string {
	found := map[string]string{}
	for i := len(dirs) - 1; i >= 0; i-- { // earlier dirs win
		entries, _ := os.ReadDir(dirs[i])
		for _, e := range entries {
			if name, ok := strings.CutPrefix(e.Name(), Prefix); ok && name != "" {
				if p, ok := Find(name, dirs[i:i+1]); ok {
					found[name] = p
				}
			}
		}
	}
	return found
}

// ringWriter keeps the last lines written to it and forwards each line,
// prefixed, to w.
type ringWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	lines  []string
	part   []byte
}

const keepLines = 10

func (r *ringWriter) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.part = append(r.part, p...)
	for {
		i := bytes.IndexByte(r.part, '\n')
		if i < 0 {
			break
		}
		line := string(r.part[:i])
		r.part = r.part[i+1:]
		r.lines = append(r.lines, line)
		if len(r.lines) > keepLines {
			r.lines = r.lines[1:]
		}
		if r.w != nil {
			fmt.Fprintf(r.w, "%s%s\n", r.prefix, line)
		}
	}
	return len(p), nil
}

// empty reports whether the process has written nothing to stderr.
func (r *ringWriter) empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lines) == 0 && len(r.part) == 0
}

func (r *ringWriter) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	lines := append([]string(nil), r.lines...)
	if len(r.part) > 0 {
		lines = append(lines, string(r.part))
	}
	if len(lines) == 0 {
		return "(no stderr output)"
	}
	return "last stderr lines:\n    " + strings.Join(lines, "\n    ")
}

// process is one started plugin process.
type process struct {
	version int // the protocol version the plugin answered (wire.ProtocolVersion or 1)
	client  *plugin.Client
	node    proto.NodeClient
	stderr  *ringWriter
	timeout time.Duration // the host's start timeout, for its answers
}

// start launches a plugin process and connects to it; env is added to
// its environment.
func (h *Host) start(path, prefix string, env ...string) (*process, error) {
	h.mu.Lock()
	stderr := &ringWriter{w: h.Stderr, prefix: prefix}
	sockets := h.socketDir()
	logger := h.logger
	h.mu.Unlock()
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	var pr *proc
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  wire.Handshake,
		Plugins:          wire.PluginMap(nil),
		VersionedPlugins: wire.Versions(nil),
		RunnerFunc:       newProc(path, &pr, env), // its own process group, Pdeathsig, a lifeline: see proc
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: sockets},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		GRPCDialOptions:  wire.DialOptions(),
		Stderr:           stderr, // before the plugin serves: start-up failures
		SyncStderr:       stderr, // what the plugin writes to os.Stderr while serving
		StartTimeout:     h.startTimeout(),
		Logger:           logger,
	})
	fail := func(err error) (*process, error) {
		h.kill(client)
		return nil, fmt.Errorf("plugin %s: %w; %s", path, err, stderr.last())
	}
	rpc, err := client.Client() // starts the process (newProc sets pr)
	h.mu.Lock()
	h.procs[client] = pr
	h.mu.Unlock()
	if err != nil {
		if strings.Contains(err.Error(), "Failed to read any lines from plugin's stdout") {
			// go-plugin's words for a plugin that ended (or closed its
			// stdout) before its handshake line: what it said on
			// stderr, which follows, is why.
			err = errors.New("the plugin ended before its handshake (it wrote nothing on stdout)")
		}
		return fail(err)
	}
	raw, err := rpc.Dispense(wire.PluginName)
	if err != nil {
		return fail(err)
	}
	node, ok := raw.(proto.NodeClient)
	if !ok {
		return fail(fmt.Errorf("dispensed %T, not a node client", raw))
	}
	return &process{version: client.NegotiatedVersion(), client: client, node: node, stderr: stderr, timeout: h.startTimeout()}, nil
}

// kill ends a plugin process (end) and forgets it.
func (h *Host) kill(c *plugin.Client) {
	h.mu.Lock()
	p := h.procs[c]
	delete(h.procs, c)
	h.mu.Unlock()
	end(c, p)
}

// end ends a plugin process at once: dflow owes it nothing more (a
// replica's after its Done or its failure, the catalog's at Close). It
// kills the process group first, then has go-plugin close the
// connection, wait for the process and the copy of its stderr, and
// remove its socket folder. go-plugin alone would ask the plugin to shut
// down (GRPCController.Shutdown) and wait 2 s for it to exit before
// killing it, which a plugin that does not serve that call (one written
// from the protocol alone) paid at every replica's end.
func end(c *plugin.Client, p *proc) {
	if p != nil {
		p.Kill(context.Background())
	}
	c.Kill()
}

// KindInfo is a plugin's kind as `dflow plugins` lists it.
type KindInfo struct {
	Name   string // PLUGIN/KIND
	Doc    string
	Config []graph.Field
	Ports  []graph.PortSpec // for the default config
	// Group: the kind's replicas step together (a group kind, protocol
	// version 2): each a rank with torchrun's environment, its stage a
	// replica group.
	Group bool
	// Restores: the group saves and restores its state, so that on a
	// cluster it restarts whole after a lost member (Kind.restores).
	Restores bool
}

// Load starts plugin name at path, asks it for its node kinds and
// registers them in reg as NAME/KIND. The catalog process stays up for
// validation (ports and config checks) until Close.
func (h *Host) Load(name, path string, reg *nodes.Registry) ([]KindInfo, error) {
	h.mu.Lock()
	if prev, ok := h.loaded[name]; ok {
		h.mu.Unlock()
		if prev != path {
			return nil, fmt.Errorf("plugin %q is already loaded from %s", name, prev)
		}
		return nil, nil
	}
	h.loaded[name] = path
	h.mu.Unlock()
	p, err := h.start(path, fmt.Sprintf("[plugin %s] ", name))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	desc, err := p.node.Describe(ctx, &proto.DescribeRequest{})
	if err != nil {
		return nil, fmt.Errorf("plugin %s (%s): describe: %v; %s", name, path, err, p.stderr.last())
	}
	var infos []KindInfo
	for _, k := range desc.Kinds {
		fields, err := wire.FieldsFromProto(k.Config)
		if err != nil {
			return nil, fmt.Errorf("plugin %s (%s): kind %q: %v", name, path, k.Name, err)
		}
		if k.Group && p.version < 2 {
			return nil, fmt.Errorf("plugin %s (%s): kind %q says its replicas step together (group), which needs protocol version 2; the plugin answered version %d in its handshake",
				name, path, k.Name, p.version)
		}
		rk := &remoteKind{host: h, catalog: p, plugin: name, path: path, kind: k.Name, fields: fields, batches: desc.Batches, portCredit: desc.PortCredit, outputCredit: desc.OutputCredit, sharedMemory: desc.SharedMemory, times: desc.Times,
			waiting: desc.Waiting && desc.PortCredit && desc.OutputCredit, group: k.Group, restores: k.Group && k.Restores, ports: map[string]*proto.CheckResponse{}}
		full := name + "/" + k.Name
		spec := nodes.Spec{
			Kind: graph.Kind{Name: full, Doc: k.Doc, Config: fields, Ports: rk.portsFor, Check: rk.check},
			New:  rk.newNode,
		}
		if k.Group {
			spec.Sync = nodes.Always // a step a collective, as a built-in group kind's
		}
		if rk.restores {
			// its group restarts whole from its last save (group.go)
			spec.Moves, spec.Whole = true, true
			spec.Restores = true // a stage of it may set restarts (restart.go)
		}
		reg.Register(spec)
		infos = append(infos, KindInfo{Name: full, Doc: k.Doc, Config: fields, Ports: rk.portsFor(defaults(fields)), Group: k.Group, Restores: rk.restores})
	}
	return infos, nil
}

func defaults(fields []graph.Field) *graph.Config {
	cfg, _ := wire.ConfigFromJSON("{}", fields)
	return cfg
}

// remoteKind is one plugin kind, as the registry sees it.
type remoteKind struct {
	host         *Host
	catalog      *process
	plugin, path string
	kind         string
	fields       []graph.Field
	batches      bool // the plugin takes Batch messages
	portCredit   bool // the plugin grants credit per input port
	outputCredit bool // the plugin sends on an output port as dflow's credit allows
	sharedMemory bool // the plugin maps shared memory pools and sends items by reference
	times        bool // the plugin says where its replicas' time goes (Times; times.go)
	// waiting: the plugin says when its node waits (Waiting), so that its
	// stages are quiescent to the deadlock detector (quiet.go); only with
	// credit per input and output port, which the argument rests on
	waiting bool
	group   bool // the kind's replicas step together (group.go)
	// restores: the group saves and restores its state, and restarts
	// whole (group.go)
	restores bool
	mu       sync.Mutex
	ports    map[string]*proto.CheckResponse // by config JSON
}

// checkConfig asks the catalog process about a config, once per config.
func (k *remoteKind) checkConfig(cfg *graph.Config) (*proto.CheckResponse, error) {
	js := wire.ConfigJSON(cfg)
	k.mu.Lock()
	defer k.mu.Unlock()
	if r, ok := k.ports[js]; ok {
		return r, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.catalog.timeout)
	defer cancel()
	r, err := k.catalog.node.Check(ctx, &proto.CheckRequest{Kind: k.kind, ConfigJson: js})
	if err != nil {
		return nil, fmt.Errorf("plugin %s (%s): check: %v; %s", k.plugin, k.path, err, k.catalog.stderr.last())
	}
	k.ports[js] = r
	return r, nil
}

func (k *remoteKind) portsFor(cfg *graph.Config) []graph.PortSpec {
	r, err := k.checkConfig(cfg)
	if err != nil {
		return nil
	}
	return wire.PortsFromProto(r.Ports)
}

func (k *remoteKind) check(cfg *graph.Config) []error {
	r, err := k.checkConfig(cfg)
	if err != nil {
		return []error{err}
	}
	var errs []error
	// A port type means one wire encoding (graph.WireTypes): a type
	// without one would say nothing about the items a plugin gets.
	for _, p := range wire.PortsFromProto(r.Ports) {
		if _, ok := graph.LookupWireType(p.Type); !ok && p.Type != graph.Any && p.SameAs == "" {
			errs = append(errs, fmt.Errorf("plugin %s (%s): kind %s: port %q has type %q, which no wire encoding carries: a plugin's ports are of type %s or %s",
				k.plugin, k.path, k.kind, p.Name, p.Type, graph.WireTypeNames(), graph.Any))
		}
	}
	for _, e := range r.Errors {
		if e.Field != "" {
			errs = append(errs, &graph.FieldError{Field: e.Field, Err: errors.New(e.Message)})
		} else {
			errs = append(errs, errors.New(e.Message))
		}
	}
	return errs
}

func (k *remoteKind) newNode(cfg *graph.Config) (nodes.Node, error) {
	return &remoteNode{k: k, config: wire.ConfigJSON(cfg), quiet: map[int]*quiet{}}, nil
}
