//go:build !unix

package run

// stopSelf is stopEnv's hook, on a system without SIGSTOP: it does
// nothing.
func stopSelf() {}
