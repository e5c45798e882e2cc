package run

import (
	"slices"
	"testing"
)

// TestLocalEnv: local workers get the embedded server's token and none of
// the caller's cluster credentials, are marked local, and share the
// host's cores with the coordinator (GOMAXPROCS), unless the caller's
// environment sets GOMAXPROCS itself.
func TestLocalEnv(t *testing.T) {
	was := hostProcs
	defer func() { hostProcs = was }()
	hostProcs = 8
	for n, want := range map[int]int{1: 4, 3: 2, 7: 1, 16: 1} {
		if got := LocalProcs(n); got != want {
			t.Errorf("LocalProcs(%d) on 8 cores = %d, want %d", n, got, want)
		}
	}
	env := localEnv([]string{"HOME=/h", TokenEnv + "=old", CredsEnv + "=x.creds"}, "tok", 3)
	want := []string{"HOME=/h", TokenEnv + "=tok", LocalWorkerEnv + "=1", "GOMAXPROCS=2"}
	if !slices.Equal(env, want) {
		t.Errorf("local workers' environment %q, want %q", env, want)
	}
	env = localEnv([]string{"GOMAXPROCS=3"}, "tok", 3)
	if want := []string{"GOMAXPROCS=3", TokenEnv + "=tok", LocalWorkerEnv + "=1"}; !slices.Equal(env, want) {
		t.Errorf("with GOMAXPROCS set by the caller: %q, want %q (the caller's kept)", env, want)
	}
}
