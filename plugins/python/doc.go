// Package python holds the Go tests of dflow's Python SDK, the package
// dflowplugin (dflowplugin/, with its own tests in tests/) and its
// launcher dflow-python, which are what this folder is for: the
// package's tests run with the system Python (under pytest where it has
// it, else unittest), the launcher's choice of interpreter and its
// message when none will do, through dflow's plugin host, group kinds in
// lockstep, and docs/plugins.md's "Writing a plugin in Python" run as
// written. They skip, saying so, where Debian's python3 lacks grpcio,
// protobuf or numpy.
package python
