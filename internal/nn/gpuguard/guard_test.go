package gpuguard

import (
	"sort"
	"testing"
)

func TestPresent(t *testing.T) {
	for _, c := range []struct {
		files []string
		want  bool
	}{
		{nil, false},
		{[]string{"/dev/nvidiactl"}, false}, // a driver without a device
		{[]string{"/dev/nvidia0"}, false},
		{[]string{"/dev/nvidiactl", "/dev/nvidia0"}, true},
		{[]string{"/dev/nvidiactl", "/dev/nvidia13"}, true},
		{[]string{"/dev/dxg"}, true},
	} {
		set := map[string]bool{}
		for _, f := range c.files {
			set[f] = true
		}
		if got := Present(func(p string) bool { return set[p] }); got != c.want {
			t.Errorf("Present(%v) = %v, want %v", c.files, got, c.want)
		}
	}
	if itoa(0) != "0" || itoa(7) != "7" || itoa(42) != "42" {
		t.Error("itoa")
	}
}

// TestInitOrder: the guard sorts before gorgonia.org/cu and imports only
// what cu imports (os), the two conditions for its init to run first.
func TestInitOrder(t *testing.T) {
	paths := []string{"gorgonia.org/cu", "github.com/dflow-dev/dflow/internal/nn/gpuguard"}
	sort.Strings(paths)
	if paths[0] != "github.com/dflow-dev/dflow/internal/nn/gpuguard" {
		t.Fatal("the guard must sort before gorgonia.org/cu")
	}
}
