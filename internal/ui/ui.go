// Package ui serves a run's live dashboard in the browser: the pipeline's
// graph (stages with their replicas, edges with their policy and queues),
// updated from the run's snapshots every frame by server-sent events, with
// each replica coloured by how it spends its time, queue depths against
// capacity, items per edge, node metrics over time, the diagnosis and the
// progress. The same page shows saved reports, several side by side.
//
// The page is plain HTML, CSS and JavaScript drawing SVG, embedded in the
// binary: no network, no CDN, no framework.
package ui

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/monitor"
	"github.com/dflow-dev/dflow/report"
)

//go:embed web
var web embed.FS

// Graph is the shape of a pipeline as the page draws it.
type Graph struct {
	Title  string  `json:"title"`
	Live   bool    `json:"live"`
	Stages []Stage `json:"stages"`
	Edges  []Edge  `json:"edges"`
}

// Stage is one stage box.
type Stage struct {
	Name     string `json:"name"`
	Node     string `json:"node"`
	Replicas int    `json:"replicas"`
	Source   bool   `json:"source"`
	// Sink: no edge leaves the stage, so its replicas waiting for input
	// is how it spends its time, not a sign of a problem.
	Sink bool `json:"sink,omitempty"`
	// Workers are the cluster workers the replicas ran on, from a
	// cluster run's report ("a>b" when a replica restarted on b); nil
	// for a run on one host.
	Workers []string `json:"workers,omitempty"`
}

// Edge is one edge; From and To are empty when unknown (a saved report
// whose spec could not be read).
type Edge struct {
	Name     string  `json:"name"`
	Policy   string  `json:"policy"`
	Capacity int     `json:"capacity"`
	From     string  `json:"from"`
	To       string  `json:"to"`
	Queues   []Queue `json:"queues"`
}

// Queue is one queue of an edge.
type Queue struct {
	Producers []int `json:"producers"`
	Consumers []int `json:"consumers"`
}

// Frame is the state of a run at one instant. Shares and rates are over
// the time since the previous frame, except in the summary frame (a
// run's last, Summary true), where they are the whole run's.
type Frame struct {
	T        float64                       `json:"t"`
	Status   string                        `json:"status"`              // "running", or the report's status at the end
	Progress float64                       `json:"progress"`            // 0..1, or -1 when a source does not know its total
	ETA      float64                       `json:"eta"`                 // seconds, or -1
	Queues   map[string][]int              `json:"queues"`              // edge -> depth per queue
	Items    map[string][2]int64           `json:"items,omitempty"`     // edge -> produced, consumed
	Stages   map[string]StageFrame         `json:"stages"`              // stage -> replicas
	Metrics  map[string]map[string]float64 `json:"metrics,omitempty"`   // stage -> name -> value
	Diagnose []string                      `json:"diagnosis,omitempty"` // plain words
	// Rate is each stage's throughput in items/s (received, or emitted
	// by a source); absent for a stage when it is not known (the first
	// frame of a saved report, a report without item counts).
	Rate map[string]float64 `json:"rate,omitempty"`
	// Summary marks the run's last frame: the report's whole-run
	// figures (each replica's busy, idle and blocked share of its
	// lifetime, each queue's mean and max depth, each stage's items over
	// the run's wall time), not a sample.
	Summary    bool                 `json:"summary,omitempty"`
	MeanQueues map[string][]float64 `json:"mean_queues,omitempty"` // edge -> mean depth per queue (summary)
	MaxQueues  map[string][]int64   `json:"max_queues,omitempty"`  // edge -> max depth per queue (summary)
	Error      string               `json:"error,omitempty"`       // the report's error (summary of a failed run)
	// Replicas is the size of each stage of a rebalance that moves
	// replicas (report.StageSnapshot.Size), and Moves the moves made
	// since the previous frame (in the summary, those after the last
	// sample); both absent without a rebalance.
	Replicas map[string]int `json:"replicas,omitempty"`
	Moves    []report.Move  `json:"moves,omitempty"`
}

// StageFrame is each replica's figures in a frame.
type StageFrame struct {
	Busy    []float64 `json:"busy"`
	Idle    []float64 `json:"idle"`
	Blocked []float64 `json:"blocked"`
	In      []int64   `json:"in,omitempty"`
	Out     []int64   `json:"out,omitempty"`
	Done    []bool    `json:"done,omitempty"`
	Workers []string  `json:"workers,omitempty"` // cluster worker per replica (summary of a cluster run)
	// Tagged is whether each replica wears the page's "blocked" tag in
	// this frame: blocked long enough, with hysteresis (see tagger), so
	// that a replica near the threshold does not flicker.
	Tagged []bool `json:"tagged,omitempty"`
}

// The "blocked" tag's hysteresis: a replica's tag is shown once its
// blocked share has been tagOn or more for tagFrames samples in a row,
// and hidden once it has been under tagOff for tagFrames in a row. The
// summary frame, one figure for the whole run, is tagged at tagOn.
const (
	tagOn     = 0.5
	tagOff    = 0.3
	tagFrames = 3
)

// tagger holds one replica's "blocked" tag from sample to sample.
type tagger struct {
	on  bool
	run int // samples in a row past the threshold that would flip it
}

// next takes the replica's blocked share in the next sample and says
// whether it wears the tag there.
func (h *tagger) next(blocked float64) bool {
	flip := blocked >= tagOn
	if h.on {
		flip = blocked < tagOff
	}
	if !flip {
		h.run = 0
		return h.on
	}
	if h.run++; h.run >= tagFrames {
		h.on, h.run = !h.on, 0
	}
	return h.on
}

// Run is one run the page shows: its graph and its frames so far. A live
// run grows a frame per tick until Finish.
type Run struct {
	graph Graph

	mu      sync.Mutex
	frames  []Frame
	tags    map[string][]tagger // stage -> each replica's "blocked" tag
	ended   bool
	changed chan struct{} // closed and replaced at each change
	stop    chan struct{}
	stopped chan struct{}
}

func newRun(g Graph) *Run {
	return &Run{graph: g, changed: make(chan struct{})}
}

func (r *Run) add(f Frame, end bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return
	}
	r.push(f)
	r.ended = end
	close(r.changed)
	r.changed = make(chan struct{})
}

// push appends f, its replicas' "blocked" tags set: from each one's
// tagger in a sample, at tagOn in the summary. The caller holds r.mu or
// owns r alone.
func (r *Run) push(f Frame) {
	if r.tags == nil {
		r.tags = map[string][]tagger{}
	}
	for name, sf := range f.Stages {
		tags := r.tags[name]
		if len(tags) < len(sf.Blocked) {
			tags = append(tags, make([]tagger, len(sf.Blocked)-len(tags))...)
			r.tags[name] = tags
		}
		sf.Tagged = make([]bool, len(sf.Blocked))
		for i, b := range sf.Blocked {
			if f.Summary {
				sf.Tagged[i] = b >= tagOn
			} else {
				sf.Tagged[i] = tags[i].next(b)
			}
		}
		f.Stages[name] = sf
	}
	r.frames = append(r.frames, f)
}

// since returns the frames from i on, whether the run has ended, and a
// channel closed at the next change.
func (r *Run) since(i int) ([]Frame, bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.frames[min(i, len(r.frames)):], r.ended, r.changed
}

// GraphOf describes g for the page.
func GraphOf(g *graph.Graph, title string) Graph {
	return GraphOn(g, title, nil)
}

// GraphOn is GraphOf for a run across hosts: where[stage] names the
// worker of each replica (nil: one process).
func GraphOn(g *graph.Graph, title string, where map[string][]string) Graph {
	out := Graph{Title: title}
	from := map[*graph.Stage]bool{}
	for _, e := range g.Edges {
		from[e.From.Stage] = true
	}
	for _, s := range g.Stages {
		st := Stage{Name: s.Name, Node: s.Node, Replicas: s.Replicas, Source: len(s.Inputs) == 0, Sink: !from[s]}
		if w := where[s.Name]; len(w) == s.Replicas {
			st.Workers = slices.Clone(w)
		}
		out.Stages = append(out.Stages, st)
	}
	for _, e := range g.Edges {
		oe := Edge{Name: e.Name, Policy: fmt.Sprint(e.Policy), Capacity: e.Capacity, From: e.From.Stage.Name, To: e.To.Stage.Name}
		for _, q := range e.Queues {
			oe.Queues = append(oe.Queues, Queue{Producers: q.Producers, Consumers: q.Consumers})
		}
		out.Edges = append(out.Edges, oe)
	}
	return out
}

// Live follows a running pipeline: every interval it reads snap and adds
// a frame, with the diagnosis so far (monitor.Diagnose on the figures to
// date). Finish ends it with the run's report.
func Live(g *graph.Graph, title string, snap func() *report.Snapshot, interval time.Duration) *Run {
	return LiveOn(g, title, nil, snap, interval)
}

// LiveOn is Live for a run across hosts: where[stage] names the worker
// of each replica as placed, and each frame names them as they run (a
// restart's "a>b").
func LiveOn(g *graph.Graph, title string, where map[string][]string, snap func() *report.Snapshot, interval time.Duration) *Run {
	gr := GraphOn(g, title, where)
	gr.Live = true
	r := newRun(gr)
	r.stop, r.stopped = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(r.stopped)
		t := time.NewTicker(interval)
		defer t.Stop()
		var prev *report.Snapshot
		depth := map[string][]float64{} // running sums of depth per queue, for the live diagnosis
		n := 0
		for {
			s := snap()
			if s.Elapsed > 0 {
				n++
				for _, e := range s.Edges {
					if depth[e.Name] == nil {
						depth[e.Name] = make([]float64, len(e.Queues))
					}
					for i, q := range e.Queues {
						depth[e.Name][i] += float64(q.Depth)
					}
				}
				mean := make(map[string][]float64, len(depth))
				for name, sums := range depth {
					for _, d := range sums {
						mean[name] = append(mean[name], d/float64(n))
					}
				}
				f := frameOf(s, prev)
				f.Diagnose = monitor.Diagnose(g, s.Report(mean), nil)
				r.add(f, false)
				prev = s
			}
			select {
			case <-t.C:
			case <-r.stop:
				return
			}
		}
	}()
	return r
}

// Finish stops a live run's sampling and adds its last frame, from the
// report: its status and its diagnosis.
func (r *Run) Finish(rep *report.Report) {
	if r.stop != nil {
		close(r.stop)
		<-r.stopped
	}
	r.mu.Lock()
	var last Frame
	if len(r.frames) > 0 {
		last = r.frames[len(r.frames)-1]
	}
	r.mu.Unlock()
	f := finalFrame(rep, last)
	seen := 0
	r.mu.Lock()
	for _, fr := range r.frames {
		seen += len(fr.Moves)
	}
	r.mu.Unlock()
	if len(rep.Moves) > seen {
		f.Moves = rep.Moves[seen:] // made after the last sample
	}
	r.add(f, true)
}

// frameOf turns a snapshot into a frame, shares since prev.
func frameOf(s, prev *report.Snapshot) Frame {
	f := Frame{T: s.Elapsed.Seconds(), Status: "running", Progress: -1, ETA: -1,
		Queues: map[string][]int{}, Items: map[string][2]int64{}, Stages: map[string]StageFrame{}, Metrics: map[string]map[string]float64{},
		Rate: map[string]float64{}}
	for _, e := range s.Edges {
		d := make([]int, len(e.Queues))
		for i, q := range e.Queues {
			d[i] = q.Depth
		}
		f.Queues[e.Name] = d
		f.Items[e.Name] = [2]int64{e.Produced, e.Consumed}
	}
	var emitted, total int64
	known := true
	seen := 0
	if prev != nil {
		seen = len(prev.Moves)
	}
	if len(s.Moves) > seen {
		f.Moves = s.Moves[seen:]
	}
	for i, st := range s.Stages {
		if st.Rebalanced {
			if f.Replicas == nil {
				f.Replicas = map[string]int{}
			}
			f.Replicas[st.Name] = st.Size()
		}
		sf := StageFrame{Busy: s.Utilization(prev, i), Idle: s.IdleShare(prev, i), Blocked: s.BlockedShare(prev, i)}
		span := s.Elapsed
		if prev != nil {
			span -= prev.Elapsed
		}
		for _, r := range st.Replicas {
			sf.In = append(sf.In, r.ItemsIn)
			sf.Out = append(sf.Out, r.ItemsOut)
			sf.Done = append(sf.Done, r.Done)
			sf.Workers = append(sf.Workers, r.Worker)
			if st.Source {
				emitted += r.ItemsOut
			}
		}
		if st.Source {
			if st.Total <= 0 {
				known = false
			}
			total += st.Total
		}
		if !slices.ContainsFunc(sf.Workers, func(w string) bool { return w != "" }) {
			sf.Workers = nil // one process
		}
		f.Stages[st.Name] = sf
		if span > 0 {
			n := st.Items()
			if prev != nil && i < len(prev.Stages) {
				n -= prev.Stages[i].Items()
			}
			f.Rate[st.Name] = float64(n) / span.Seconds()
		}
		if len(st.Metrics) > 0 {
			f.Metrics[st.Name] = st.Metrics
		}
	}
	if known && total > 0 {
		f.Progress = min(float64(emitted)/float64(total), 1)
		if f.Progress > 0 && !s.Draining {
			f.ETA = s.Elapsed.Seconds() * (1 - f.Progress) / f.Progress
		}
	}
	if s.Draining {
		f.Status = "draining"
	}
	return f
}

// finalFrame is the last frame of a run, its summary: the report's
// whole-run figures (each replica's busy, idle and blocked seconds as
// shares of its lifetime, each queue's mean and max depth, each stage's
// items over the wall time), its status, error and diagnosis, and the
// node metrics as the report has them. Only the progress and a
// rebalance's sizes (the split at the end) come from last.
func finalFrame(rep *report.Report, last Frame) Frame {
	f := Frame{T: rep.WallSeconds, Status: rep.Status, Error: rep.Error, Diagnose: rep.Diagnosis, Replicas: last.Replicas,
		Progress: last.Progress, ETA: -1, Summary: true, Queues: map[string][]int{},
		Items: map[string][2]int64{}, Stages: map[string]StageFrame{}, Rate: map[string]float64{},
		MeanQueues: map[string][]float64{}, MaxQueues: map[string][]int64{}}
	if f.Progress >= 0 && rep.Status == report.OK {
		f.Progress = 1
	}
	if f.Progress == 0 && len(last.Stages) == 0 {
		f.Progress = -1
	}
	for name, e := range rep.Edges {
		f.Items[name] = [2]int64{e.Produced, e.Consumed}
		for _, q := range e.Queues {
			f.MeanQueues[name] = append(f.MeanQueues[name], q.MeanDepth)
			f.MaxQueues[name] = append(f.MaxQueues[name], q.MaxDepth)
		}
	}
	for name, st := range rep.Stages {
		var sf StageFrame
		var in, out int64
		for _, r := range st.Replicas {
			sh := r.Shares()
			sf.Busy = append(sf.Busy, sh.Busy)
			sf.Idle = append(sf.Idle, sh.Idle)
			sf.Blocked = append(sf.Blocked, sh.Blocked)
			sf.In = append(sf.In, r.ItemsIn)
			sf.Out = append(sf.Out, r.ItemsOut)
			sf.Done = append(sf.Done, true)
			sf.Workers = append(sf.Workers, r.Worker)
			in += r.ItemsIn
			out += r.ItemsOut
		}
		if !slices.ContainsFunc(sf.Workers, func(w string) bool { return w != "" }) {
			sf.Workers = nil
		}
		if rep.WallSeconds > 0 {
			n := in
			if in == 0 { // a source
				n = out
			}
			f.Rate[name] = float64(n) / rep.WallSeconds
		}
		f.Stages[name] = sf
		if len(st.Metrics) > 0 {
			if f.Metrics == nil {
				f.Metrics = map[string]map[string]float64{}
			}
			f.Metrics[name] = st.Metrics
		}
	}
	return f
}

// Saved is a run read from a saved report: a frame per series point, then
// the report's totals. g, when not nil, is its spec's graph (for the
// edges' ends); without it the stages and edges come from the report
// (which names the edges' ends since this version; an older report's
// edges are drawn without them).
func Saved(rep *report.Report, g *graph.Graph, title string) *Run {
	var gr Graph
	if g != nil {
		gr = GraphOf(g, title)
	} else {
		gr = Graph{Title: title}
		for _, name := range rep.StageNames() {
			st := rep.Stages[name]
			gr.Stages = append(gr.Stages, Stage{Name: name, Node: st.Node, Replicas: len(st.Replicas)})
		}
		for _, name := range rep.EdgeNames() {
			e := rep.Edges[name]
			oe := Edge{Name: name, Policy: e.Policy, Capacity: e.Capacity, From: e.From, To: e.To}
			for _, q := range e.Queues {
				oe.Queues = append(oe.Queues, Queue{Producers: q.Producers, Consumers: q.Consumers})
			}
			gr.Edges = append(gr.Edges, oe)
		}
		// a sink leaves no edge; a report that does not name its edges'
		// ends (an older dflow's) cannot say
		ends := map[string]bool{}
		for _, e := range gr.Edges {
			ends[e.From] = true
		}
		known := !ends[""]
		for i, s := range gr.Stages {
			gr.Stages[i].Sink = known && !ends[s.Name]
		}
	}
	for i, s := range gr.Stages {
		for _, rr := range rep.Stages[s.Name].Replicas {
			if rr.Worker != "" {
				gr.Stages[i].Workers = make([]string, s.Replicas)
				break
			}
		}
		if gr.Stages[i].Workers != nil {
			for _, rr := range rep.Stages[s.Name].Replicas {
				if rr.Index >= 0 && rr.Index < s.Replicas {
					gr.Stages[i].Workers[rr.Index] = rr.Worker
				}
			}
		}
	}
	r := newRun(gr)
	var last Frame
	moves := rep.Moves // each to the first sample at or after it
	for i, p := range rep.Series {
		f := Frame{T: p.T, Status: "running", Progress: -1, ETA: -1, Queues: p.Queues, Stages: map[string]StageFrame{}, Metrics: p.Metrics,
			Rate: map[string]float64{}, Replicas: p.Replicas}
		for len(moves) > 0 && moves[0].T <= p.T {
			f.Moves = append(f.Moves, moves[0])
			moves = moves[1:]
		}
		if i > 0 && p.T > rep.Series[i-1].T {
			for name, n := range p.Items {
				if n0, ok := rep.Series[i-1].Items[name]; ok {
					f.Rate[name] = float64(n-n0) / (p.T - rep.Series[i-1].T)
				}
			}
		}
		for name, busy := range p.Utilization {
			idle := p.Idle[name]
			sf := StageFrame{Busy: busy, Idle: idle}
			for j := range busy {
				b := 1 - busy[j]
				if j < len(idle) {
					b -= idle[j]
				}
				sf.Blocked = append(sf.Blocked, min(max(b, 0), 1))
			}
			if idle == nil {
				sf.Idle = make([]float64, len(busy))
			}
			f.Stages[name] = sf
		}
		r.push(f)
		last = f
	}
	f := finalFrame(rep, last)
	f.Moves = moves
	r.push(f)
	r.ended = true
	return r
}

// Server serves the page for one or more runs.
type Server struct {
	runs []*Run
	quit chan struct{}
}

// Handler returns the page's HTTP handler: / (the page, with every run's
// graph and frames so far in it, so that it shows the runs' state as it
// loads, before any event arrives), its script and stylesheet,
// /api/runs (the graphs), /api/events?run=N&from=I (run N's frames as
// server-sent events: every frame from the I-th (default 0) so far, then
// each new one; an "end" event after the last).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(web, "web")
	mux.Handle("/", http.FileServerFS(sub))
	mux.HandleFunc("/{$}", s.page)
	mux.HandleFunc("/api/runs", func(w http.ResponseWriter, r *http.Request) {
		gs := make([]Graph, len(s.runs))
		for i, run := range s.runs {
			gs[i] = run.graph
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(gs)
	})
	mux.HandleFunc("/api/events", s.events)
	return mux
}

// pageData is what the page holds of each run as served: its graph, its
// frames so far and whether it has ended.
type pageData struct {
	Runs []pageRun `json:"runs"`
}

type pageRun struct {
	Graph  Graph   `json:"graph"`
	Frames []Frame `json:"frames"`
	Ended  bool    `json:"ended"`
}

// dataMark is where the page's index.html takes its data.
const dataMark = "<!-- dflow:data -->"

// page serves index.html with the runs' state so far inlined as JSON (a
// script element the page's script reads as it loads; the events then
// carry on from the frames it holds). encoding/json escapes <, > and &,
// so no text of a run can end the element.
func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	html, err := web.ReadFile("web/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	d := pageData{Runs: make([]pageRun, len(s.runs))}
	for i, run := range s.runs {
		frames, ended, _ := run.since(0)
		d.Runs[i] = pageRun{Graph: run.graph, Frames: frames, Ended: ended}
		if d.Runs[i].Frames == nil {
			d.Runs[i].Frames = []Frame{}
		}
	}
	b, err := json.Marshal(d)
	if err != nil {
		http.Error(w, "ui: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(bytes.Replace(html, []byte(dataMark),
		slices.Concat([]byte(`<script id="dflow-data" type="application/json">`), b, []byte(`</script>`)), 1))
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	i, err := strconv.Atoi(r.URL.Query().Get("run"))
	if err != nil || i < 0 || i >= len(s.runs) {
		http.Error(w, "no such run", http.StatusNotFound)
		return
	}
	sent := 0
	if from := r.URL.Query().Get("from"); from != "" {
		if sent, err = strconv.Atoi(from); err != nil || sent < 0 {
			http.Error(w, "from: not a frame index", http.StatusBadRequest)
			return
		}
	}
	run := s.runs[i]
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	for {
		frames, ended, changed := run.since(sent)
		for _, f := range frames {
			b, _ := json.Marshal(f)
			fmt.Fprintf(w, "data: %s\n\n", b)
		}
		sent += len(frames)
		if ended {
			fmt.Fprint(w, "event: end\ndata: {}\n\n")
			flusher.Flush()
			// Stay open, so the browser does not reconnect and replay.
			select {
			case <-r.Context().Done():
			case <-s.quit:
			}
			return
		}
		flusher.Flush()
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-s.quit:
			return
		}
	}
}

// Serve serves the page for runs at http://ADDR/ until the returned
// shutdown is called; an address without a host binds to loopback only,
// as --metrics-addr does. It returns the URL bound (port 0 picks one).
func Serve(addr string, runs ...*Run) (url string, shutdown func(), err error) {
	addr, err = monitor.LoopbackAddr(addr)
	if err != nil {
		return "", nil, fmt.Errorf("ui: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("ui: %w", err)
	}
	s := &Server{runs: runs, quit: make(chan struct{})}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	var once sync.Once
	return "http://" + ln.Addr().String() + "/", func() {
		once.Do(func() {
			close(s.quit) // event streams end; Shutdown waits for them
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			srv.Shutdown(ctx)
			<-done
		})
	}, nil
}
