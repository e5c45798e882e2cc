// Command dflow validates, draws, formats and runs dataflow pipelines
// declared in HCL. See the README and docs/ for the spec language.
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

// Exit codes (DESIGN.md).
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

type command struct {
	name, args, summary string
	run                 func(env *env, args []string) int
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
}

var commands []command

func init() {
	commands = []command{
		{"validate", "SPEC... [--json] [--var k=v] [--var-file F] [--set P=V]", "check specs and report every problem", cmdValidate},
		{"graph", "SPEC [--format text|dot|mermaid]", "draw the graph with replicas, policies and types", cmdGraph},
		{"fmt", "SPEC... [--check]", "rewrite specs in canonical HCL format", cmdFmt},
		{"run", "SPEC [--report FILE] [--interval D] [--metrics-addr ADDR] [--plot FILE.png] [--var k=v] [--set P=V]", "run the pipeline; first Ctrl-C drains, second aborts", cmdRun},
		{"sim", "SPEC [--from REPORT] [--split A,B=N] [--report FILE] [--set P=V]", "simulate the spec in virtual time; same report as run", cmdSim},
		{"compare", "SPEC --edge NAME [--policies round_robin,shared] [--sim] [--json] [--plot FILE.png]", "run or simulate once per policy and print one table", cmdCompare},
		{"eval", "DRAFTER.safetensors [--target M] [--corpus PATH]", "acceptance length of a saved drafter against its target, next to an n-gram drafter", cmdEval},
		{"plugins", "[DIR]", "list the plugins found (./plugins, $DFLOW_PLUGIN_DIR or DIR) with their nodes, ports and config", cmdPlugins},
		{"plot", "REPORT -o FILE.png", "draw queue depth and utilization over time from a saved report", cmdPlot},
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
	case "-h", "--help", "help":
		e.usage(e.stdout)
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
	fmt.Fprint(w, "\nRun 'dflow COMMAND --help' for a command's flags.\n"+
		"Exit codes: 0 ok, 1 failed run or invalid spec, 2 usage, 130 interrupted.\n")
}
