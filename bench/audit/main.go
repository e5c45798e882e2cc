// Command audit runs the cluster audit, cmd/dflow's TestAuditBytes and
// TestAuditChain, many times, each run with its case (bytes or blob items
// on shared edges, or bytes items through a chain), the worker it kills
// (w2 or w3) and when (after 1-99% of the ids reached the sink)
// drawn from a seed of its own, and prints a verdict a run and a
// summary: runs, failures, and the seeds of the failures.
//
//	go run ./bench/audit                   # 200 runs, from the repository's root
//	go run ./bench/audit -runs 300 -seed 7 # the same 300 runs each time
//	go run ./bench/audit -replay SEED      # one run again, from its seed
//	go run ./bench/audit -race             # the coordinator under -race
//
// A run takes 10-20 s on 2 cores, one run at a time. The harness is the
// tests' (cmd/dflow/audit_test.go): this program builds
// its test binary once (go test -c, into bench/out/) and runs one subtest
// of it a run, the drawn choices in DFLOW_AUDIT_KILL and
// DFLOW_AUDIT_AFTER; a run passes when the test does. A failed run's
// output is kept in bench/out/audit/SEED.log, and its line says how to
// run the test alone with the same choices.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

func main() {
	runs := flag.Int("runs", 200, "how many runs")
	seed := flag.Uint64("seed", 0, "the seed the runs' seeds are drawn from (default: from the clock)")
	replay := flag.Uint64("replay", 0, "run once, from this run's seed (as a verdict line gives it)")
	race := flag.Bool("race", false, "build the test binary with the race detector")
	flag.Parse()
	failures, err := audit(*runs, *seed, *replay, *race)
	if err != nil {
		fmt.Fprintln(os.Stderr, "audit:", err)
		os.Exit(2)
	}
	if failures > 0 {
		os.Exit(1)
	}
}

// choice is what one run does, drawn from its seed.
type choice struct {
	seed   uint64
	typ    string // the case: bytes or blob (TestAuditBytes), or chain (TestAuditChain)
	victim string // the worker killed: w2 or w3
	after  int    // the kill comes once this percentage of the ids is at the sink
}

func draw(seed uint64) choice {
	r := rand.New(rand.NewPCG(seed, 0x617564697421)) // "audit!"
	return choice{
		seed:   seed,
		typ:    []string{"bytes", "blob", "chain"}[r.IntN(3)],
		victim: []string{"w2", "w3"}[r.IntN(2)],
		after:  1 + r.IntN(99),
	}
}

func (c choice) env() []string {
	return []string{"DFLOW_AUDIT_KILL=" + c.victim, fmt.Sprintf("DFLOW_AUDIT_AFTER=%d", c.after)}
}

// filter is the -run of the test binary for c's subtest.
func (c choice) filter() string {
	if c.typ == "chain" {
		return "^TestAuditChain$"
	}
	return "^TestAuditBytes$/^" + c.typ + "$"
}

// alone is the command that runs c's test with go test, from the root.
func (c choice) alone() string {
	return fmt.Sprintf("%s go test -count=1 -v -run '%s' ./cmd/dflow", strings.Join(c.env(), " "), c.filter())
}

// audit runs the audit and returns how many runs failed.
func audit(runs int, seed, replay uint64, race bool) (int, error) {
	root, err := repoRoot()
	if err != nil {
		return 0, err
	}
	out := filepath.Join(root, "bench", "out")
	if err := os.MkdirAll(filepath.Join(out, "audit"), 0o755); err != nil {
		return 0, err
	}
	bin := filepath.Join(out, "audit.test")
	build := []string{"test", "-c", "-o", bin}
	if race {
		build = append(build, "-race")
	}
	cmd := exec.Command("go", append(build, "./cmd/dflow")...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("go %s: %v", strings.Join(build, " "), err)
	}
	var choices []choice
	if replay != 0 {
		choices = []choice{draw(replay)}
	} else {
		if seed == 0 {
			seed = uint64(time.Now().UnixNano())
		}
		fmt.Printf("audit: %d runs from seed %d (go run ./bench/audit -runs %d -seed %d draws them again)\n", runs, seed, runs, seed)
		r := rand.New(rand.NewPCG(seed, 0))
		for range runs {
			choices = append(choices, draw(r.Uint64()))
		}
	}
	var failed []choice
	byType := map[string][2]int{} // runs and failures of each item type
	for i, c := range choices {
		ok, verdict, log := runOne(root, bin, c)
		n := byType[c.typ]
		n[0]++
		state := "ok"
		if !ok {
			n[1]++
			failed = append(failed, c)
			state = "FAIL"
			file := filepath.Join(out, "audit", fmt.Sprintf("%d.log", c.seed))
			if err := os.WriteFile(file, log, 0o644); err != nil {
				return 0, err
			}
			verdict += fmt.Sprintf(" (output in %s; alone: %s)", file, c.alone())
		}
		byType[c.typ] = n
		fmt.Printf("run %d/%d seed %d: %s, kill %s after %d%%: %s: %s\n", i+1, len(choices), c.seed, c.typ, c.victim, c.after, state, verdict)
	}
	fmt.Printf("audit: %d runs, %d failures", len(choices), len(failed))
	for _, typ := range []string{"bytes", "blob", "chain"} {
		if n := byType[typ]; n[0] > 0 {
			fmt.Printf("; %s: %d of %d failed", typ, n[1], n[0])
		}
	}
	fmt.Println()
	if len(failed) > 0 {
		var seeds []string
		for _, c := range failed {
			seeds = append(seeds, fmt.Sprint(c.seed))
		}
		fmt.Printf("audit: the failures' seeds (go run ./bench/audit -replay SEED): %s\n", strings.Join(seeds, " "))
	}
	return len(failed), nil
}

var (
	verdictRe = regexp.MustCompile(`audit verdict: (.*)`)
	// a test's own failure lines: "    audit_test.go:123: ..."
	errorRe = regexp.MustCompile(`^\s+\w+_test\.go:\d+: (.*)`)
)

// runOne runs c's subtest of the test binary bin and says whether it
// passed, the test's verdict line (with, for a failure, its first
// error), and its output.
func runOne(root, bin string, c choice) (bool, string, []byte) {
	cmd := exec.Command(bin, "-test.run", c.filter(), "-test.count", "1", "-test.v", "-test.timeout", "5m")
	cmd.Dir = filepath.Join(root, "cmd", "dflow") // where the test runs under go test
	cmd.Env = append(os.Environ(), c.env()...)
	log, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return false, err.Error(), log
	}
	// The test's first error: its first line after the verdict, or,
	// where it failed before one, its first line.
	verdict, first := "", ""
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if m := verdictRe.FindStringSubmatch(l); m != nil {
			verdict, first = m[1], ""
		} else if m := errorRe.FindStringSubmatch(l); m != nil && first == "" && !strings.HasPrefix(m[1], "the coordinator's log") {
			first = m[1]
		}
	}
	if err == nil {
		return true, verdict, log
	}
	if verdict == "" {
		verdict = "no verdict"
	}
	if first != "" {
		verdict += "; " + first
	}
	return false, verdict, log
}

// repoRoot is the folder of the go.mod above the current one.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/dflow-dev/dflow\n")) {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("run it in dflow's repository (no go.mod of github.com/dflow-dev/dflow above this folder)")
		}
		dir = up
	}
}
