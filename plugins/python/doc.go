// Package python holds the tests of dflow's Python SDK, the module
// dflowplugin (dflowplugin.py, dflow_pb2.py) and its launcher
// dflow-python, which are what this folder is for: the launcher's choice
// of interpreter and its message when none will do, through dflow's
// plugin host, and docs/plugins.md's "Writing a plugin in Python" run as
// written. They skip, saying so, where Debian's python3 lacks grpcio,
// protobuf or numpy.
package python
