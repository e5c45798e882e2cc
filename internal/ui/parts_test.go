package ui

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestTagHysteresis: the "blocked" tag is shown once a replica's blocked
// share has been tagOn or more for tagFrames samples in a row, and stays
// until it has been under tagOff for tagFrames in a row; a share between
// the two thresholds, or a run cut short, changes nothing.
func TestTagHysteresis(t *testing.T) {
	for _, c := range []struct {
		name    string
		blocked []float64
		want    string // a sample each: 1 tagged, 0 not
	}{
		{"steady", []float64{.6, .6, .6, .6}, "0011"},
		{"flickering about the threshold", []float64{.6, .4, .6, .4, .6, .45, .55, .6}, "00000000"},
		{"between the thresholds once shown", []float64{.9, .9, .9, .4, .35, .45, .31, .4}, "00111111"},
		{"off after tagFrames under tagOff", []float64{.9, .9, .9, .2, .2, .1, 0}, "0011100"},
		{"a dip cut short", []float64{.9, .9, .9, .2, .2, .9, .2, .2, .2}, "001111110"},
		{"rising cut short", []float64{.7, .7, .1, .7, .7, .7}, "000001"},
	} {
		var h tagger
		var got strings.Builder
		for _, b := range c.blocked {
			if h.next(b) {
				got.WriteByte('1')
			} else {
				got.WriteByte('0')
			}
		}
		if got.String() != c.want {
			t.Errorf("%s: blocked %v tagged %s, want %s", c.name, c.blocked, got.String(), c.want)
		}
	}
}

// TestFramesTagged: each frame a run adds carries its replicas' tags,
// held from frame to frame per replica; the summary's are the whole
// run's shares at tagOn.
func TestFramesTagged(t *testing.T) {
	r := newRun(partsGraph())
	shares := [][]float64{{.6, 0}, {.6, .2}, {.6, .9}, {.4, .9}, {.2, .9}}
	for _, b := range shares {
		r.add(Frame{Status: "running", Stages: map[string]StageFrame{"work": {Blocked: b}}}, false)
	}
	r.add(Frame{Status: "ok", Summary: true, Stages: map[string]StageFrame{"work": {Blocked: []float64{.2, .55}}}}, true)
	var got []string
	for _, f := range r.frames {
		got = append(got, fmt.Sprint(f.Stages["work"].Tagged))
	}
	want := "[[false false] [false false] [true false] [true false] [true true] [false true]]"
	if fmt.Sprint(got) != want {
		t.Errorf("tags %v, want %s", got, want)
	}
}

// TestSinkStage: a stage no edge leaves is a sink, from the spec's graph
// and from a saved report's edges; a report that does not name its edges'
// ends says none is.
func TestSinkStage(t *testing.T) {
	sinks := func(g Graph) (out []string) {
		for _, s := range g.Stages {
			if s.Sink {
				out = append(out, s.Name)
			}
		}
		return out
	}
	g := loadSpec(t, "../../specs/seed.hcl")
	if got := sinks(GraphOf(g, "seed")); fmt.Sprint(got) != "[done]" {
		t.Errorf("sinks of the seed %v, want [done]", got)
	}
	rep := seedReport(t)
	if got := sinks(Saved(rep, nil, "seed").graph); fmt.Sprint(got) != "[done]" {
		t.Errorf("sinks of the seed's report %v, want [done]", got)
	}
	for name, e := range rep.Edges {
		e.From, e.To = "", ""
		rep.Edges[name] = e
	}
	if got := sinks(Saved(rep, nil, "seed").graph); got != nil {
		t.Errorf("sinks of a report without its edges' ends %v, want none", got)
	}
}

// partsGraph is a small live pipeline for the page's parts: a source, a
// stage of two replicas and a sink, joined by two shared edges.
func partsGraph() Graph {
	return Graph{Title: "parts", Live: true,
		Stages: []Stage{{Name: "src", Node: "synthetic_source", Replicas: 1, Source: true},
			{Name: "work", Node: "synthetic_work", Replicas: 2}, {Name: "out", Node: "sink", Replicas: 1, Sink: true}},
		Edges: []Edge{{Name: "a", Policy: "shared", Capacity: 4, From: "src", To: "work", Queues: []Queue{{Producers: []int{0}, Consumers: []int{0, 1}}}},
			{Name: "b", Policy: "shared", Capacity: 4, From: "work", To: "out", Queues: []Queue{{Producers: []int{0, 1}, Consumers: []int{0}}}}}}
}

// partsFrame is a sample of partsGraph at t: the depths of queues a and
// b, and work's replicas' idle and blocked shares.
func partsFrame(t float64, depthA, depthB int, idle, blocked []float64) Frame {
	return Frame{T: t, Status: "running", Progress: -1, ETA: -1,
		Queues: map[string][]int{"a": {depthA}, "b": {depthB}},
		Items:  map[string][2]int64{"a": {int64(10 * t), int64(9 * t)}, "b": {int64(9 * t), int64(9 * t)}},
		Rate:   map[string]float64{"src": 10, "work": 9, "out": 9},
		Stages: map[string]StageFrame{
			"src":  {Busy: []float64{1}, Idle: []float64{0}, Blocked: []float64{0}},
			"work": {Busy: []float64{1 - idle[0] - blocked[0], 1 - idle[1] - blocked[1]}, Idle: idle, Blocked: blocked},
			"out":  {Busy: []float64{0}, Idle: []float64{1}, Blocked: []float64{0}},
		}}
}

// TestPageHoldsFrames: the page as served holds every run's graph and
// frames so far, so it can show them before any event arrives; the
// events then start where the page's frames end (from=N).
func TestPageHoldsFrames(t *testing.T) {
	r := newRun(partsGraph())
	some := []float64{.1, .2}
	r.add(partsFrame(0.5, 1, 2, some, some), false)
	r.add(partsFrame(1, 1, 3, some, some), false)
	s := &Server{runs: []*Run{r}, quit: make(chan struct{})}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	defer close(s.quit)
	c := srv.Client()
	defer c.CloseIdleConnections()
	res, err := c.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("the page's type %q", ct)
	}
	m := regexp.MustCompile(`<script id="dflow-data" type="application/json">(.*?)</script>`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no data in the page:\n%s", body)
	}
	var d pageData
	if err := json.Unmarshal(m[1], &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Runs) != 1 || d.Runs[0].Graph.Title != "parts" || d.Runs[0].Ended || len(d.Runs[0].Frames) != 2 {
		t.Fatalf("the page holds %+v", d)
	}
	if f := d.Runs[0].Frames[1]; f.T != 1 || f.Status != "running" || fmt.Sprint(f.Queues["b"]) != "[3]" {
		t.Errorf("the page's last frame %+v, want the run's: t 1, queue b at 3", f)
	}
	// /index.html is the same page, by a redirect
	if res, err := c.Get(srv.URL + "/index.html"); err != nil {
		t.Error(err)
	} else {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !strings.Contains(string(b), `<script id="dflow-data"`) {
			t.Errorf("/index.html (%s) without the runs' data", res.Request.URL)
		}
	}
	// the events from the page's last frame on: the next one only
	r.add(partsFrame(1.5, 1, 4, some, some), true)
	res, err = c.Get(srv.URL + "/api/events?run=0&from=2")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var frames []Frame
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "event: end" {
			break
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var f Frame
			if err := json.Unmarshal([]byte(data), &f); err != nil {
				t.Fatal(err)
			}
			frames = append(frames, f)
		}
	}
	if len(frames) != 1 || frames[0].T != 1.5 {
		t.Errorf("events from frame 2: %+v, want the frame at 1.5 s alone", frames)
	}
	if res, err := c.Get(srv.URL + "/api/events?run=0&from=x"); err != nil || res.StatusCode != http.StatusBadRequest {
		t.Errorf("from=x: %v, want 400 Bad Request", err)
	} else {
		res.Body.Close()
	}
}

// servePage serves runs and opens the page; with hold, the runs' event
// streams are held back until the test ends (a page whose stream has not
// arrived).
func servePage(t *testing.T, hold bool, runs ...*Run) (context.Context, func()) {
	t.Helper()
	exe := browser(t)
	s := &Server{runs: runs, quit: make(chan struct{})}
	h := s.Handler()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold && strings.HasPrefix(r.URL.Path, "/api/events") {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		h.ServeHTTP(w, r)
	}))
	ctx, cancel := browse(t, exe, chromedp.WindowSize(1400, 900))
	done := func() {
		cancel()
		close(release)
		close(s.quit)
		srv.Close()
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		done()
		t.Fatal(err)
	}
	return ctx, done
}

// TestPageBeforeStream: a live page loaded before its stream has sent
// anything (held back here) shows the run's state as served, not
// "starting": its status, clock, queues and replicas as of the last
// frame, as soon as it has loaded.
func TestPageBeforeStream(t *testing.T) {
	r := newRun(partsGraph())
	some := []float64{.1, .2}
	r.add(partsFrame(0.5, 1, 2, some, some), false)
	r.add(partsFrame(1, 1, 3, some, some), false)
	ctx, done := servePage(t, true, r)
	defer done()
	// no polling: the state is on the page when it has loaded
	got := eval[[]string](t, ctx, `[document.querySelector(".status").textContent, document.querySelector(".showing").textContent,
		document.querySelector('[data-queue="b/0"]').textContent, document.querySelector('[data-replica="work/1"] .rep-text').textContent]`)
	if fmt.Sprint(got) != "[running t = 1.0s: the last 0.5s (frame 2 of 2) 3/4 busy 60%]" {
		t.Errorf("the page shows %q before its stream, want the run's last frame: running, frame 2 of 2, queue b 3/4, work[1] busy 60%%", got)
	}
}

// TestPageParts: on a live page, the legend's colours are the drawing's
// (an empty queue before a starved replica, an empty queue before one
// that is not, a sink's idle share); a panel that has been zero
// throughout is named in a note, not drawn, until it moves; the
// "blocked" tag follows the frames' hysteresis, not each frame's share.
func TestPageParts(t *testing.T) {
	r := newRun(partsGraph())
	// work[0] starved (idle 90%, its sibling 0), queue a before it empty;
	// work[1] blocked 60% from the first frame; queue b, before the sink,
	// empty; the sink idle throughout
	starved, blocked := []float64{.9, 0}, []float64{0, .6}
	for i := range 3 {
		r.add(partsFrame(0.5*float64(i+1), 0, 0, starved, blocked), false)
	}
	ctx, done := servePage(t, false, r)
	defer done()

	type colours struct{ Legend, Drawn string }
	colour := func(legend, drawn, prop string) colours {
		t.Helper()
		return eval[colours](t, ctx, fmt.Sprintf(`(() => {
			const l = document.querySelector('header [data-legend] i.%s'), d = document.querySelector(%q);
			return {legend: l ? getComputedStyle(l).backgroundColor : "no legend", drawn: d ? getComputedStyle(d).%s : "not drawn"}; })()`, legend, drawn, prop))
	}
	hungry := colour("starved", `[data-queue-gauge="a/0"]`, "fill")
	empty := colour("empty", `[data-queue-gauge="b/0"]`, "fill")
	sink := colour("idle-sink", `[data-replica="out/0"] .seg-idle`, "fill")
	idle := colour("idle", `[data-replica="work/0"] .seg-idle`, "fill")
	for what, c := range map[string]colours{"empty queue before a starved replica": hungry, "empty queue": empty, "sink's idle": sink, "idle": idle} {
		if c.Legend != c.Drawn || !strings.HasPrefix(c.Legend, "rgb") {
			t.Errorf("%s: the legend says %s, the page draws %s", what, c.Legend, c.Drawn)
		}
	}
	if hungry.Drawn == empty.Drawn || sink.Drawn == idle.Drawn || hungry.Drawn != idle.Drawn {
		t.Errorf("empty before a starved replica %s, empty %s, a sink idle %s, idle %s: want the first and last alike (the problem sign), the others apart",
			hungry.Drawn, empty.Drawn, sink.Drawn, idle.Drawn)
	}

	// zero throughout: queue a's and b's depths and the sink's busy
	// share, named, not drawn; once queue b moves, its chart is drawn
	type panels struct {
		Hidden []string
		Note   string
	}
	shown := func() panels {
		return eval[panels](t, ctx, `({hidden: [...document.querySelectorAll(".chart")].filter(c => c.getBoundingClientRect().height === 0).map(c => c.dataset.chart),
			note: (n => n.getBoundingClientRect().height > 0 ? n.textContent : "")(document.querySelector(".zero-note"))})`)
	}
	if p := shown(); fmt.Sprint(p.Hidden) != "[edge/a/depth edge/b/depth stage/out/busy]" || !strings.Contains(p.Note, "b · queue depth") || !strings.Contains(p.Note, "out · busy share") {
		t.Errorf("panels zero throughout: hidden %v, note %q; want edge/a/depth, edge/b/depth and stage/out/busy, named", p.Hidden, p.Note)
	}
	r.add(partsFrame(2, 0, 2, starved, blocked), false)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector(".showing").textContent.includes("frame 4 of 4")`,
		chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("the fourth frame never showed: %v", err)
	}
	if p := shown(); fmt.Sprint(p.Hidden) != "[edge/a/depth stage/out/busy]" || strings.Contains(p.Note, "b · queue depth") || !strings.Contains(p.Note, "out · busy share") {
		t.Errorf("queue b moved: hidden %v, note %q; want edge/a/depth and stage/out/busy", p.Hidden, p.Note)
	}

	// work[1], blocked 60% in every frame, wears the tag from the third
	tags := eval[[]string](t, ctx, `(() => { const s = document.querySelector(".replay input"), out = [];
		for (let i = 0; i <= +s.max; i++) { s.value = i; s.dispatchEvent(new Event("input"));
			out.push(document.querySelector('[data-replica="work/1"]').getAttribute("class") + ":" + document.querySelector('[data-replica="work/1"] .rep-text').textContent); }
		return out; })()`)
	if fmt.Sprint(tags) != "[rep:busy 40% rep:busy 40% rep blocked:busy 40% blocked rep blocked:busy 40% blocked]" {
		t.Errorf("work[1] over the frames %q, want the blocked tag from the third frame on", tags)
	}
}
