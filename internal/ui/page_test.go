package ui

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/report"
	"github.com/dflow-dev/dflow/run"
)

// seedReport runs a short seed pipeline and returns its report, with its
// diagnosis.
func seedReport(t *testing.T, sets ...string) *report.Report {
	t.Helper()
	sets = append([]string{"stage.reader.config.count=60", "stage.target.config.service_time=5ms",
		"stage.drafter.config.service_time=2500us"}, sets...)
	g := loadSpec(t, "../../specs/seed.hcl", sets...)
	rep, _ := run.Run(context.Background(), g, run.Options{Registry: registry(), Interval: 20 * time.Millisecond})
	rep.Diagnosis = monitor.Diagnose(g, rep, nil)
	return rep
}

// serveSaved serves runs and opens the page in Chromium at width×900,
// waiting until every panel shows its run's end.
func serveSaved(t *testing.T, width int, runs ...*Run) (context.Context, func()) {
	t.Helper()
	exe := browser(t)
	url, shutdown, err := Serve("127.0.0.1:0", runs...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := browse(t, exe, chromedp.WindowSize(width, 900))
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(
		`[...document.querySelectorAll(".status")].filter(e => e.textContent !== "report" && e.textContent !== "running").length === %d`, len(runs)),
		chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatal(err)
	}
	return ctx, func() { cancel(); shutdown() }
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

// TestSummaryFrame: a saved report's last frame is the run's summary,
// the report's whole-run figures, not its last sample; every sample is a
// frame before it, with each stage's items/s from the series' counts.
func TestSummaryFrame(t *testing.T) {
	rep := seedReport(t)
	if len(rep.Series) < 3 {
		t.Fatalf("%d samples", len(rep.Series))
	}
	r := Saved(rep, nil, "seed")
	if len(r.frames) != len(rep.Series)+1 {
		t.Fatalf("%d frames for %d samples", len(r.frames), len(rep.Series))
	}
	f := r.frames[len(r.frames)-1]
	if !f.Summary || f.T != rep.WallSeconds || f.Status != rep.Status {
		t.Fatalf("last frame %+v", f)
	}
	for name, st := range rep.Stages {
		var n int64
		for i, rr := range st.Replicas {
			life := rr.BusySeconds + rr.IdleSeconds + rr.BlockedSeconds
			if got := f.Stages[name].Busy[i]; math.Abs(got-rr.BusySeconds/life) > 1e-9 {
				t.Errorf("%s[%d] busy %.3f in the summary, the report's %.3f", name, i, got, rr.BusySeconds/life)
			}
			n += rr.ItemsIn
			if n == 0 {
				n = rr.ItemsOut
			}
		}
		if got := f.Rate[name]; math.Abs(got-float64(n)/rep.WallSeconds) > 1e-6 {
			t.Errorf("%s: %.2f items/s in the summary, want %.2f", name, got, float64(n)/rep.WallSeconds)
		}
	}
	for name, e := range rep.Edges {
		for i, q := range e.Queues {
			if f.MeanQueues[name][i] != q.MeanDepth || f.MaxQueues[name][i] != q.MaxDepth {
				t.Errorf("%s queue %d: mean %v max %v in the summary, the report's %v %v", name, i, f.MeanQueues[name][i], f.MaxQueues[name][i], q.MeanDepth, q.MaxDepth)
			}
		}
	}
	// items/s from the series' cumulative counts
	a, b := rep.Series[1], rep.Series[2]
	want := float64(b.Items["target"]-a.Items["target"]) / (b.T - a.T)
	if got, ok := r.frames[2].Rate["target"]; !ok || math.Abs(got-want) > 1e-9 || b.Items["target"] == 0 && a.Items["target"] == 0 && rep.Series[len(rep.Series)-1].Items["target"] == 0 {
		t.Errorf("target %v items/s at frame 2, want %v (samples' items %v, %v)", got, want, a.Items, b.Items)
	}
}

// TestPageCharts: a saved report's page has a throughput and a busy-share
// chart per stage and a depth chart per edge, each with both axes, tick
// labels, units, a line (or the band of a stage of many replicas) and
// the replay position, except those zero throughout, which a note names
// instead; the final frame shows the report's whole-run figures; the
// legend and the slider say what they are.
func TestPageCharts(t *testing.T) {
	rep := seedReport(t)
	ctx, done := serveSaved(t, 1400, Saved(rep, nil, "seed"))
	defer done()

	type chartInfo struct {
		Key, Caption     string
		XTicks, YTicks   int
		Labels           []string
		Lines, Bands     int
		Hidden           bool
		Marker           float64
		Capacity, Legend string
	}
	charts := eval[[]chartInfo](t, ctx, `[...document.querySelectorAll(".chart")].map(c => ({
		key: c.dataset.chart, caption: c.querySelector("figcaption").textContent,
		xTicks: c.querySelectorAll(".x-axis text").length, yTicks: c.querySelectorAll(".y-axis text").length,
		labels: [...c.querySelectorAll(".axis-label")].map(e => e.textContent),
		lines: [...c.querySelectorAll("polyline.series")].filter(p => p.getAttribute("points").split(" ").length >= 2).length,
		bands: c.querySelectorAll("polygon.band").length, hidden: c.getBoundingClientRect().height === 0,
		marker: +(c.querySelector("line.marker") || {dataset: {t: -1}}).dataset.t,
		capacity: (c.querySelector(".capacity-label") || {}).textContent || "",
		legend: c.querySelector(".chart-legend").textContent}))`)
	byKey := map[string]chartInfo{}
	for _, c := range charts {
		byKey[c.Key] = c
	}
	want := map[string]string{}
	for name, st := range rep.Stages {
		want["stage/"+name+"/rate"] = "items/s"
		want["stage/"+name+"/busy"] = "% of time busy"
		_ = st
	}
	for name := range rep.Edges {
		want["edge/"+name+"/depth"] = "items queued"
	}
	// zero throughout: every sample's value is one the chart prints as 0
	zero := func(key string) bool {
		parts := strings.Split(key, "/")
		for _, p := range rep.Series {
			switch {
			case parts[0] == "edge":
				for _, d := range p.Queues[parts[1]] {
					if d != 0 {
						return false
					}
				}
			case parts[2] == "busy":
				for _, b := range p.Utilization[parts[1]] {
					if 100*b > 0.5 {
						return false
					}
				}
			default:
				return false
			}
		}
		return true
	}
	note := eval[string](t, ctx, `document.querySelector(".zero-note").textContent`)
	for key, unit := range want {
		c, ok := byKey[key]
		if !ok {
			t.Errorf("no chart %s on the page (charts: %v)", key, charts)
			continue
		}
		if z := zero(key); c.Hidden != z || z && !strings.Contains(note, c.Caption) {
			t.Errorf("chart %s: hidden %v, zero throughout %v; the note says %q", key, c.Hidden, z, note)
		}
		if c.Hidden {
			continue
		}
		if c.XTicks < 2 || c.YTicks < 2 || fmt.Sprint(c.Labels) != fmt.Sprintf("[time (s) %s]", unit) || c.Lines < 1 && c.Bands != 2 {
			t.Errorf("chart %s: %d x ticks, %d y ticks, axis labels %q, %d lines", key, c.XTicks, c.YTicks, c.Labels, c.Lines)
		}
		if math.Abs(c.Marker-rep.WallSeconds) > 1e-9 {
			t.Errorf("chart %s: replay marker at %v, want the run's end %v", key, c.Marker, rep.WallSeconds)
		}
		if strings.HasPrefix(key, "edge/") && c.Capacity != fmt.Sprintf("capacity %d", rep.Edges[strings.Split(key, "/")[1]].Capacity) {
			t.Errorf("chart %s: capacity line %q", key, c.Capacity)
		}
	}
	if c := byKey["stage/drafter/busy"]; c.Lines != 3 || c.Bands != 0 {
		t.Errorf("drafter busy share: %d lines and %d bands, want one line per replica", c.Lines, c.Bands)
	}
	if c := byKey["stage/target/busy"]; c.Lines != 0 || c.Bands != 2 {
		t.Errorf("target busy share: %d lines and %d bands, want the 5 replicas' band", c.Lines, c.Bands)
	}

	// The final frame is the summary: the report's figures.
	if s := eval[string](t, ctx, `document.querySelector(".showing").textContent`); !strings.Contains(s, "whole run") {
		t.Errorf("the final frame says %q", s)
	}
	for name, st := range rep.Stages {
		for i, rr := range st.Replicas {
			life := rr.BusySeconds + rr.IdleSeconds + rr.BlockedSeconds
			want := fmt.Sprintf("busy %d%%", int(math.Round(100*rr.BusySeconds/life)))
			got := eval[string](t, ctx, fmt.Sprintf(`document.querySelector('[data-replica="%s/%d"] .rep-text').textContent`, name, i))
			if !strings.HasPrefix(got, want) {
				t.Errorf("%s[%d] shows %q at the end, the report's whole run is %q", name, i, got, want)
			}
		}
		var n int64
		for _, rr := range st.Replicas {
			n += rr.ItemsIn
		}
		if n == 0 {
			for _, rr := range st.Replicas {
				n += rr.ItemsOut
			}
		}
		got := eval[string](t, ctx, fmt.Sprintf(`document.querySelector('[data-rate="%s"]').textContent`, name))
		if !strings.HasPrefix(got, fmt.Sprintf("%.1f items/s", float64(n)/rep.WallSeconds)) && !strings.HasPrefix(got, fmt.Sprintf("%.0f items/s", float64(n)/rep.WallSeconds)) {
			t.Errorf("%s shows %q, the report's %d items in %.2fs", name, got, n, rep.WallSeconds)
		}
	}
	for name, e := range rep.Edges {
		for i, q := range e.Queues {
			got := eval[string](t, ctx, fmt.Sprintf(`document.querySelector('[data-queue="%s/%d"]').textContent`, name, i))
			// A mean exactly between two tenths (0.25) rounds to even in
			// Go and up in the page's toFixed: either is the report's.
			up := fmt.Sprintf("mean %.1f/%d", math.Floor(q.MeanDepth*10+0.5)/10, e.Capacity)
			if want := fmt.Sprintf("mean %.1f/%d", q.MeanDepth, e.Capacity); got != want && got != up {
				t.Errorf("edge %s queue %d shows %q at the end, want the report's %q", name, i, got, want)
			}
		}
	}
	// Replaying a sample shows that sample, marked on the charts.
	first := eval[[]string](t, ctx, `(() => { const s = document.querySelector(".replay input"); s.value = 0; s.dispatchEvent(new Event("input"));
		return [document.querySelector(".showing").textContent, document.querySelector(".chart line.marker").dataset.t]; })()`)
	if !strings.HasPrefix(first[0], "t = ") || first[1] != fmt.Sprint(rep.Series[0].T) {
		t.Errorf("replaying frame 0 shows %q, marker at %s, want the first sample at %v", first[0], first[1], rep.Series[0].T)
	}
	legend := eval[string](t, ctx, `document.querySelector("header").textContent`)
	replay := eval[string](t, ctx, `document.querySelector(".replay").textContent + "|" + document.querySelector(".replay input").getAttribute("aria-label")`)
	if !strings.Contains(legend, "queued") || !strings.Contains(legend, "full") || !strings.Contains(legend, "empty") || !strings.Contains(legend, "starved") {
		t.Errorf("the legend %q lacks the queue's colours", legend)
	}
	if !strings.HasPrefix(replay, "replay") || !strings.Contains(replay, "frame") {
		t.Errorf("the slider's label %q", replay)
	}
}

// TestBusyBand: the busy share of a stage of many replicas (8 targets)
// is drawn as their spread, a band from the least to the most busy, the
// middle half and the median, with the least busy replica's own line,
// named in the legend; not a line per replica.
func TestBusyBand(t *testing.T) {
	rep := seedReport(t, "stage.target.replicas=8")
	ctx, done := serveSaved(t, 1400, Saved(rep, nil, "eight targets"))
	defer done()
	type band struct {
		Lines, Bands, Medians, Least int
		Named, Legend                string
	}
	got := eval[band](t, ctx, `(c => ({lines: c.querySelectorAll("polyline.series").length, bands: c.querySelectorAll("polygon.band").length,
		medians: c.querySelectorAll("polyline.median").length, least: c.querySelectorAll("polyline.least").length,
		named: c.dataset.least || "", legend: c.querySelector(".chart-legend").textContent}))(document.querySelector('[data-chart="stage/target/busy"]'))`)
	// the least busy: the lowest mean busy share over the samples
	least, low := -1, math.Inf(1)
	for i := range 8 {
		var sum float64
		for _, p := range rep.Series {
			sum += 100 * p.Utilization["target"][i]
		}
		if m := sum / float64(len(rep.Series)); m < low-1e-9 {
			least, low = i, m
		}
	}
	if got.Lines != 0 || got.Bands != 2 || got.Medians != 1 || got.Least != 1 {
		t.Errorf("8 targets' busy share: %d lines, %d bands, %d medians, %d least-busy lines; want the band, the median and the least busy", got.Lines, got.Bands, got.Medians, got.Least)
	}
	if got.Named != fmt.Sprint(least) || !strings.Contains(got.Legend, fmt.Sprintf("least busy: replica %d, %d%% on average", least, int(math.Round(low)))) {
		t.Errorf("least busy named %q, legend %q; want replica %d (mean %.1f%%)", got.Named, got.Legend, least, low)
	}
}

// TestFailedReportShowsError: a failed run's error is on the page.
func TestFailedReportShowsError(t *testing.T) {
	rep := seedReport(t, "stage.drafter.config.fail_after=3")
	if rep.Status != report.Failed || rep.Error == "" {
		t.Fatalf("status %q, error %q", rep.Status, rep.Error)
	}
	ctx, done := serveSaved(t, 1400, Saved(rep, nil, "failing"))
	defer done()
	got := eval[[]string](t, ctx, `(() => { const e = document.querySelector(".run .error"); return e ? [e.textContent, String(e.getBoundingClientRect().height > 0)] : ["", "false"]; })()`)
	if !strings.Contains(got[0], rep.Error) || got[1] != "true" {
		t.Errorf("error on the page %q (visible %s), the report's %q", got[0], got[1], rep.Error)
	}
	if n := eval[int](t, ctx, `[...document.querySelectorAll(".run .error")].filter(e => e.getBoundingClientRect().height > 0).length`); n != 1 {
		t.Errorf("%d errors shown", n)
	}
}

// TestTwoReportsReadable: two reports at 1400 px each draw their graph at
// 90% of its natural size or more (11 px text stays 10 px or more).
func TestTwoReportsReadable(t *testing.T) {
	a, b := seedReport(t), seedReport(t, "edge.hs.policy=shared")
	ctx, done := serveSaved(t, 1400, Saved(a, nil, "round_robin"), Saved(b, nil, "shared"))
	defer done()
	scales := eval[[]float64](t, ctx, `[...document.querySelectorAll("svg.graph")].map(s => s.getBoundingClientRect().width / s.viewBox.baseVal.width)`)
	if len(scales) != 2 {
		t.Fatalf("%d graphs", len(scales))
	}
	for i, s := range scales {
		if s < 0.9 {
			t.Errorf("graph %d drawn at %.2f of its size at 1400 px", i, s)
		}
	}
}

// TestClusterReport: a cluster report's replicas show their worker, and
// no queue shows a depth above its capacity; a report whose depth does
// exceed it (an older dflow's) says what the figure counts.
func TestClusterReport(t *testing.T) {
	rep := seedReport(t)
	// as a cluster report: the coordinator names each replica's worker
	b, _ := json.Marshal(rep)
	var over report.Report
	json.Unmarshal(b, &over)
	for name, st := range rep.Stages {
		for i := range st.Replicas {
			st.Replicas[i].Worker = fmt.Sprintf("w%d", i%2)
		}
		rep.Stages[name] = st
	}
	rep.Stages["drafter"].Replicas[1].Worker = "w1>w2"
	over.Series[1].Queues["hs"][0] = over.Edges["hs"].Capacity + 1
	ctx, done := serveSaved(t, 1400, Saved(rep, nil, "cluster"), Saved(&over, nil, "over"))
	defer done()
	workers := eval[[]string](t, ctx, `[...document.querySelectorAll('.run[data-run="0"] [data-worker^="drafter/"]')].map(e => e.textContent)`)
	if fmt.Sprint(workers) != "[w0 w1>w2 w0]" {
		t.Errorf("drafter workers on the page %q", workers)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('.run[data-run="1"] [data-worker]').length`); n != 0 {
		t.Errorf("a report without workers shows %d", n)
	}
	// every frame of each run: no depth shown above capacity unless it says so
	type shown struct{ Run, Text string }
	texts := eval[[]shown](t, ctx, `(() => {
		const out = [];
		for (const run of document.querySelectorAll(".run")) {
			const s = run.querySelector(".replay input");
			for (let i = 0; i <= +s.max; i++) {
				s.value = i; s.dispatchEvent(new Event("input"));
				for (const q of run.querySelectorAll("[data-queue]")) out.push({run: run.dataset.run, text: q.textContent + " | " + q.parentNode.querySelector("title").textContent});
			}
		}
		return out; })()`)
	var overs int
	for _, s := range texts {
		var d, c float64
		text := strings.TrimPrefix(s.Text, "mean ")
		if _, err := fmt.Sscanf(text, "%g/%g", &d, &c); err != nil {
			t.Fatalf("queue text %q", s.Text)
		}
		if d > c {
			overs++
			if s.Run != "1" || !strings.Contains(s.Text, "over capacity") || !strings.Contains(s.Text, "in transit") {
				t.Errorf("run %s shows %q", s.Run, s.Text)
			}
		}
	}
	if overs != 1 {
		t.Errorf("%d queue figures over capacity shown, want the one the report has", overs)
	}
}

// TestReportScreenshot writes the page of a saved report, $DFLOW_UI_REPORT,
// as `dflow ui` shows it, to $DFLOW_UI_REPORT_SCREENSHOT
// (docs/img/ui-report.png is made with it, from specs/seed.hcl's report):
//
//	go run ./cmd/dflow run specs/seed.hcl --report /tmp/r.json --interval 200ms
//	DFLOW_UI_REPORT=/tmp/r.json DFLOW_UI_REPORT_SCREENSHOT=$PWD/docs/img/ui-report.png go test ./internal/ui -run ReportScreenshot
func TestReportScreenshot(t *testing.T) {
	in, out := os.Getenv("DFLOW_UI_REPORT"), os.Getenv("DFLOW_UI_REPORT_SCREENSHOT")
	if in == "" || out == "" {
		t.Skip("set DFLOW_UI_REPORT=REPORT.json and DFLOW_UI_REPORT_SCREENSHOT=FILE.png to write the screenshot")
	}
	rep, err := report.Read(in)
	if err != nil {
		t.Fatal(err)
	}
	g := loadSpec(t, filepath.Join("../..", rep.Spec), rep.Overrides.Sets...)
	ctx, done := serveSaved(t, 1400, Saved(rep, g, rep.Spec+" ("+filepath.Base(in)+")"))
	defer done()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
}
