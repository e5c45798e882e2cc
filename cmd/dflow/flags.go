package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/dflow-dev/dflow/graph"
)

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// specFlags are the flags every command that loads a spec takes.
type specFlags struct {
	vars, varFiles, sets multi
}

func (f *specFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.vars, "var", "set a variable, NAME=VALUE (repeatable)")
	fs.Var(&f.varFiles, "var-file", "read variables from a file of NAME = VALUE lines (repeatable)")
	fs.Var(&f.sets, "set", "override an attribute: edge.NAME.policy|capacity|capacity_bytes=V, stage.NAME.replicas=N, stage.NAME.config.KEY=V (repeatable)")
}

func (f *specFlags) loader(e *env) (*graph.Loader, error) {
	vars := map[string]string{}
	for _, kv := range f.vars {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--var %q: want NAME=VALUE", kv)
		}
		vars[k] = v
	}
	return &graph.Loader{Catalog: e.registry, Vars: vars, VarFiles: f.varFiles, Sets: f.sets, Plugins: e.loadPlugins}, nil
}

// parse parses flags that may come before, between or after the positional
// arguments (`dflow validate a.hcl --json b.hcl`). It prints usage errors
// and reports whether to go on; code is the exit code otherwise.
func parse(e *env, fs *flag.FlagSet, args []string, usage string) (pos []string, code int, ok bool) {
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage: dflow %s %s\n\nFlags:\n", fs.Name(), usage)
		fs.PrintDefaults()
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, exitOK, false
			}
			return nil, exitUsage, false
		}
		if fs.NArg() == 0 {
			return pos, 0, true
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// usageErr reports a usage error and returns exit code 2.
func usageErr(e *env, cmd, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "dflow %s: %s\nRun 'dflow %s --help' for usage.\n", cmd, fmt.Sprintf(format, args...), cmd)
	return exitUsage
}
