package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSummaryExplainsUnconsumed: after an abort the summary says why an
// edge's produced and consumed counts differ, and not when they agree.
func TestSummaryExplainsUnconsumed(t *testing.T) {
	rep := &Report{Status: Aborted, Stages: map[string]Stage{},
		Edges: map[string]Edge{"e": {Policy: "shared", Produced: 20, Consumed: 12, Queues: []Queue{{}}}}}
	var b bytes.Buffer
	rep.Summarize(&b)
	for _, want := range []string{"run aborted", "produced=20 consumed=12 (8 never consumed)", "the abort stopped the run with 8 items still in the queues of edge e"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("want %q in\n%s", want, b.String())
		}
	}
	if !strings.Contains(b.String(), "a drain, one Ctrl-C") {
		t.Errorf("an abort's summary should point at the drain:\n%s", b.String())
	}
	rep.Status, rep.Error = Failed, "deadlock: no replica can move; ..."
	b.Reset()
	rep.Summarize(&b)
	if strings.Contains(b.String(), "Ctrl-C") || !strings.Contains(b.String(), "nothing could move") {
		t.Errorf("a deadlock's summary should not suggest a drain:\n%s", b.String())
	}
	rep.Status, rep.Edges["e"] = OK, Edge{Produced: 20, Consumed: 20, Queues: []Queue{{}}}
	b.Reset()
	rep.Summarize(&b)
	if strings.Contains(b.String(), "never consumed") {
		t.Errorf("balanced edges explained:\n%s", b.String())
	}
	// a cluster run that failed on a lost worker counts it as of its last
	// snapshot: more consumed than produced is said so, not as negative
	rep.Status, rep.Edges["e"] = Failed, Edge{Produced: 760, Consumed: 794, Queues: []Queue{{}}}
	b.Reset()
	rep.Summarize(&b)
	if !strings.Contains(b.String(), "(34 more consumed than produced: a lost worker's figures are as of its last snapshot)") || strings.Contains(b.String(), "-34") {
		t.Errorf("more consumed than produced:\n%s", b.String())
	}
}

// TestSummaryDataWait: a stage whose members measure their steps
// (DataWait, Compute) has the share waiting for data on its line; one
// without them has none.
func TestSummaryDataWait(t *testing.T) {
	rep := &Report{Status: OK, Stages: map[string]Stage{
		"drafter": {Metrics: map[string]float64{DataWait: 3, Compute: 9}},
		"target":  {Metrics: map[string]float64{"loss": 1}},
	}, Edges: map[string]Edge{}}
	var b bytes.Buffer
	rep.Summarize(&b)
	if !strings.Contains(b.String(), "stage drafter") {
		t.Fatalf("no drafter line:\n%s", b.String())
	}
	for _, l := range strings.Split(b.String(), "\n") {
		switch {
		case strings.Contains(l, "stage drafter") && !strings.HasSuffix(l, "compute_seconds=9 data_wait_seconds=3 (its steps 25.0% waiting for data)"):
			t.Errorf("drafter's line: %q", l)
		case strings.Contains(l, "stage target") && strings.Contains(l, "waiting for data"):
			t.Errorf("target's line: %q", l)
		}
	}
}

// TestOrder: stages and edges keep the spec's order through the JSON and
// back, and the summary follows it (a map alone would sort them).
func TestOrder(t *testing.T) {
	rep := &Report{Status: OK,
		Stages: map[string]Stage{"reader": {}, "target": {}, "drafter": {}},
		Edges:  map[string]Edge{"tokens": {}, "hs": {}}}
	rep.SetOrder([]string{"reader", "target", "drafter"}, []string{"tokens", "hs"})
	path := filepath.Join(t.TempDir(), "r.json")
	if err := rep.Write(path); err != nil {
		t.Fatal(err)
	}
	back, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.StageNames(); !slices.Equal(got, []string{"reader", "target", "drafter"}) {
		t.Errorf("stages read back as %v", got)
	}
	if got := back.EdgeNames(); !slices.Equal(got, []string{"tokens", "hs"}) {
		t.Errorf("edges read back as %v", got)
	}
	raw, _ := json.Marshal(back)
	if s := string(raw); strings.Index(s, `"reader"`) > strings.Index(s, `"drafter"`) || strings.Index(s, `"tokens"`) > strings.Index(s, `"hs"`) {
		t.Errorf("JSON out of order: %s", s)
	}
	var b bytes.Buffer
	back.Summarize(&b)
	if s := b.String(); strings.Index(s, "stage reader") > strings.Index(s, "stage drafter") {
		t.Errorf("summary out of order:\n%s", s)
	}
	// A stage the order does not name still shows, after the others.
	back.Stages["extra"] = Stage{}
	if got := back.StageNames(); got[len(got)-1] != "extra" {
		t.Errorf("stages %v", got)
	}
}

// TestWriteNoHTMLEscapes: a saved report writes "a>b" as such.
func TestWriteNoHTMLEscapes(t *testing.T) {
	r := &Report{Status: OK, Stages: map[string]Stage{"s": {Replicas: []Replica{{Worker: "w1>w2"}}}}}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := r.Write(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if !bytes.Contains(b, []byte(`"w1>w2"`)) {
		t.Errorf("report: %s", b)
	}
}
