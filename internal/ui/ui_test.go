package ui

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/report"
	"github.com/dflow-dev/dflow/run"
)

func registry() *nodes.Registry {
	r := nodes.NewRegistry()
	synthetic.Register(r)
	return r
}

func loadSpec(t *testing.T, file string, sets ...string) *graph.Graph {
	t.Helper()
	l := &graph.Loader{Catalog: registry(), Sets: sets}
	g, diags := l.LoadFile(file)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return g
}

// browser finds a headless Chromium, or skips the test.
func browser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium found (apt-get install chromium): skipping the browser test")
	return ""
}

func browse(t *testing.T, exe string, extra ...chromedp.ExecAllocatorOption) (context.Context, context.CancelFunc) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1500, 900),
		chromedp.Flag("proxy-server", "direct://"), chromedp.Flag("proxy-bypass-list", "*"))
	opts = append(opts, extra...)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	ctx, cancelC := context.WithTimeout(ctx, 180*time.Second) // a deadline: the browser tests took over 60s on a loaded 2-core CI
	return ctx, func() { cancelC(); cancelB(); cancelA() }
}

// livePipeline starts g with a live page; wait returns its report once
// the run has ended and the page has been told.
func livePipeline(t *testing.T, g *graph.Graph, title string, drain chan struct{}) (url string, wait func() *report.Report, shutdown func()) {
	p, err := run.New(g, run.Options{Registry: registry(), Interval: 100 * time.Millisecond, Drain: drain})
	if err != nil {
		t.Fatal(err)
	}
	r := Live(g, title, p.Snapshot, 100*time.Millisecond)
	url, shutdown, err = Serve("127.0.0.1:0", r)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *report.Report, 1)
	go func() {
		rep, err := p.Run(context.Background())
		if err != nil {
			t.Error(err)
		}
		rep.Diagnosis = monitor.Diagnose(g, rep, nil)
		r.Finish(rep)
		done <- rep
	}()
	return url, sync.OnceValue(func() *report.Report { return <-done }), shutdown
}

// TestPageInBrowser drives headless Chromium against a running seed
// pipeline: the page shows every stage and every replica, a queue's depth
// on the page changes as the run proceeds, and the run's end and
// diagnosis arrive.
func TestPageInBrowser(t *testing.T) {
	exe := browser(t)
	// A long run, drained once the page has shown what it should.
	g := loadSpec(t, "../../specs/seed.hcl", "stage.reader.config.count=1000000",
		"stage.target.config.service_time=5ms", "stage.drafter.config.service_time=2500us")
	drain := make(chan struct{})
	url, wait, shutdown := livePipeline(t, g, "seed", drain)
	defer shutdown()
	defer wait()
	var once sync.Once
	stop := func() { once.Do(func() { close(drain) }) }
	defer stop()
	ctx, cancel := browse(t, exe)
	defer cancel()

	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(`[data-replica="drafter/2"]`)); err != nil {
		t.Fatal(err)
	}
	stages, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("[data-stage]")].map(e => e.dataset.stage)`))
	if err != nil {
		t.Fatal(err)
	}
	replicas, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("[data-replica]")].map(e => e.dataset.replica)`))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, s := range g.Stages {
		for i := range s.Replicas {
			want = append(want, fmt.Sprintf("%s/%d", s.Name, i))
		}
	}
	if fmt.Sprint(replicas) != fmt.Sprint(want) {
		t.Errorf("replicas on the page %v, want %v", replicas, want)
	}
	if len(stages) != len(g.Stages) {
		t.Errorf("stages on the page %v", stages)
	}
	// The queue figures change as the run proceeds: the page keeps every
	// text it showed for the hs edge (its items produced and consumed) and
	// its queues' depths until it has shown two (polled in the browser,
	// with a deadline).
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`(() => {
		const e = document.querySelector('[data-edge="hs"]');
		const qs = [...document.querySelectorAll('[data-queue^="hs/"]')].map(q => q.textContent);
		if (!e || qs.length !== 3) return false;
		(window.seen = window.seen || new Set()).add(e.textContent + " | " + qs.join(" "));
		return window.seen.size >= 2;
	})()`, chromedp.WithPollingTimeout(30*time.Second), chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
		t.Fatalf("the hs edge's figures never changed on the page: %v", err)
	}
	seen, _ := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...window.seen]`))
	t.Logf("hs showed %q", seen)
	// items/s per stage while it runs, and the charts follow the run
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`/^[0-9.]+ items\/s$/.test(document.querySelector('[data-rate="target"]').textContent) &&
		document.querySelectorAll('[data-chart="stage/target/rate"] polyline.series').length === 1`,
		chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("no live items/s on the page: %v", err)
	}

	stop()
	rep := wait()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector(".status").textContent === "interrupted"`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil { // a deadline: a loaded CI machine took over 20s
		t.Fatalf("the end of the run never showed: %v", err)
	}
	diagnosis, err := chromedp.Run(ctx, chromedp.Text(".diagnosis"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Diagnosis) == 0 || !strings.Contains(diagnosis, rep.Diagnosis[0]) {
		t.Errorf("diagnosis on the page %q, want %q", diagnosis, rep.Diagnosis)
	}
	// The final frame is the run's summary, as the diagnosis beside it:
	// each replica's busy share of its lifetime.
	for _, name := range []string{"target", "drafter"} {
		for i, rr := range rep.Stages[name].Replicas {
			life := rr.BusySeconds + rr.IdleSeconds + rr.BlockedSeconds
			want := fmt.Sprintf("busy %d%%", int(math.Round(100*rr.BusySeconds/life)))
			got, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector('[data-replica="%s/%d"] .rep-text').textContent`, name, i)))
			if err != nil || !strings.HasPrefix(got, want) {
				t.Errorf("%s[%d] shows %q after the run (%v), the report's whole run %q", name, i, got, err, want)
			}
		}
	}
}

// TestSavedReportsSideBySide: two saved reports, one panel each.
func TestSavedReportsSideBySide(t *testing.T) {
	exe := browser(t)
	var runs []*Run
	for _, policy := range []string{"round_robin", "shared"} {
		g := loadSpec(t, "../../specs/seed.hcl", "edge.hs.policy="+policy, "stage.reader.config.count=60",
			"stage.target.config.service_time=5ms", "stage.drafter.config.service_time=2500us")
		rep, err := run.Run(context.Background(), g, run.Options{Registry: registry(), Interval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, Saved(rep, g, policy), Saved(rep, nil, policy+" (no spec)"))
	}
	url, shutdown, err := Serve("127.0.0.1:0", runs...)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()
	ctx, cancel := browse(t, exe)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`[...document.querySelectorAll(".status")].filter(e => e.textContent === "ok").length === 4`,
		chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatal(err)
	}
	panels, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll(".run h2")].map(e => e.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	statuses, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll(".run")].map(r => r.querySelectorAll("[data-replica]").length + "")`))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(panels) != "[round_robin round_robin (no spec) shared shared (no spec)]" || fmt.Sprint(statuses) != "[10 10 10 10]" {
		t.Errorf("panels %v with %v replicas", panels, statuses)
	}
}

// TestScreenshot writes the page of specs/seed.hcl as it runs, to
// $DFLOW_UI_SCREENSHOT (docs/img/ui-seed.png is made with it):
//
//	DFLOW_UI_SCREENSHOT=$PWD/docs/img/ui-seed.png go test ./internal/ui -run Screenshot
func TestScreenshot(t *testing.T) {
	out := os.Getenv("DFLOW_UI_SCREENSHOT")
	if out == "" {
		t.Skip("set DFLOW_UI_SCREENSHOT=FILE.png to write the screenshot")
	}
	exe := browser(t)
	g := loadSpec(t, "../../specs/seed.hcl")
	// the browser started before the run, which lasts 5 s
	ctx, cancel := browse(t, exe)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatal(err)
	}
	url, wait, shutdown := livePipeline(t, g, "specs/seed.hcl (hs round_robin)", nil)
	defer shutdown()
	defer wait()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx,
		// well into the run: the starved drafter and the full queues show
		chromedp.Poll[bool](`(() => { const m = document.querySelector(".eta"); return m && parseInt(m.textContent) >= 55; })()`,
			chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatal(err)
	}
	if s := eval[string](t, ctx, `document.querySelector(".status").textContent`); s != "running" {
		t.Fatalf("the run had ended (%s) when the page showed 55%%: a loaded machine; run it again", s)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLiveWorkers: a live run across hosts names each replica's worker:
// in the graph as placed, and in every frame as its snapshot says (a
// restart's "a>b"); a run in one process names none.
func TestLiveWorkers(t *testing.T) {
	g := loadSpec(t, "../../specs/seed.hcl")
	where := map[string][]string{}
	for _, s := range g.Stages {
		for i := range s.Replicas {
			where[s.Name] = append(where[s.Name], fmt.Sprintf("w%d", i%2))
		}
	}
	gr := GraphOn(g, "seed", where)
	if w := gr.Stages[1].Workers; len(w) != g.Stages[1].Replicas || w[1] != "w1" {
		t.Errorf("graph workers %v", w)
	}
	if GraphOf(g, "seed").Stages[1].Workers != nil {
		t.Error("a run in one process names workers")
	}
	snap := &report.Snapshot{Elapsed: time.Second, Stages: []report.StageSnapshot{
		{Name: "drafter", Replicas: []report.ReplicaSnapshot{{Worker: "w0"}, {Worker: "w1>w0"}}},
		{Name: "done", Replicas: []report.ReplicaSnapshot{{}}},
	}}
	f := frameOf(snap, nil)
	if w := f.Stages["drafter"].Workers; len(w) != 2 || w[1] != "w1>w0" {
		t.Errorf("frame workers %v", w)
	}
	if f.Stages["done"].Workers != nil {
		t.Errorf("a replica in one process: workers %v", f.Stages["done"].Workers)
	}
}
