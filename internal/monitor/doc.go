// Package monitor turns a pipeline's snapshots and its report into what
// people and tools read: the status line and progress bar (status.go),
// Prometheus metrics (prom.go), the plain-words diagnosis (diagnose.go)
// and the plots (plot.go). docs/monitoring.md documents each.
//
// Invariants: monitoring only reads. A Status or collector takes
// report.Snapshot values, which the runtime builds from its atomics
// without stopping the run, and never holds a lock the runtime takes; the
// diagnosis and the plots read a finished report.Report, so they serve a
// real run and a simulation alike.
package monitor
