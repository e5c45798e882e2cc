package testutil

import "testing"

// TestMain fails the package's tests if a goroutine they started
// outlives them, and exits without the race runtime's second (Main).
func TestMain(m *testing.M) { Main(m) }
