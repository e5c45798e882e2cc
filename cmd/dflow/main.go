package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/dflow-dev/dflow/nodes"
	_ "github.com/dflow-dev/dflow/nodes/dflash"    // target_forward, drafter_train
	_ "github.com/dflow-dev/dflow/nodes/lm"        // lm_train
	_ "github.com/dflow-dev/dflow/nodes/synthetic" // built-in synthetic nodes
	_ "github.com/dflow-dev/dflow/nodes/text"      // text_reader
	"github.com/dflow-dev/dflow/plugins/host"
)

// Exit codes, as the README and every command's help state them.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

type command struct {
	name, args, summary string
	// doc says in words what the command does, for its --help.
	doc string
	run func(env *env, args []string) int
}

// env is what a command sees: streams and the node catalog. Tests build
// their own.
type env struct {
	stdout, stderr io.Writer
	registry       *nodes.Registry
	// signals, when set, delivers interrupts (run's drain); nil in tests
	// that do not need it.
	signals <-chan os.Signal
	// plugins owns the plugin processes; created on first use.
	plugins *host.Host
	// workerCommand is what --local-cluster starts as each worker; nil:
	// this executable (tests give a dflow built without -race).
	workerCommand []string
}

var commands []command

func init() {
	commands = []command{
		{"validate", "SPEC... [--json] [--var k=v] [--var-file F] [--set P=V]", "check specs and report every problem",
			"Loads each spec, with the overrides given, and reports every problem it finds, each with FILE:LINE:COL and a snippet, then how many specs are valid. Nothing runs. Exit 0 when every spec is valid (warnings allowed), 1 otherwise (a --var or --set that does not fit the spec is one of its problems here; the commands that run a spec call that a usage error, 2), 2 on a usage error.",
			cmdValidate},
		{"graph", "SPEC [--format text|dot|mermaid]", "draw the graph with replicas, policies and types",
			"Prints the graph of a valid spec: stages with their replicas, node kinds and ports, edges with their policy, capacity and types, and the queues each edge is made of (which producer replicas feed which consumers).",
			cmdGraph},
		{"fmt", "SPEC... [--check]", "rewrite specs in canonical HCL format",
			"Rewrites each spec in canonical HCL layout (aligned =, two-space indent). With --check nothing is changed: the files that would change are listed and the exit code is 1 if there are any.",
			cmdFmt},
		{"run", "SPEC [--report FILE] [--interval D] [--rebalance] [--metrics-addr ADDR] [--ui ADDR] [--plot FILE.png] [--cluster URL | --local-cluster N | --serve ADDR] [--var k=v] [--set P=V]", "run the pipeline; first Ctrl-C drains, second aborts",
			"Runs the pipeline until every stage has finished. Every --interval a status line on stderr shows each queue's depth and each replica's busy share; at the end a summary and a diagnosis of what limited the run are printed on stdout (the other lines, which files were written, and errors go to stderr, so that 'dflow run SPEC > summary.txt' keeps the result), and the report and the plot are written where asked (their paths are checked before the run starts). --ui serves a live page of the run in the browser, up a few seconds after it ends. The first Ctrl-C drains: sources stop and the items in flight are finished (status interrupted). A second Ctrl-C aborts at once (status aborted). --cluster URL runs it on a cluster's workers (dflow worker), --local-cluster N on N worker processes of this machine, --serve ADDR with an embedded server for workers on other hosts (docs/cluster.md). Exit 0 ok, 1 failed (a deadlock included) or an invalid spec, 2 a usage error, 130 interrupted or aborted (a drain that cannot complete included).",
			cmdRun},
		{"worker", "--join URL [--name NAME] [--token TOKEN]", "join a cluster and run the replicas a coordinator places here",
			"Joins the cluster whose server is at URL and runs the share of each run that a coordinator (dflow run SPEC --cluster URL) places on this worker: its replicas, with edges to other hosts over NATS JetStream. The token is --token or $DFLOW_CLUSTER_TOKEN; a worker without the right one is refused. A run's share is aborted when the coordinator's heartbeat stops. Ctrl-C leaves. Exit 0 when it leaves, 1 when it cannot join. docs/cluster.md has the details.",
			cmdWorker},
		{"sim", "SPEC [--from REPORT] [--split A,B=N | --rebalance] [--report FILE] [--set P=V]", "simulate the spec in virtual time; same report as run",
			"Simulates the pipeline in virtual time, in milliseconds, from the sim blocks' service times or those a real run measured (--from), and prints the same summary and diagnosis as run, on stdout (status lines on stderr), and writes the same report. With --from, the spec is loaded with the overrides the measured run had (its --var, --var-file and --set, as its report records them), and this command's on top of them. --split ranks every split of N replicas between two stages. A spec's rebalance block (or --rebalance, for a spec without one: the stages that carry the work) is simulated as a run would move its replicas, and the report lists the moves; --rebalance=false keeps the spec's split.",
			cmdSim},
		{"compare", "SPEC (--edge NAME [--policies round_robin,shared] | --rebalance) [--sim] [--json] [--plot FILE.png]", "run or simulate once per policy, or a static split beside a rebalance, and print one table",
			"Runs (or with --sim simulates) the spec once per policy of one edge and prints one table: throughput, wall time, speedup against the first policy, the consumer's busy shares and the edge's queue depths. With --rebalance instead, it runs the spec's static split, the simulator's best static split of the budget (for two stages, when it is another) and the split that moves as the rebalance decides (the spec's rebalance block, or the stages that carry the work), and prints a row each: throughput, wall time, speedup against the static split, and the moves made. --plot draws the throughput as labelled bars.",
			cmdCompare},
		{"eval", "DRAFTER.safetensors [--target M] [--corpus PATH]", "acceptance length of a saved drafter against its target, next to an n-gram drafter",
			"Measures a saved drafter by speculative decoding on held-out text against its target, next to an order-3 n-gram drafter.",
			cmdEval},
		{"plugins", "[DIR]", "list the plugins found (./plugins, $DFLOW_PLUGIN_DIR or DIR) with their nodes, ports and config",
			"Starts every plugin found (executables named dflow-plugin-NAME in ./plugins, $DFLOW_PLUGIN_DIR or the folders given) and lists the node kinds each offers, with their ports and config.",
			cmdPlugins},
		{"nodes", nodesUsage, "list the node kinds, built-in and from plugins, with their ports and config",
			"Lists every node kind a stage can name: the built-in ones and those of the plugins found (./plugins, $DFLOW_PLUGIN_DIR), each with its ports (direction, name, type, what it carries) and its config attributes (type, default or required, what each does). Port types are those of the default config. With KIND only that kind is shown; a kind that does not exist exits 1 with the closest name. --json prints the same for programs; --markdown prints the built-in kinds as the node table of docs/spec-language.md.",
			cmdNodes},
		{"ui", "REPORT.json [REPORT2.json] [--addr ADDR]", "serve the browser page of saved reports, two one above the other",
			"Serves the page dflow run --ui shows, from saved reports: the graph (from the spec the report names, with its overrides, when it can still be read), queues and replicas over the series, node metrics, the diagnosis. With two reports, one above the other (the round_robin and shared runs of compare, or a run and its simulation). Ctrl-C stops it.",
			cmdUI},
		{"plot", "REPORT -o FILE.png", "draw queue depth and utilization over time from a saved report",
			"Draws a saved report's time series: queue depth per queue, busy share and idle share per replica, as a PNG or JPEG by the output's extension.",
			cmdPlot},
	}
}

func main() {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	e := &env{stdout: os.Stdout, stderr: os.Stderr, registry: nodes.Default, signals: sig}
	os.Exit(e.main(os.Args[1:]))
}

func (e *env) main(args []string) int {
	defer e.closePlugins()
	if len(args) == 0 {
		e.usage(e.stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && args[0] == "help" {
			return e.main([]string{args[1], "--help"}) // dflow help run
		}
		e.usage(e.stdout)
		return exitOK
	case "-version", "--version", "version":
		fmt.Fprintf(e.stdout, "dflow %s\n", dflowVersion())
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(e, args[1:])
		}
	}
	fmt.Fprintf(e.stderr, "dflow: unknown command %q\n\n", args[0])
	e.usage(e.stderr)
	return exitUsage
}

func (e *env) usage(w io.Writer) {
	fmt.Fprint(w, "dflow runs dataflow pipelines declared in HCL.\n\nUsage:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  dflow %-8s %s\n  %8s %s\n", c.name, c.args, "", c.summary)
	}
	fmt.Fprint(w, "\nRun 'dflow COMMAND --help' (or 'dflow help COMMAND') for what a command does and its flags,\n"+
		"'dflow --version' for the version.\n"+
		"Exit codes: 0 ok, 1 failed run or invalid spec, 2 usage (a flag or argument that is wrong, such as\n"+
		"a --var, --set or --edge naming what the spec lacks), 130 interrupted or aborted.\n")
}
