package testutil

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	t.Parallel()
	n := 0
	if !Within(10*time.Second, func() bool { n++; return n == 5 }) || n != 5 {
		t.Errorf("Within stopped after %d calls, want 5", n)
	}
	n = 0
	if Within(30*time.Millisecond, func() bool { n++; return false }) {
		t.Error("Within held for a condition that never does")
	}
	if n < 2 {
		t.Errorf("Within called the condition %d times in 30ms", n)
	}
}

// fakeT records Fatalf instead of stopping the test.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper()                        {}
func (f *fakeT) Fatalf(format string, a ...any) { f.msg = fmt.Sprintf(format, a...) }

func TestEventuallyMessage(t *testing.T) {
	t.Parallel()
	f := &fakeT{}
	Eventually(f, 10*time.Millisecond, func() bool { return false }, "the %s to end", "run")
	if want := "timed out after 10ms waiting for the run to end"; !strings.Contains(f.msg, want) {
		t.Errorf("message %q, want %q", f.msg, want)
	}
	f.msg = ""
	Eventually(f, time.Second, func() bool { return true }, "nothing")
	if f.msg != "" {
		t.Errorf("a condition that held failed: %q", f.msg)
	}
}
