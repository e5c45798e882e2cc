package main

import (
	"flag"
	"fmt"

	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/report"
)

func cmdPlot(e *env, args []string) int {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	out := fs.String("o", "", "the image to write, `FILE`.png or .jpg (required)")
	files, code, ok := parse(e, fs, args, "REPORT -o FILE.png")
	if !ok {
		return code
	}
	if len(files) != 1 || *out == "" {
		return usageErr(e, "plot", "want one report and -o FILE.png")
	}
	if code, ok := checkOutputs(e, "plot", files[0], output{"o", *out, true}); !ok {
		return code
	}
	rep, err := report.Read(files[0])
	if err == nil {
		err = monitor.Plot(rep, *out)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow plot: %v\n", err)
		return exitFailed
	}
	fmt.Fprintf(e.stdout, "%s\n", *out)
	return exitOK
}
