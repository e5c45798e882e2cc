// Package slurm holds the Slurm recipe of docs/deploy.md (dflow.sbatch)
// and its test, which runs the recipe for real on a Slurm of one node
// started here.
package slurm

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestSlurmRecipe starts a Slurm of one node on localhost (slurmctld and
// slurmd, children of the test, in a temporary folder), submits
// dflow.sbatch with sbatch as a user would, the coordinator and three
// workers on the one node, and checks that the job completes with the
// run's status and exact counts, that the token shows neither in the
// job's output nor on any command line, and that a run that fails fails
// the job. It skips, saying why, where Slurm is not installed (Debian's
// slurm-wlm; .ci/run installs it) or cannot start.
func TestSlurmRecipe(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the Slurm test runs on Linux only")
	}
	bins := map[string]string{}
	for _, name := range []string{"slurmctld", "slurmd", "sbatch", "scontrol", "scancel"} {
		p, err := lookSbin(name)
		if err != nil {
			t.Skipf("Slurm is not installed: no %s on the PATH or in /usr/sbin (Debian: apt-get install slurm-wlm; .ci/run installs it)", name)
		}
		bins[name] = p
	}
	if os.Geteuid() != 0 {
		t.Skip("Slurm cannot start here: slurmd starts a job's tasks as the job's user, which takes root (run the test as root, as .ci/run is in CI)")
	}
	dir := t.TempDir()
	me, err := user.Current()
	if err != nil {
		t.Skipf("no current user for slurm.conf: %v", err)
	}

	// Authentication: auth/none where this Slurm still has it (Debian
	// 12's 22.05 does), else munge with a key made up here.
	auth := "AuthType=auth/none\nCredType=cred/none\n"
	if os.Getenv("DFLOW_TEST_SLURM_AUTH") == "munge" || !hasPlugin("auth_none.so") {
		auth = startMunge(t, dir)
	}
	t.Logf("Slurm's authentication: %s", strings.Fields(auth)[0])

	ctldPort, slurmdPort := freePort(t), freePort(t)
	conf := filepath.Join(dir, "slurm.conf")
	mustWrite(t, conf, fmt.Sprintf(`ClusterName=dflowtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=%d
SlurmdPort=%d
SlurmUser=%s
SlurmdUser=%s
%sStateSaveLocation=%s
SlurmdSpoolDir=%s
SlurmctldPidFile=%s
SlurmdPidFile=%s
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=12 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
`, ctldPort, slurmdPort, me.Username, me.Username, auth,
		mkdir(t, dir, "state"), mkdir(t, dir, "spool"),
		filepath.Join(dir, "slurmctld.pid"), filepath.Join(dir, "slurmd.pid")))
	env := slurmEnv(conf)

	// dflow itself, built without -race (the race detector is for the
	// test's own code; the binary only has to be the one the docs run).
	dflow, err := testutil.Built("../..", "./cmd/dflow", nil)
	if err != nil {
		t.Fatal(err)
	}

	ctld := startDaemon(t, dir, env, bins["slurmctld"], "-D", "-i", "-f", conf)
	slurmd := startDaemon(t, dir, env, bins["slurmd"], "-D", "-N", "localhost", "-f", conf)
	// The node is up once slurmctld counts it idle.
	var out []byte
	var exited *daemon
	idle := testutil.Within(30*time.Second, func() bool {
		out, _ = command(env, bins["scontrol"], "show", "node", "localhost", "-o").Output()
		for _, d := range []*daemon{ctld, slurmd} {
			if d.exited() {
				exited = d
			}
		}
		return exited != nil || bytes.Contains(out, []byte("State=IDLE"))
	})
	switch {
	case exited != nil:
		t.Skipf("Slurm cannot start here: %s exited: %s", filepath.Base(exited.cmd.Path), exited.log())
	case !idle:
		t.Skipf("Slurm cannot start here: the node is not idle within 30s (%s)\nslurmctld: %s\nslurmd: %s",
			strings.TrimSpace(string(out)), ctld.log(), slurmd.log())
	}

	recipe, err := filepath.Abs("dflow.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := filepath.Abs("../../specs/seed.hcl")
	if err != nil {
		t.Fatal(err)
	}
	token := randomHex(t)
	jobEnv := append(env, "DFLOW="+dflow, "DFLOW_CLUSTER_TOKEN="+token)
	// The recipe's workers join the first node by its hostname; where it
	// does not resolve, by loopback.
	if h, err := os.Hostname(); err != nil || !resolves(h) {
		t.Logf("the hostname %q does not resolve: the workers join 127.0.0.1", h)
		jobEnv = append(jobEnv, "DFLOW_HOST=127.0.0.1")
	}
	output := func(id string) string {
		b, _ := os.ReadFile(filepath.Join(dir, "job-"+id+".out"))
		return string(b)
	}
	// The jobs run side by side, each 3 of the node's 12 CPUs (as
	// slurm.conf declares them), each its own server's port.
	submit := func(t *testing.T, args ...string) (id string) {
		t.Helper()
		// The coordinator and three workers on the one node: the
		// recipe's one task per node is the cluster's, not this test's.
		sb := command(append(slices.Clip(jobEnv), fmt.Sprintf("DFLOW_PORT=%d", freePort(t))), bins["sbatch"],
			append([]string{"--parsable", "--nodes=1", "--ntasks-per-node=3", "--chdir=" + dir,
				"--output=" + filepath.Join(dir, "job-%j.out"), recipe}, args...)...)
		out, err := sb.CombinedOutput()
		if err != nil {
			t.Fatalf("sbatch: %v\n%s", err, out)
		}
		id = strings.TrimSpace(strings.Split(string(out), ";")[0])
		t.Cleanup(func() { command(env, bins["scancel"], id).Run() })
		return id
	}
	// wait waits until the job has ended, or, with a pattern, until its
	// output matches it (reading every 100ms, for at most 90s), looking
	// meanwhile at every command line on the machine for the token.
	wait := func(t *testing.T, id, pattern string) (state, exitCode, out string) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			if p := tokenOnCommandLine(token); p != "" {
				t.Errorf("the token shows on a command line, as ps shows it: %s", p)
			}
			if pattern != "" && regexp.MustCompile(pattern).MatchString(output(id)) {
				return "", "", output(id)
			}
			show, _ := command(env, bins["scontrol"], "show", "job", id, "-o").Output()
			if m := regexp.MustCompile(`JobState=(\S+)`).FindSubmatch(show); m != nil && finished[string(m[1])] {
				code := regexp.MustCompile(`ExitCode=(\S+)`).FindSubmatch(show)
				if pattern != "" || code == nil {
					t.Fatalf("job %s ended (%s) before its output matched %q:\n%s", id, show, pattern, output(id))
				}
				return string(m[1]), string(code[1]), output(id)
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s not done within 90s: %s\noutput:\n%s\nslurmctld: %s\nslurmd: %s", id, show, output(id), ctld.log(), slurmd.log())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("ok", func(t *testing.T) {
		t.Parallel()
		id := submit(t, spec, "--var", "items=120", "--interval", "0", "--place", "drafter=w2")
		state, code, out := wait(t, id, "")
		t.Logf("job %s: %s, exit %s; its output:\n%s", id, state, code, out)
		if state != "COMPLETED" || code != "0:0" {
			t.Errorf("job %s ended %s, exit %s; want COMPLETED, 0:0", id, state, code)
		}
		for _, want := range []string{
			`(?m)^run ok in `,
			`(?m)^  stage reader +in=0 +out=120 `,
			`(?m)^  stage target +in=120 +out=120 `,
			`(?m)^  stage drafter +in=120 +out=120 `,
			`(?m)^  stage done +in=120 +out=0 `,
			`(?m)^  edge  tokens +shared +produced=120 consumed=120 `,
			`(?m)^  edge  hs +round_robin +produced=120 consumed=120 `,
			`(?m)^  edge  trained +shared +produced=120 consumed=120 `,
			`DFLOW_CLUSTER_TOKEN=<the token you gave> dflow worker --join`, // named, not printed
			`(?m)^dflow: cluster run \S+ on w0, w1, w2: .*; drafter w2,w2,w2;`,
			`(?m)^dflow\.sbatch: worker w0 on `,
			`(?m)^dflow\.sbatch: dflow run exited 0$`,
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("the job's output has no match for %s", want)
			}
		}
		// One worker per task, each in the run.
		for task := 0; task < 3; task++ {
			if w := fmt.Sprintf("dflow worker w%d: run %s: ok\n", task, runID(out)); !strings.Contains(out, w) {
				t.Errorf("no line %q: worker w%d did not take part in the run or did not end it ok", w, task)
			}
		}
		if strings.Contains(out, token) {
			t.Errorf("the token shows in the job's output")
		}
	})

	t.Run("failed", func(t *testing.T) {
		t.Parallel()
		// A run that fails (here: a spec that is not there) fails the
		// job with dflow run's exit status.
		id := submit(t, filepath.Join(dir, "missing.hcl"))
		state, code, out := wait(t, id, "")
		if state != "FAILED" || code != "1:0" || !strings.Contains(out, "cannot read spec") {
			t.Errorf("job %s ended %s, exit %s; want FAILED, 1:0 and the error. Its output:\n%s", id, state, code, out)
		}
	})

	t.Run("drain", func(t *testing.T) {
		t.Parallel()
		// SIGINT to the batch shell (what --signal=B:INT@120 sends before
		// the time limit) drains the run: exit 130, interrupted, every
		// item produced consumed.
		id := submit(t, spec, "--var", "items=1000000", "--interval", "0")
		wait(t, id, `(?m)^dflow worker w\d: run \S+: reader\[0\]`)
		if out, err := command(env, bins["scancel"], "--batch", "--signal=INT", id).CombinedOutput(); err != nil {
			t.Fatalf("scancel --batch --signal=INT %s: %v\n%s", id, err, out)
		}
		state, code, out := wait(t, id, "")
		t.Logf("job %s: %s, exit %s; its output:\n%s", id, state, code, out)
		if state != "FAILED" || code != "130:0" || !regexp.MustCompile(`(?m)^run interrupted in `).MatchString(out) {
			t.Errorf("job %s ended %s, exit %s; want FAILED, 130:0 and the run interrupted. Its output:\n%s", id, state, code, out)
		}
		edges := regexp.MustCompile(`(?m)^  edge  (\S+) +\S+ +produced=(\d+) consumed=(\d+) `).FindAllStringSubmatch(out, -1)
		if len(edges) != 3 {
			t.Errorf("the summary has %d edge lines, want 3. The job's output:\n%s", len(edges), out)
		}
		for _, e := range edges {
			if e[2] == "0" || e[2] != e[3] {
				t.Errorf("edge %s: produced %s, consumed %s after the drain; want as many, not 0", e[1], e[2], e[3])
			}
		}
	})
}

// finished are the states of a job that has ended.
var finished = map[string]bool{"COMPLETED": true, "FAILED": true, "CANCELLED": true, "TIMEOUT": true,
	"NODE_FAIL": true, "OUT_OF_MEMORY": true, "BOOT_FAIL": true, "DEADLINE": true, "PREEMPTED": true}

// runID is the cluster run's id in a job's output, from the
// coordinator's placement line.
func runID(out string) string {
	if m := regexp.MustCompile(`dflow: cluster run (\S+) on `).FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return "(no placement line)"
}

// tokenOnCommandLine is the command line of a process that has the
// token in it, or "".
func tokenOnCommandLine(token string) string {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(token)) {
			return p + ": " + string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
	return ""
}

type daemon struct {
	cmd  *exec.Cmd
	out  string
	done chan struct{}
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *daemon) log() string {
	b, _ := os.ReadFile(d.out)
	return strings.TrimSpace(string(b))
}

// startDaemon starts a Slurm daemon in the foreground, its output in a
// file of dir, and stops it when the test ends (SIGTERM, then SIGKILL
// after 10s).
func startDaemon(t *testing.T, dir string, env []string, path string, args ...string) *daemon {
	t.Helper()
	d := &daemon{out: filepath.Join(dir, filepath.Base(path)+".out"), done: make(chan struct{})}
	f, err := os.Create(d.out)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = command(env, path, args...)
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := d.cmd.Start(); err != nil {
		f.Close()
		t.Skipf("Slurm cannot start here: %s: %v", path, err)
	}
	go func() {
		d.cmd.Wait()
		f.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
			d.cmd.Process.Kill()
			<-d.done
		}
	})
	return d
}

// startMunge starts munged with a key made up here, its socket in dir,
// and gives slurm.conf's lines for it.
func startMunge(t *testing.T, dir string) string {
	t.Helper()
	munged, err := lookSbin("munged")
	if err != nil {
		t.Skip("Slurm cannot start here: this Slurm has no auth/none and munged is not installed (Debian: apt-get install munge)")
	}
	mdir := mkdir(t, dir, "munge")
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mdir, "munge.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(mdir, "munge.socket")
	startDaemon(t, mdir, os.Environ(), munged, "--foreground", "--force", "--socket="+sock,
		"--key-file="+filepath.Join(mdir, "munge.key"), "--pid-file="+filepath.Join(mdir, "munged.pid"),
		"--seed-file="+filepath.Join(mdir, "munged.seed"), "--log-file="+filepath.Join(mdir, "munged.log"))
	if !testutil.Within(10*time.Second, func() bool {
		_, err := os.Stat(sock)
		return err == nil
	}) {
		t.Skipf("Slurm cannot start here: munged made no socket within 10s")
	}
	return "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" + sock + "\n"
}

// hasPlugin says whether a Slurm plugin file is in one of the places
// Debian and a build from source put them.
func hasPlugin(name string) bool {
	for _, pattern := range []string{"/usr/lib/*/slurm-wlm/", "/usr/lib*/slurm/", "/usr/local/lib*/slurm/"} {
		if m, _ := filepath.Glob(pattern + name); len(m) > 0 {
			return true
		}
	}
	return false
}

// lookSbin finds a command on the PATH or in the sbin folders, which a
// user's PATH may lack.
func lookSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// slurmEnv is this process's environment for Slurm's commands: SLURM_CONF
// names the test's slurm.conf, and no SLURM_ variable of a job this test
// may itself run in is passed on.
func slurmEnv(conf string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") && !strings.HasPrefix(kv, "DFLOW_") {
			env = append(env, kv)
		}
	}
	return append(env, "SLURM_CONF="+conf)
}

func command(env []string, path string, args ...string) *exec.Cmd {
	c := exec.Command(path, args...)
	c.Env = env
	return c
}

func resolves(host string) bool {
	addrs, err := net.LookupHost(host)
	return err == nil && len(addrs) > 0
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func mkdir(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
