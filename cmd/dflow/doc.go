// Command dflow validates, draws, formats, simulates and runs dataflow
// pipelines declared in HCL. The README lists the commands and
// docs/spec-language.md the language; `dflow COMMAND --help` explains each
// command's flags.
//
// This package holds flags, input and output, and exit codes: 0 ok, 1 a
// failed run or an invalid spec, 2 a usage error, 130 an interrupted or
// aborted run. What a command does lives in the packages it calls (graph,
// run, report, internal/sim, internal/monitor, plugins/host).
package main
