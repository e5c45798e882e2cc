package host

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/report"
)

// pipeline loads src for a run of its own (Drain, when not nil, drains
// it), whose deadlock detector confirms a stuck state for confirm.
func (f *fixture) pipeline(src string, drain chan struct{}, confirm time.Duration) *engine.Pipeline {
	f.t.Helper()
	g, diags := (&graph.Loader{Catalog: f.reg}).Load("p.hcl", []byte(src))
	if diags.HasErrors() {
		f.t.Fatal(diags)
	}
	p, err := engine.New(g, engine.Options{Registry: f.reg, Drain: drain, DeadlockConfirm: confirm})
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// execute runs p, failing the test if it has not ended by the deadline.
func execute(t *testing.T, p *engine.Pipeline, limit time.Duration) (*report.Report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	rep, err := p.Execute(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the run was still going after %v (err %v)", limit, err)
	}
	return rep, err
}

// checkDeadlock checks the error of a run of plugintest.DeadlockSpec: the cycle
// named through the plugin stage's replicas.
func checkDeadlock(t *testing.T, rep *report.Report, err error) {
	t.Helper()
	var d *engine.Deadlock
	if !errors.As(err, &d) {
		t.Fatalf("err = %v, want a *engine.Deadlock", err)
	}
	msg := err.Error()
	t.Log(msg)
	if rep.Status != report.Failed || !strings.Contains(rep.Error, "deadlock") {
		t.Errorf("status %s, error %q", rep.Status, rep.Error)
	}
	for _, re := range []string{
		`\n    reader\[0\] waits to send on tokens\[[0134]\] \(full, 4 of 4\), read by target\[[0134]\]\n    target\[[0134]\] waits to send on hs\[[01]\] \(full, 4 of 4\), read by drafter\[[01]\]`,
		`target\[2\] waits for input on tokens\[2\] \(empty\), fed by reader\[0\]`,
		`waits at stage drafter's group step for drafter\[2\] \(2 of 3 there\)`,
		`--set edge\.(hs|tokens)\.policy=shared`,
	} {
		if !regexp.MustCompile(re).MatchString(msg) {
			t.Errorf("error does not match %s", re)
		}
	}
}

// TestPluginDeadlockStopsDrain: a drain of that run cannot complete; it
// ends on its own, as an abort that says so.
func TestPluginDeadlockStopsDrain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.h.Load("tp", wrapper(t, f.dir, "tp", "serve"), f.reg); err != nil {
		t.Fatal(err)
	}
	// Confirm slowly, so that the drain starts after the deadlock forms
	// and before it is declared.
	drain := make(chan struct{})
	p := f.pipeline(plugintest.DeadlockSpec("tp/pass"), drain, 3*time.Second)
	type result struct {
		rep *report.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		rep, err := p.Execute(ctx)
		done <- result{rep, err}
	}()
	testutil.Eventually(t, 30*time.Second, p.Deadlocked, "the deadlock to form")
	close(drain)
	res := <-done
	var d *engine.Deadlock
	if !errors.As(res.err, &d) || !d.Draining {
		t.Fatalf("err = %v, want a drain's *engine.Deadlock", res.err)
	}
	if res.rep.Status != report.Aborted || !strings.HasPrefix(res.rep.Error, "drain cannot complete: deadlock") {
		t.Errorf("status %s, error %q", res.rep.Status, res.rep.Error)
	}
}

// TestOldPluginStaysOpaque: a plugin that does not say Waiting is never
// judged: the same deadlock is not declared (the run goes on until it is
// cancelled), however short the confirm window.
func TestOldPluginStaysOpaque(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.h.Load("op", wrapper(t, f.dir, "op", "opaque"), f.reg); err != nil {
		t.Fatal(err)
	}
	p := f.pipeline(plugintest.DeadlockSpec("op/pass"), nil, 100*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		rep *report.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := p.Execute(ctx)
		done <- result{rep, err}
	}()
	// Twenty confirm windows in which the run makes no progress: the
	// detector would have declared it, were the plugin's stage judged.
	var stillSince time.Time
	var lastItems int64 = -1
	testutil.Eventually(t, 30*time.Second, func() bool {
		select {
		case res := <-done:
			t.Fatalf("the run ended: status %s, err %v", res.rep.Status, res.err)
		default:
		}
		var items int64
		for _, e := range p.Snapshot().Edges {
			items += e.Produced + e.Consumed
		}
		if items != lastItems {
			lastItems, stillSince = items, time.Now()
		}
		return time.Since(stillSince) > 2*time.Second
	}, "the run to stop moving for 2s")
	cancel()
	res := <-done
	var d *engine.Deadlock
	if errors.As(res.err, &d) {
		t.Fatalf("an opaque plugin's stage was judged: %v", res.err)
	}
	// And the plugin and the same wiring with the new SDK is the one
	// that is declared (the conformance suite's Deadlock case, plugins/conformance).
}
