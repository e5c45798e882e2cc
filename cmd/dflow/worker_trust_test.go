package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWorkerPluginsOwnOnly: a standing worker starts only plugins of its
// own folders, by name. A job whose plugin block names an executable
// outside them (the coordinator's build, in a folder of its own) is
// refused, the coordinator printing which worker, which plugin and where
// it looked; the worker given that folder with --plugins runs the job.
func TestWorkerPluginsOwnOnly(t *testing.T) {
	t.Parallel()
	bin, err := buildChecksum()
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(t.TempDir(), "p.hcl")
	if err := os.WriteFile(spec, []byte(fmt.Sprintf(pluginSpec, bin, 50, "0s")), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t)
	w := workers(t, srv.URL, srv.Token, 1)[0]
	code, _, stderr := dflow(t, "run", spec, "--cluster", srv.URL, "--token", srv.Token, "--workers", "1")
	if code != exitFailed {
		t.Fatalf("code %d, want %d (refused)\n%s", code, exitFailed, stderr)
	}
	here, _ := filepath.Abs("plugins")
	for _, want := range []string{"worker w1", `this worker has no plugin "checksum"`, "dflow-plugin-checksum", here, "--plugins DIR"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the coordinator does not say %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(w.output(), "[plugin checksum]") {
		t.Errorf("the worker started the plugin:\n%s", w.output())
	}
	w.cmd.Process.Kill()
	w.wait(t, 10*time.Second)

	// The same job on a worker that has the plugin's folder.
	w = startDflow(t, []string{"DFLOW_CLUSTER_TOKEN=" + srv.Token}, "worker", "--join", srv.URL, "--name", "w2", "--plugins", filepath.Dir(bin))
	code, _, stderr = dflow(t, "run", spec, "--cluster", srv.URL, "--token", srv.Token, "--workers", "1")
	if code != exitOK || !strings.Contains(stderr, "crc_items=50") {
		t.Fatalf("with --plugins: code %d\n%s\nworker:\n%s", code, stderr, w.output())
	}
}

// TestWorkerRootFlags: --write and --read must name folders.
func TestWorkerRootFlags(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--write", "--read", "--plugins"} {
		code, _, stderr := dflow(t, "worker", "--join", "nats://127.0.0.1:1", flag, filepath.Join(t.TempDir(), "none"))
		if code != exitUsage || !strings.Contains(stderr, flag+" ") || !strings.Contains(stderr, "not a folder") {
			t.Errorf("%s to nothing: code %d\n%s", flag, code, stderr)
		}
	}
}
