package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/report"
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
	fs.Func("var", "set the spec's variable `NAME=VALUE`, converted to the variable's type; "+
		"write lists in HCL, 'speeds=[1, 0.5]' (repeatable; wins over --var-file and the default)", func(v string) error {
		if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
			return errors.New("want NAME=VALUE, such as items=100")
		}
		f.vars = append(f.vars, v)
		return nil
	})
	fs.Var(&f.varFiles, "var-file", "read variables from `FILE`, one NAME = VALUE per line, native HCL or JSON (repeatable, later files win)")
	fs.Func("set", "override one attribute of the spec, `PATH=VALUE`, checked as the file is: "+
		"edge.NAME.policy=shared, edge.NAME.capacity=N, edge.NAME.capacity_bytes=N, "+
		"stage.NAME.replicas=N or stage.NAME.config.KEY=VALUE (repeatable)", func(v string) error {
		path, _, ok := strings.Cut(v, "=")
		parts := strings.Split(path, ".")
		if !ok || len(parts) < 3 || (parts[0] != "edge" && parts[0] != "stage") {
			return errors.New("want edge.NAME.ATTR=VALUE or stage.NAME.ATTR=VALUE, such as edge.hs.policy=shared")
		}
		f.sets = append(f.sets, v)
		return nil
	})
}

// overrides are the flags as the report records them.
func (f *specFlags) overrides() report.Overrides {
	o := report.Overrides{VarFiles: f.varFiles, Sets: f.sets}
	for _, kv := range f.vars {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if o.Vars == nil {
				o.Vars = map[string]string{}
			}
			o.Vars[k] = v
		}
	}
	return o
}

// under puts the overrides that rep, the report read from path, records
// (the --var, --var-file and --set of the run that measured it) under f's:
// a simulation from a measured run is of the spec that ran, with the
// command line's flags on top (later var files and sets win, and a --var
// given wins over the report's). They apply when spec is the report's
// own; another spec may not declare its variables, so there they are
// left out, and stderr says which it does.
func (f *specFlags) under(e *env, cmd string, rep *report.Report, path, spec string) {
	o := rep.Overrides
	if len(o.Vars)+len(o.VarFiles)+len(o.Sets) == 0 {
		return
	}
	var vars, words []string
	for _, k := range slices.Sorted(maps.Keys(o.Vars)) {
		vars = append(vars, k+"="+o.Vars[k])
		words = append(words, "--var "+k+"="+o.Vars[k])
	}
	for _, v := range o.VarFiles {
		words = append(words, "--var-file "+v)
	}
	for _, s := range o.Sets {
		words = append(words, "--set "+s)
	}
	if !sameFile(rep.Spec, spec) {
		fmt.Fprintf(e.stderr, "dflow %s: %s is a report of %s, not of %s: its overrides are left out (%s)\n",
			cmd, path, rep.Spec, spec, strings.Join(words, " "))
		return
	}
	f.vars = append(vars, f.vars...)
	f.varFiles = append(slices.Clip(o.VarFiles), f.varFiles...)
	f.sets = append(slices.Clip(o.Sets), f.sets...)
	fmt.Fprintf(e.stderr, "dflow %s: the spec as the run of %s had it: %s (this command's flags on top)\n", cmd, path, strings.Join(words, " "))
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
	fs.SetOutput(e.stderr) // the flag package prints a bad flag's error there
	fs.Usage = func() {}
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			printUsage(e.stdout, fs, usage) // asked for: to stdout
			return nil, exitOK, false
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "Run 'dflow %s --help' for usage.\n", fs.Name())
			return nil, exitUsage, false
		}
		if fs.NArg() == 0 {
			return pos, 0, true
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// printUsage prints a command's synopsis, what it does, and its flags in
// words, each as --NAME PLACEHOLDER with its default.
func printUsage(w io.Writer, fs *flag.FlagSet, usage string) {
	fmt.Fprintf(w, "Usage: dflow %s %s\n", fs.Name(), usage)
	for _, c := range commands {
		if c.name == fs.Name() {
			fmt.Fprintf(w, "\n%s\n", wrap(c.doc, 76, ""))
		}
	}
	fmt.Fprint(w, "\nFlags:\n")
	fs.VisitAll(func(f *flag.Flag) {
		name, text := flag.UnquoteUsage(f)
		head := "  --" + f.Name
		if len(f.Name) == 1 {
			head = "  -" + f.Name // -o
		}
		if name != "" {
			head += " " + strings.ToUpper(name)
		}
		if def := defaultText(f); def != "" && !strings.Contains(text, "(default") {
			text += " (default " + def + ")" // unless the usage says it in words
		}
		fmt.Fprintf(w, "%s\n%s\n", head, wrap(text, 72, "      "))
	})
}

// defaultText is a flag's default as a user would type it, or "" when it
// says nothing (an empty string, false, zero, nothing repeated yet).
func defaultText(f *flag.Flag) string {
	switch d := f.DefValue; d {
	case "", "false", "0", "0s", "[]":
		return ""
	default:
		if _, isMulti := f.Value.(*multi); isMulti {
			return ""
		}
		return d
	}
}

// wrap fills text into lines of at most width columns, each after indent.
func wrap(text string, width int, indent string) string {
	var b strings.Builder
	n := 0
	for i, word := range strings.Fields(text) {
		if i > 0 && n+1+len(word) > width {
			b.WriteString("\n")
			n = 0
		}
		if n == 0 {
			b.WriteString(indent)
		} else {
			b.WriteString(" ")
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	return b.String()
}

// usageErr reports a usage error and returns exit code 2.
func usageErr(e *env, cmd, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "dflow %s: %s\nRun 'dflow %s --help' for usage.\n", cmd, fmt.Sprintf(format, args...), cmd)
	return exitUsage
}

// checkInterval accepts 0 (off) or a period of at least a millisecond: a
// negative one is a typo, and a shorter one would spend the run taking
// snapshots.
func checkInterval(d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("--interval %v: must not be negative (0 turns the status line and the series off)", d)
	case d > 0 && d < time.Millisecond:
		return fmt.Errorf("--interval %v: must be 0 (off) or at least 1ms", d)
	}
	return nil
}

// output is a file a command will write at its end (--report, --plot).
type output struct {
	flag, path string
	plot       bool
}

func (o output) name() string {
	if len(o.flag) == 1 {
		return "-" + o.flag
	}
	return "--" + o.flag
}

// checkOutputs vets the files a command will write before any work
// starts, so that a run of minutes does not end in "cannot write": the
// spec itself, the same file twice, a plot name without an image
// extension (usage errors, exit 2), and a path that cannot be written
// (exit 1). A file that did not exist is created to test it and removed
// again.
func checkOutputs(e *env, cmd, spec string, outs ...output) (code int, ok bool) {
	seen := map[string]output{}
	for _, o := range outs {
		if o.path == "" {
			continue
		}
		if o.plot {
			if _, err := monitor.ImageFormat(o.path); err != nil {
				return usageErr(e, cmd, "%s: %v", o.name(), err), false
			}
		}
		if spec != "" && sameFile(o.path, spec) {
			return usageErr(e, cmd, "%s %s names the input %s itself, which would be overwritten; write to another file", o.name(), o.path, spec), false
		}
		abs, _ := filepath.Abs(o.path)
		if other, dup := seen[abs]; dup {
			return usageErr(e, cmd, "%s and %s name the same file %s", other.name(), o.name(), o.path), false
		}
		seen[abs] = o
		if err := writable(o.path); err != nil {
			fmt.Fprintf(e.stderr, "dflow %s: %s: %v\n", cmd, o.name(), err)
			return exitFailed, false
		}
	}
	return 0, true
}

// sameFile reports whether a and b name one file: the same path, or two
// paths of one existing file.
func sameFile(a, b string) bool {
	if aa, err := filepath.Abs(a); err == nil {
		if bb, err := filepath.Abs(b); err == nil && aa == bb {
			return true
		}
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// writable tests that path can be written, without changing a file that
// is there.
func writable(path string) error {
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return fmt.Errorf("%s is a directory", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("cannot write %s: %w", path, errors.Unwrap(err))
		}
		return f.Close()
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", path, errors.Unwrap(err))
	}
	f.Close()
	return os.Remove(path)
}

// plural is "1 edge", "2 edges".
func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
