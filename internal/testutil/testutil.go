// Package testutil holds what the tests of several packages share: one
// way to wait for a condition, instead of a poll loop written in each.
package testutil

import (
	"fmt"
	"testing"
	"time"
)

// Eventually polls cond until it holds, failing t (Fatalf) if it still
// does not after within: "timed out after 10s waiting for WHAT", with
// what formatted from what and args. It polls often at first (1 ms) and
// less as the wait grows (at most every 20 ms), so that a condition that
// holds at once costs nothing and a long wait costs little. Call it from
// the test's goroutine; elsewhere use Within.
func Eventually(t testing.TB, within time.Duration, cond func() bool, what string, args ...any) {
	t.Helper()
	if !Within(within, cond) {
		t.Fatalf("timed out after %v waiting for %s", within, fmt.Sprintf(what, args...))
	}
}

// Within polls cond as Eventually does and reports whether it held
// before within passed, for a goroutine other than the test's, or a test
// that says more than Eventually's message when it fails.
func Within(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		if cond() {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(min(pause, time.Until(deadline)+time.Millisecond))
	}
}
