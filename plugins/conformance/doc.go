// Package conformance is the plugin protocol's conformance suite: given
// an executable that speaks the protocol (docs/plugin-protocol.md)
// and the node kinds of it that the cases use, Run runs each case through
// dflow's real host and runtime, and fails with what the plugin did
// wrong. dflow runs it against the Go SDK (a test plugin, this package's
// own test), the Python SDK (plugins/examples/python) and the PyTorch
// example (plugins/examples/torch); an implementation in another language
// runs it the same way, from a Go test of its own (docs/plugins.md,
// "Testing a plugin").
//
// The cases: small items, exact counts; large items in chunks (and by
// reference where the plugin maps shared memory); two inputs read in
// turn; two outputs held back apart; a deadlock through the plugin's
// stage named, and none while its node computes; replicas that end with
// their processes; a crash, and a config the kind refuses; no plugin
// process left after dflow is SIGKILLed; a group kind's steps ending
// without a hang, each item once, measured.
//
// Invariants: every case asserts what the protocol promises, with a
// deadline on every wait; a case the plugin has no kind for is skipped,
// saying which kind it needs.
package conformance
