package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/report"
)

// shBlocks returns the sh code blocks of a markdown file, in order, each
// as its lines.
func shBlocks(t *testing.T, path string) [][]string {
	t.Helper()
	blocks, err := readShBlocks(path)
	if err != nil {
		t.Fatal(err)
	}
	return blocks
}

// readShBlocks is shBlocks for callers without a test.
func readShBlocks(path string) ([][]string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var blocks [][]string
	var cur []string
	in := false
	for _, line := range strings.Split(string(src), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in, cur = true, nil
		case in && strings.HasPrefix(line, "```"):
			in = false
			blocks = append(blocks, cur)
		case in:
			cur = append(cur, line)
		}
	}
	return blocks, nil
}

// TestTryItKill follows docs/cluster.md's "Kill a worker mid-run": the
// dflow run line of the block before the one that kills, as written,
// scaled down by flags added at the end (fewer items, shorter service
// times, a report), and a SIGKILL, mid-run, to the worker the kill line
// names, found by the pid the coordinator prints for it. The run must end
// ok with every item counted once, the killed worker's replicas restarted
// elsewhere. It runs dflow as the README installs it, as a reader of the
// doc does: its coordinator and workers are four processes busy for the
// whole run, twice as costly under the race detector, and the other
// cluster fault tests (TestSourceLost, TestSyncGroupLost, ...) run the
// same restarts race-built.
func TestTryItKill(t *testing.T) {
	t.Parallel()
	blocks := shBlocks(t, "../../docs/cluster.md")
	var run []string
	victim := ""
	for i, b := range blocks {
		for _, line := range b {
			if strings.HasPrefix(line, "kill -9 ") && i > 0 {
				victim = regexp.MustCompile(`local\d+`).FindString(line)
				for _, l := range blocks[i-1] {
					if f := strings.Fields(l); len(f) > 2 && f[0] == "dflow" && f[1] == "run" {
						run = f[1:]
					}
				}
			}
		}
	}
	if run == nil || victim == "" {
		t.Fatalf("docs/cluster.md shows no dflow run followed by a kill -9 of a local worker (run %q, worker %q)", run, victim)
	}
	out := filepath.Join(t.TempDir(), "r.json")
	args := append(run, "--var", "items=400", "--set", "stage.target.config.service_time=50ms", "--set", "stage.drafter.config.service_time=12ms",
		"--interval", "200ms", "--report", out)
	cmd := exec.Command(installed(t), args...)
	cmd.Dir = "../.." // the doc's paths are the repository's
	coord := startProc(t, cmd)
	pidLine := regexp.MustCompile(victim + ` \(pid (\d+)\)`)
	progress := regexp.MustCompile(`\]\s+(\d+)% ETA`)
	pid := 0
	if !testutil.Within(60*time.Second, func() bool {
		o := coord.output()
		m := pidLine.FindStringSubmatch(o)
		p := progress.FindAllStringSubmatch(o, -1)
		if m != nil && len(p) > 0 {
			if done, _ := strconv.Atoi(p[len(p)-1][1]); done >= 10 {
				if done > 60 {
					t.Fatalf("the run was %d%% done before the kill: too late to test a loss\n%s", done, o)
				}
				pid, _ = strconv.Atoi(m[1])
			}
		}
		return pid != 0
	}) {
		t.Fatalf("the run did not get going:\n%s", coord.output())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil { // our child's child, by the pid it printed
		t.Fatal(err)
	}
	if code := coord.wait(t, 90*time.Second); code != exitOK {
		t.Fatalf("dflow %s: exit %d after %s was killed\n%s", strings.Join(args, " "), code, victim, coord.output())
	}
	rep := readReport(t, out)
	if rep.Status != report.OK {
		t.Fatalf("status %s: %s", rep.Status, rep.Error)
	}
	for name, e := range rep.Edges {
		if e.Produced != 400 || e.Consumed != 400 {
			t.Errorf("edge %s: produced %d, consumed %d, want 400 each", name, e.Produced, e.Consumed)
		}
	}
	restarted := 0
	for name, st := range rep.Stages {
		var in int64
		for _, r := range st.Replicas {
			in += r.ItemsIn
			if strings.HasPrefix(r.Worker, victim+">") {
				restarted++
			} else if r.Worker == victim {
				t.Errorf("%s[%d] ran on %s, killed, and did not restart", name, r.Index, victim)
			}
		}
		if name != "reader" && in != 400 {
			t.Errorf("stage %s took %d items, want 400", name, in)
		}
	}
	if restarted == 0 || !strings.Contains(coord.output(), "worker "+victim+" lost") {
		t.Errorf("no replica restarted after %s was lost:\n%s", victim, coord.output())
	}
}
