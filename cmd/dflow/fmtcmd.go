package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
)

func cmdFmt(e *env, args []string) int {
	fs := flag.NewFlagSet("fmt", flag.ContinueOnError)
	check := fs.Bool("check", false, "change nothing; list the files that are not formatted and exit 1 if any")
	files, code, ok := parse(e, fs, args, "SPEC... [--check]   (SPEC may be - for standard input)")
	if !ok {
		return code
	}
	if len(files) == 0 {
		return usageErr(e, "fmt", "no spec given")
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".json") {
			return usageErr(e, "fmt", "%s: only native HCL syntax is formatted, not JSON", f)
		}
	}
	status := exitOK
	for _, f := range files {
		if s := e.fmtFile(f, *check); s != exitOK {
			status = s
		}
	}
	return status
}

// fmtFile formats one file in place (or stdin to stdout). A file with syntax
// errors is reported and left untouched.
func (e *env) fmtFile(name string, check bool) int {
	var src []byte
	var err error
	if name == "-" {
		src, err = io.ReadAll(os.Stdin)
	} else {
		src, err = os.ReadFile(name)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow fmt: %v\n", err)
		return exitFailed
	}
	if d := graph.NotText(name, src); d != nil {
		graph.WriteDiagnostics(e.stderr, hcl.Diagnostics{d}, nil)
		return exitFailed
	}
	if _, diags := hclsyntax.ParseConfig(src, name, hcl.InitialPos); diags.HasErrors() {
		graph.WriteDiagnostics(e.stderr, diags, map[string][]byte{name: src})
		return exitFailed
	}
	out := hclwrite.Format(src)
	switch {
	case name == "-":
		e.stdout.Write(out)
	case bytes.Equal(out, src):
	case check:
		fmt.Fprintln(e.stdout, name)
		return exitFailed
	default:
		if err := os.WriteFile(name, out, 0o644); err != nil {
			fmt.Fprintf(e.stderr, "dflow fmt: %v\n", err)
			return exitFailed
		}
		fmt.Fprintln(e.stdout, name)
	}
	return exitOK
}
