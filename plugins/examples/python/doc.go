// Package python holds the example dflow plugin written in Python
// (stats.py, on the module dflowplugin of plugins/python); this test runs
// it through dflow where Python has what it needs.
//
// The Go package holds only that test: the plugin itself is Python, and
// the test skips, saying so, where Debian's python3 lacks grpcio,
// protobuf or numpy.
package python
