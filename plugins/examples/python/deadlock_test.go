package python

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/report"
)

func (f *fixture) execute(t *testing.T, src string) (*report.Report, error) {
	t.Helper()
	g, diags := (&graph.Loader{Catalog: f.reg}).Load("p.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := engine.Run(ctx, g, engine.Options{Registry: f.reg})
	if ctx.Err() != nil {
		t.Fatalf("the run was still going after a minute (err %v)\n%s", err, f.stderr.String())
	}
	return rep, err
}

// TestPythonDeadlockNamed: the seed's deadlock through a Python plugin
// stage fails within seconds, naming the cycle through its replicas.
// Before the module said Waiting, the run hung for ever.
func TestPythonDeadlockNamed(t *testing.T) {
	f := newFixture(t)
	start := time.Now()
	rep, err := f.execute(t, plugintest.DeadlockSpec("py/stats"))
	t.Logf("ended after %v", time.Since(start))
	var d *engine.Deadlock
	if !errors.As(err, &d) {
		t.Fatalf("err = %v, want a *engine.Deadlock\n%s", err, f.stderr.String())
	}
	t.Log(err)
	if rep.Status != report.Failed {
		t.Errorf("status %s", rep.Status)
	}
	for _, re := range []string{
		`target\[[0134]\] waits to send on hs\[[01]\] \(full, 4 of 4\), read by drafter\[[01]\]`,
		`target\[2\] waits for input on tokens\[2\] \(empty\), fed by reader\[0\]`,
		`waits at stage drafter's group step for drafter\[2\] \(2 of 3 there\)`,
	} {
		if !regexp.MustCompile(re).MatchString(err.Error()) {
			t.Errorf("error does not match %s", re)
		}
	}
}

// TestNoDeadlockWhilePythonComputes: a Python node working 2s on each
// item while everything else waits is no deadlock, with the detector
// confirming in 100ms.
func TestNoDeadlockWhilePythonComputes(t *testing.T) {
	f := newFixture(t)
	old := engine.DeadlockConfirm
	engine.DeadlockConfirm = 100 * time.Millisecond
	t.Cleanup(func() { engine.DeadlockConfirm = old })
	rep, err := f.execute(t, fmt.Sprintf(passSpec, 2, 1, "sleep = 2"))
	if err != nil || rep.Status != report.OK || rep.Edges["b"].Consumed != 2 {
		t.Fatalf("status %s, err %v, %d items out\n%s", rep.Status, err, rep.Edges["b"].Consumed, f.stderr.String())
	}
}
