package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/dflash"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/nodes/text"
	"github.com/dflow-dev/dflow/plugins/host"
	"github.com/dflow-dev/dflow/report"
)

// Plugin is an implementation of the protocol under test: the executable
// dflow starts, and the node kinds of it that the cases run. Only Path
// and Pass are required; a case that needs a kind the plugin lacks is
// skipped.
type Plugin struct {
	// Path is the executable dflow starts (a spec's plugin block path).
	Path string
	// Marker is a string on the command line of every process of the
	// plugin (pgrep -f), for the cases that count them: Path by default;
	// the script a launcher runs, where the executable execs an
	// interpreter.
	Marker string
	// Pass is a kind with an input "in" and an output ("out", or
	// Pass.Out) that sends an item there for each item it receives.
	Pass Pass
	// Zip is a kind with inputs "a" and "b" and an output "out" that
	// takes an item from b, then one from a, in turn (an input that has
	// ended is passed over), sending each on out, until both end.
	Zip string
	// Fork is a kind with an int config attribute "count" and outputs
	// "a" and "b" of type blob, that sends count items on each, from two
	// threads at once (each item's Seq counting from 0 on its port, its
	// Data the port's name), so that a full edge on one holds back that
	// output alone.
	Fork string
	// Group is a group kind (protocol version 2) with an input "in" and
	// an output "out" of blobs, that takes its input in steps of one
	// item (its SDK's steps: Python's r.steps, Go's sdk.Steps) and sends
	// each item of a step on out; "" if it has none.
	Group string
	// Skip names cases not to run, with why (Run logs it).
	Skip map[string]string
}

// Pass describes the plugin's pass-through kind.
type Pass struct {
	// Kind is its name (KIND of PLUGIN/KIND).
	Kind string
	// Out is its output port, "out" by default.
	Out string
	// Count is how many items the Items case sends through it, 2000 by
	// default (fewer for a slow node).
	Count int
	// Config is HCL attributes every stage of it needs, "" for none.
	Config string
	// Source is the body of a stage that feeds it count items (node and
	// config), where it does not take synthetic_source's blobs; %d is
	// count. Items then are whatever it makes, and the cases that need
	// blobs of a size (Large) are skipped.
	Source string
	// Items is a counter metric it adds 1 to for each item, "" if none.
	Items string
	// Crash is an int config attribute that makes the process exit
	// abruptly after that many items, having written CrashLine on
	// stderr; "" if it has none.
	Crash, CrashLine string
	// Int is an int config attribute, for BadConfig to give a string;
	// Crash by default.
	Int string
	// Slow is a config attribute (HCL, "sleep = 1") that has its node
	// work about 1 s on each item outside any call of the protocol's
	// library; "" if none.
	Slow string
}

// The cases, by name (Plugin.Skip, go test -run 'Conformance/NAME').
var cases = []struct {
	name string
	run  func(*suite, *testing.T)
}{
	{"Items", (*suite).items},
	{"Large", (*suite).large},
	{"Interleaved", (*suite).interleaved},
	{"HeldBackApart", (*suite).heldBackApart},
	{"Deadlock", (*suite).deadlock},
	{"NoDeadlockWhileComputing", (*suite).computing},
	{"Ending", (*suite).ending},
	{"Crash", (*suite).crash},
	{"BadConfig", (*suite).badConfig},
	{"KilledDflow", (*suite).killedDflow},
	{"Group", (*suite).group},
}

// Run runs every case against the plugin, each a subtest of t. The test
// binary must call Main from its TestMain (KilledDflow runs it as a dflow
// that it kills).
func Run(t *testing.T, p Plugin) {
	if p.Marker == "" {
		p.Marker = p.Path
	}
	if p.Pass.Out == "" {
		p.Pass.Out = "out"
	}
	if p.Pass.Int == "" {
		p.Pass.Int = p.Pass.Crash
	}
	if p.Pass.Count == 0 {
		p.Pass.Count = 2000
	}
	abs, err := filepath.Abs(p.Path)
	if err != nil {
		t.Fatal(err)
	}
	p.Path = abs
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if why, ok := p.Skip[c.name]; ok {
				t.Skip(why)
			}
			c.run(&suite{p: p}, t)
		})
	}
}

// asDflowEnv, set, has Main run the binary as a dflow (KilledDflow): a
// JSON Plugin.
const asDflowEnv = "DFLOW_CONFORMANCE_AS_DFLOW"

// Main is the TestMain of a package that runs the suite: run as a dflow
// by KilledDflow, it runs a long pipeline through the plugin until it is
// killed; otherwise it runs the tests, and fails them if a goroutine they
// started outlives them (goleak; the host's thread that starts plugins
// lives as long as the process, by design).
func Main(m *testing.M) {
	if js := os.Getenv(asDflowEnv); js != "" {
		os.Exit(asDflow(js))
	}
	testutil.Main(m)
}

// asDflow runs 2 replicas of the plugin's Pass, fed an item a
// millisecond, for minutes.
func asDflow(js string) int {
	var p Plugin
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s := &suite{p: p}
	reg := registry()
	reg.Register(plugintest.Sink("conf_sink", graph.Any, func(any) error { return nil }))
	h := host.New(os.Stderr)
	defer h.Close()
	if _, err := h.Load("conf", p.Path, reg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(s.passSpec(1000000, 2, "service_time = \"1ms\"", "")))
	if diags.HasErrors() {
		fmt.Fprintln(os.Stderr, diags)
		return 1
	}
	if _, err := engine.Run(context.Background(), g, engine.Options{Registry: reg}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// suite is one case's dflow: a host with the plugin loaded as "conf".
type suite struct {
	p      Plugin
	h      *host.Host
	reg    *nodes.Registry
	stderr syncBuf
	mu     sync.Mutex
	got    []any // the items at the sink, in order
}

func registry() *nodes.Registry {
	reg := nodes.NewRegistry()
	synthetic.Register(reg)
	text.Register(reg)
	dflash.Register(reg)
	return reg
}

// load starts the plugin's catalog process; the host is closed, and
// every process checked gone, at the end of the test.
func (s *suite) load(t *testing.T) {
	t.Helper()
	s.reg = registry()
	s.reg.Register(plugintest.Sink("conf_sink", graph.Any, func(item any) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.got = append(s.got, item)
		return nil
	}))
	s.h = host.New(&s.stderr)
	t.Cleanup(func() {
		s.h.Close()
		s.noProcessesLeft(t)
	})
	if _, err := s.h.Load("conf", s.p.Path, s.reg); err != nil {
		t.Fatalf("the plugin does not start: %v", err)
	}
}

// noProcessesLeft fails t if a process of the plugin's outlives 10 s.
func (s *suite) noProcessesLeft(t *testing.T) {
	t.Helper()
	if !testutil.Within(10*time.Second, func() bool { return len(plugintest.Procs(s.p.Marker)) == 0 }) {
		t.Errorf("plugin processes left running after the host closed: %v", plugintest.Procs(s.p.Marker))
	}
}

// run runs src, failing t if it has not ended within limit.
func (s *suite) run(t *testing.T, src string, limit time.Duration, sets ...string) (*report.Report, error) {
	t.Helper()
	return s.runWith(t, engine.Options{}, src, limit, sets...)
}

// runWith is run with the engine's options opts (its Registry the
// suite's).
func (s *suite) runWith(t *testing.T, opts engine.Options, src string, limit time.Duration, sets ...string) (*report.Report, error) {
	t.Helper()
	g, diags := (&graph.Loader{Catalog: s.reg, Sets: sets}).Load("p.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatalf("%v\n%s", diags, src)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	opts.Registry = s.reg
	rep, err := engine.Run(ctx, g, opts)
	if ctx.Err() != nil {
		t.Fatalf("the run was still going after %v (err %v); the plugin's stderr:\n%s", limit, err, s.stderr.String())
	}
	return rep, err
}

// passSpec is count items from the source (srcConfig: more of its
// config) through replicas of Pass (config: more of its config) to the
// sink: stages src, p, sink; edges a and b.
func (s *suite) passSpec(count, replicas int, srcConfig, config string) string {
	src := fmt.Sprintf("node = \"synthetic_source\"\n  config {\n    count = %d\n    %s\n  }", count, srcConfig)
	if s.p.Pass.Source != "" {
		src = fmt.Sprintf(s.p.Pass.Source, count)
	}
	return fmt.Sprintf(`
stage "src" {
  %s
}
stage "p" {
  node     = "conf/%s"
  replicas = %d
  config {
    %s
    %s
  }
}
stage "sink" {
  node = "conf_sink"
}
edge "a" {
  from = src.out
  to   = p.in
}
edge "b" {
  from = p.%s
  to   = sink.in
}`, src, s.p.Pass.Kind, replicas, s.p.Pass.Config, config, s.p.Pass.Out)
}

// items: thousands of small items through two replicas, counts exact,
// each item once, the counter metric summed over the replicas.
func (s *suite) items(t *testing.T) {
	s.load(t)
	n := s.p.Pass.Count
	rep, err := s.run(t, s.passSpec(n, 2, "size_bytes = 10", ""), 2*time.Minute)
	if err != nil {
		t.Fatalf("%v\n%s", err, s.stderr.String())
	}
	if rep.Edges["a"].Consumed != int64(n) || rep.Edges["b"].Produced != int64(n) || len(s.got) != n {
		t.Errorf("counts: %d in, %d out, %d at the sink; want %d", rep.Edges["a"].Consumed, rep.Edges["b"].Produced, len(s.got), n)
	}
	if s.p.Pass.Source == "" {
		seen := map[string]bool{}
		for _, item := range s.got {
			if b, ok := item.(*items.Blob); ok {
				seen[fmt.Sprintf("%d/%d", b.Replica, b.Seq)] = true
			}
		}
		if len(seen) != n {
			t.Errorf("%d distinct blobs at the sink, want %d", len(seen), n)
		}
	}
	if m := s.p.Pass.Items; m != "" && rep.Stages["p"].Metrics[m] != float64(n) {
		t.Errorf("metric %s = %v, want %d", m, rep.Stages["p"].Metrics[m], n)
	}
}

// large: 16 MiB items, past gRPC's 4 MiB message limit, arrive whole:
// four in chunks of at most 1 MiB with shared memory off (dflow refuses
// a larger message), and a dozen by reference where the plugin maps the
// pools.
func (s *suite) large(t *testing.T) {
	if s.p.Pass.Source != "" {
		t.Skip("Pass does not take synthetic_source's blobs")
	}
	for _, shm := range []string{"off", "on"} {
		t.Run("shm="+shm, func(t *testing.T) {
			if shm == "off" {
				t.Setenv("DFLOW_PLUGIN_SHM", "off") // dflow then offers no pools: every item on the stream
			}
			s := &suite{p: s.p}
			s.load(t)
			n, size := 12, 16<<20
			if shm == "off" {
				n = 4 // each one 16 chunks
			}
			rep, err := s.run(t, s.passSpec(n, 1, fmt.Sprintf("size_bytes = %d", size), ""), 2*time.Minute)
			if err != nil {
				t.Fatalf("%v\n%s", err, s.stderr.String())
			}
			if rep.Edges["b"].Consumed != int64(n) || len(s.got) != n {
				t.Fatalf("got %d items, want %d", len(s.got), n)
			}
			for i, item := range s.got {
				if b, ok := item.(*items.Blob); !ok || len(b.Data) != size {
					t.Errorf("item %d arrived as %T of %d bytes, want a blob of %d", i, item, blobLen(item), size)
				}
			}
		})
	}
}

func blobLen(item any) int {
	if b, ok := item.(*items.Blob); ok {
		return len(b.Data)
	}
	return -1
}

// interleaved: a node that reads its two inputs in turn gets both,
// though dflow feeds each of a replica's inputs as it comes: a feed that
// drained one input before starting the next would leave the node
// waiting on the other, and the run hung.
func (s *suite) interleaved(t *testing.T) {
	if s.p.Zip == "" {
		t.Skip("the plugin has no Zip kind")
	}
	s.load(t)
	rep, err := s.run(t, fmt.Sprintf(`
stage "sa" {
  node = "synthetic_source"
  config {
    count = 300
  }
}
stage "sb" {
  node = "synthetic_source"
  config {
    count = 200
  }
}
stage "z" {
  node = "conf/%s"
}
stage "sink" {
  node = "conf_sink"
}
edge "a" {
  from = sa.out
  to   = z.a
}
edge "b" {
  from = sb.out
  to   = z.b
}
edge "out" {
  from = z.out
  to   = sink.in
}`, s.p.Zip), time.Minute)
	if err != nil {
		t.Fatalf("%v\n%s", err, s.stderr.String())
	}
	if rep.Edges["out"].Produced != 500 || len(s.got) != 500 {
		t.Errorf("%d items out, %d at the sink; want 500", rep.Edges["out"].Produced, len(s.got))
	}
}

// group: 7 items into three replicas of a group kind taking them in
// steps of one: the run ends (the members' uneven ends do not hang it),
// every item comes out once, and the steps' wait for data and compute
// are in the stage's metrics (the SDK's steps measure them).
func (s *suite) group(t *testing.T) {
	if s.p.Group == "" {
		t.Skip("the plugin has no Group kind")
	}
	s.load(t)
	if spec, ok := s.reg.Spec("conf/" + s.p.Group); !ok || spec.Sync == nil {
		t.Fatalf("kind %s is not registered as a group kind (Kind.group, protocol version 2)", s.p.Group)
	}
	rep, err := s.run(t, fmt.Sprintf(`
stage "src" {
  node = "synthetic_source"
  config {
    count      = 7
    size_bytes = 8
  }
}
stage "g" {
  node     = "conf/%s"
  replicas = 3
}
stage "sink" {
  node = "conf_sink"
}
edge "a" {
  from = src.out
  to   = g.in
}
edge "out" {
  from = g.out
  to   = sink.in
}`, s.p.Group), 2*time.Minute)
	if err != nil {
		t.Fatalf("%v\n%s", err, s.stderr.String())
	}
	seen := map[int64]bool{}
	for _, item := range s.got {
		if b, ok := item.(*items.Blob); ok {
			seen[b.Seq] = true
		}
	}
	if rep.Edges["out"].Produced != 7 || len(s.got) != 7 || len(seen) != 7 {
		t.Errorf("%d items out, %d at the sink, %d distinct; want 7 each", rep.Edges["out"].Produced, len(s.got), len(seen))
	}
	if _, ok := rep.Stages["g"].DataWaitShare(); !ok {
		t.Errorf("the steps' %s and %s are not in the stage's metrics %v", report.DataWait, report.Compute, rep.Stages["g"].Metrics)
	}
}

// heldBackApart: the node sends on two outputs from two threads, and the
// consumer reads every item of b before any of a, with a's edge far
// smaller than what the plugin sends on it. In process the full edge
// holds back only the Sends on a; through the plugin it must be the same
// (output credit): without, the items on a filled the edge and held the
// stream's reader, b's items waited behind them, and the run hung.
func (s *suite) heldBackApart(t *testing.T) {
	if s.p.Fork == "" {
		t.Skip("the plugin has no Fork kind")
	}
	s.load(t)
	const count = 300
	s.reg.Register(plugintest.BThenA(count))
	rep, err := s.run(t, plugintest.ForkSpec("conf/"+s.p.Fork, count), time.Minute)
	if err != nil {
		t.Fatalf("%v\n%s", err, s.stderr.String())
	}
	if rep.Edges["a"].Consumed != count || rep.Edges["b"].Consumed != count {
		t.Errorf("a %d, b %d items consumed, want %d each", rep.Edges["a"].Consumed, rep.Edges["b"].Consumed, count)
	}
}

// deadlock: the seed's deadlock with five replicas of Pass as its
// targets fails within the limit, naming the cycle through the plugin's
// replicas: the plugin says when its node waits (Waiting), and dflow's
// detector judges it. A plugin that never says it hangs here.
func (s *suite) deadlock(t *testing.T) {
	if s.p.Pass.Config != "" || s.p.Pass.Source != "" {
		t.Skip("the deadlock's pipeline feeds Pass synthetic_source's blobs, with no config")
	}
	s.load(t)
	src := plugintest.DeadlockSpec("conf/" + s.p.Pass.Kind)
	rep, err := s.run(t, src, time.Minute)
	var d *engine.Deadlock
	if !errors.As(err, &d) {
		t.Fatalf("err = %v, want a deadlock named\n%s", err, s.stderr.String())
	}
	msg := err.Error()
	if rep.Status != report.Failed || !strings.Contains(rep.Error, "deadlock") {
		t.Errorf("status %s, error %q", rep.Status, rep.Error)
	}
	for _, re := range []string{
		`\n    reader\[0\] waits to send on tokens\[[0134]\] \(full, 4 of 4\), read by target\[[0134]\]\n    target\[[0134]\] waits to send on hs\[[01]\] \(full, 4 of 4\), read by drafter\[[01]\]`,
		`target\[2\] waits for input on tokens\[2\] \(empty\), fed by reader\[0\]`,
		`waits at stage drafter's group step for drafter\[2\] \(2 of 3 there\)`,
		`--set edge\.(hs|tokens)\.policy=shared`,
	} {
		if !regexp.MustCompile(re).MatchString(msg) {
			t.Errorf("error does not match %s:\n%s", re, msg)
		}
	}
}

// computing: a node that works 1 s on each item, outside any protocol
// call, while everything else waits for it, is no deadlock, with the
// detector confirming in 100 ms (ten times less than an item takes):
// the plugin says Waiting only while its node waits in a call.
func (s *suite) computing(t *testing.T) {
	if s.p.Pass.Slow == "" {
		t.Skip("Pass has no Slow attribute")
	}
	s.load(t)
	rep, err := s.runWith(t, engine.Options{DeadlockConfirm: 100 * time.Millisecond}, s.passSpec(2, 1, "", s.p.Pass.Slow), time.Minute)
	if err != nil || rep.Status != report.OK || rep.Edges["b"].Consumed != 2 {
		t.Fatalf("status %s, err %v, %d items out; want 2, no deadlock\n%s", rep.Status, err, rep.Edges["b"].Consumed, s.stderr.String())
	}
}

// ending: each replica's process has ended by the time its replica has
// (only the catalog process, which validation uses, is left once the run
// is over), and the catalog's once the host closes. dflow ends a
// replica's process when the plugin has said Done (it need not exit by
// itself) or failed.
func (s *suite) ending(t *testing.T) {
	s.load(t)
	n := min(s.p.Pass.Count, 30)
	rep, err := s.run(t, s.passSpec(n, 3, "", ""), 2*time.Minute)
	if err != nil || rep.Edges["b"].Consumed != int64(n) {
		t.Fatalf("err %v, %d items out; want %d\n%s", err, rep.Edges["b"].Consumed, n, s.stderr.String())
	}
	if left := plugintest.Procs(s.p.Marker); len(left) != 1 {
		t.Errorf("after the run, %d plugin processes %v; want 1, the catalog's", len(left), left)
	}
}

// crash: a plugin process that exits mid-stream fails its stage with an
// error that names the stage and replica, the plugin and its path, and
// the plugin's last stderr lines, which are also forwarded prefixed with
// the stage and replica; no process is left (load checks it).
func (s *suite) crash(t *testing.T) {
	if s.p.Pass.Crash == "" {
		t.Skip("Pass has no Crash attribute")
	}
	s.load(t)
	_, err := s.run(t, s.passSpec(100, 1, "", ""), time.Minute, fmt.Sprintf("stage.p.config.%s=7", s.p.Pass.Crash))
	if err == nil {
		t.Fatal("a crashed plugin must fail the run")
	}
	for _, want := range []string{`stage "p" replica 0`, "plugin conf (" + s.p.Path + ")", "the plugin process failed", s.p.Pass.CrashLine} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if !strings.Contains(s.stderr.String(), "[p/0] "+s.p.Pass.CrashLine) {
		t.Errorf("stderr not forwarded with its prefix:\n%s", s.stderr.String())
	}
}

// badConfig: a value of the wrong type for a kind's config attribute is
// a validation error at that attribute, before anything runs.
func (s *suite) badConfig(t *testing.T) {
	if s.p.Pass.Int == "" {
		t.Skip("Pass has no int attribute (Int, Crash) to get wrong")
	}
	s.load(t)
	src := s.passSpec(10, 1, "", fmt.Sprintf("%s = \"many\"", s.p.Pass.Int))
	_, diags := (&graph.Loader{Catalog: s.reg}).Load("p.hcl", []byte(src))
	if !diags.HasErrors() || !strings.Contains(diags.Error(), s.p.Pass.Int) {
		t.Errorf("a string for int attribute %s: %v; want an error naming it", s.p.Pass.Int, diags)
	}
}

// killedDflow: SIGKILL of dflow, which can clean up nothing, leaves no
// plugin process behind, the catalog's nor the two replicas', whether
// the plugin is the process dflow started or the child of a wrapper
// script that does not exec it.
func (s *suite) killedDflow(t *testing.T) {
	for _, wrap := range []bool{false, true} {
		name := "exec"
		if wrap {
			name = "child"
		}
		t.Run(name, func(t *testing.T) {
			p := s.p
			if wrap {
				p.Path = filepath.Join(t.TempDir(), "dflow-plugin-conf")
				body := fmt.Sprintf("#!/bin/sh\n%q \"$@\"\n", s.p.Path) // no exec: a shell waits on the plugin
				if err := os.WriteFile(p.Path, []byte(body), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			js, _ := json.Marshal(p)
			dflow := exec.Command(os.Args[0], "-test.run=^$")
			dflow.Env = append(os.Environ(), asDflowEnv+"="+string(js))
			plugintest.KillDflow(t, dflow, s.p.Marker, 3)
			if wrap {
				if !testutil.Within(10*time.Second, func() bool { return len(plugintest.Procs(p.Path)) == 0 }) {
					t.Errorf("wrapper shells outlived the killed dflow: %v", plugintest.Procs(p.Path))
				}
			}
		})
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
