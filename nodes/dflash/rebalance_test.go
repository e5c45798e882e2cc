package dflash

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/report"
)

// TestRebalanceCountsEveryBatch: a run whose moves take drafters from
// the group (each at a step boundary) and then give it new ones (each
// taking the group's weights, optimizer state, step and batch count
// over) ends ok, and its checkpoint counts every batch once across the
// changes of world size; the members that joined trained.
func TestRebalanceCountsEveryBatch(t *testing.T) {
	target, corpus, ckpt := fixture(t)
	const batches = 160
	src := strings.NewReplacer("limit      = 24", "limit      = "+strconv.Itoa(batches),
		"replicas = 3", "replicas = 1", "replicas = 2", "replicas = 4",
		`policy = "round_robin"`, `policy = "shared"`).Replace(spec(corpus, target, ckpt, "2"))
	src += "\nrebalance {\n  stages = [\"target\", \"drafter\"]\n}\n"
	reg := registry()
	g, diags := (&graph.Loader{Catalog: reg}).Load("p.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if err := engine.Movable(g, reg); err != nil {
		t.Fatal(err)
	}
	// Three drafters to the targets once the group has stepped a little,
	// two back later: the group shrinks from 4 to 1, then grows to 3.
	var mu sync.Mutex
	made := map[string]bool{}
	policy := func(s *report.Snapshot) ([]report.Move, func(bool)) {
		mu.Lock()
		defer mu.Unlock()
		var in int64
		for _, st := range s.Stages {
			if st.Name == "drafter" {
				for _, r := range st.Replicas {
					in += r.ItemsIn
				}
			}
		}
		var m report.Move
		switch {
		case !made["target"] && in >= 12:
			m = report.Move{From: "drafter", To: "target", Replicas: 3}
		case made["target"] && !made["drafter"] && in >= 40:
			m = report.Move{From: "target", To: "drafter", Replicas: 2}
		default:
			return nil, nil
		}
		return []report.Move{m}, func(ok bool) {
			mu.Lock()
			defer mu.Unlock()
			made[m.To] = made[m.To] || ok
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := engine.Run(ctx, g, engine.Options{Registry: reg, Rebalance: policy, Interval: 10 * time.Millisecond})
	if err != nil || rep.Status != report.OK {
		t.Fatalf("run: %v (%s)", err, rep.Status)
	}
	if !made["target"] || !made["drafter"] {
		t.Fatalf("moves made: %v; want drafters to the targets and back", made)
	}
	wte, _ := loadShared(target)
	_, meta, err := nn.LoadDrafter(ckpt, wte.P("wte"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Stages["drafter"].Metrics
	if meta["batches"] != strconv.Itoa(batches) || m["batches"] != batches || meta["step"] != strconv.FormatFloat(m["step"], 'f', -1, 64) {
		t.Errorf("checkpoint: batches %s, step %s; the run's metrics: batches %v, step %v; want %d batches, each once",
			meta["batches"], meta["step"], m["batches"], m["step"], batches)
	}
	drafters := rep.Stages["drafter"].Replicas
	joined := 0
	for _, r := range drafters[4:] {
		if r.ItemsIn > 0 {
			joined++
		}
	}
	if joined == 0 || rep.Edges["hs"].Consumed != batches {
		t.Errorf("%d drafters in the report, %d that joined trained; hs consumed %d of %d", len(drafters), joined, rep.Edges["hs"].Consumed, batches)
	}
	t.Logf("steps %v for %d batches; drafters' items: %v", m["step"], batches, itemsIn(drafters))
}

func itemsIn(rs []report.Replica) []int64 {
	var out []int64
	for _, r := range rs {
		out = append(out, r.ItemsIn)
	}
	return out
}
