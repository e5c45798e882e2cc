// Package report defines what a run of a pipeline says about itself: the
// run report (Report), which `dflow run --report` and `dflow sim --report`
// write as JSON and later commands read back, and the live snapshots
// (Snapshot) a running pipeline is sampled into, from which the report's
// series, the status line and the Prometheus metrics are made.
//
// Invariants: a Report is plain data, safe to marshal and compare; a
// report of a real run and of a simulation have the same shape
// (Simulated tells them apart). Snapshot figures are cumulative since the
// start (diff two for rates), read without stopping the run.
package report
