package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/sim"
	"github.com/hashicorp/hcl/v2"
)

func cmdValidate(e *env, args []string) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	var sf specFlags
	sf.register(fs)
	asJSON := fs.Bool("json", false, "print the diagnostics as JSON on stdout, in the shape of terraform validate -json, instead of text on stderr")
	files, code, ok := parse(e, fs, args, "SPEC... [flags]")
	if !ok {
		return code
	}
	if len(files) == 0 {
		return usageErr(e, "validate", "no spec given")
	}
	l, err := sf.loader(e)
	if err != nil {
		return usageErr(e, "validate", "%v", err)
	}
	var all hcl.Diagnostics
	valid := 0
	for _, f := range files {
		g, diags := l.LoadFile(f)
		diags = append(diags, e.checkLoaded(g, diags)...)
		all = append(all, diags...)
		if !diags.HasErrors() {
			valid++
		}
	}
	if *asJSON {
		graph.WriteDiagnosticsJSON(e.stdout, all, l.Sources())
	} else {
		graph.WriteDiagnostics(e.stderr, all, l.Sources())
		noun := "specs"
		if len(files) == 1 {
			noun = "spec"
		}
		fmt.Fprintf(e.stdout, "%d of %d %s valid\n", valid, len(files), noun)
	}
	if all.HasErrors() {
		// Every problem validate finds is a finding, exit 1, a --var or
		// --set that does not fit the spec's included (DESIGN: "exit 1 on
		// any error"); the other commands call that a usage error (loadCode).
		return exitFailed
	}
	return exitOK
}

// load loads one spec, printing diagnostics to stderr; nil means it failed.
func (e *env) load(sf *specFlags, file string) *graph.Graph {
	g, _ := e.loadSpec(sf, file)
	return g
}

// loadSpec is load with the exit code of a spec that failed (loadCode).
func (e *env) loadSpec(sf *specFlags, file string) (*graph.Graph, int) {
	l, err := sf.loader(e)
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow: %v\n", err)
		return nil, exitUsage
	}
	g, diags := l.LoadFile(file)
	diags = append(diags, e.checkLoaded(g, diags)...)
	graph.WriteDiagnostics(e.stderr, diags, l.Sources())
	if diags.HasErrors() {
		return nil, loadCode(diags)
	}
	return g, exitOK
}

// loadCode is the exit code of a command that loads a spec to run,
// simulate or draw it, with diags: 0 without errors; 2, a usage error,
// when every error is in what the command line gave (a --var or --set
// that names what the spec lacks, or a value that its attribute does not
// take), as compare's --edge NAME is; 1 when the spec itself is invalid.
func loadCode(diags hcl.Diagnostics) int {
	if !diags.HasErrors() {
		return exitOK
	}
	for _, d := range diags {
		if d.Severity == hcl.DiagError && !fromFlag(d) {
			return exitFailed
		}
	}
	return exitUsage
}

// fromFlag reports whether d is about a --var or --set value (the loader
// names the flag first, and no place in a file).
func fromFlag(d *hcl.Diagnostic) bool {
	return d.Subject == nil && (strings.HasPrefix(d.Detail, "--var ") || strings.HasPrefix(d.Detail, "--set "))
}

// checkLoaded is what every command checks in a spec the loader accepted
// (diags, its diagnostics, have no error), beyond the loader's own rules:
// key_hash edges fed without keys (an error) and wiring that can
// deadlock (a warning).
func (e *env) checkLoaded(g *graph.Graph, diags hcl.Diagnostics) hcl.Diagnostics {
	if g == nil || diags.HasErrors() {
		return nil
	}
	if keys := graph.CheckKeys(g); keys.HasErrors() {
		return keys
	}
	return sim.DeadlockWarnings(g, sim.Options{Registry: e.registry})
}
