package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestDDPAcrossWorkers: three DDP ranks (gloo) of a Python group kind on
// --local-cluster 2, ranks 0 and 2 on one worker and rank 1 on the other:
// every rank is told where rank 0 listens as its share recorded it (one
// MASTER_ADDR and MASTER_PORT for all), its local rank among the members
// on its worker, and they train on 7 items, one a step, to identical
// parameters, the sum 7 on every rank. Before a worker said where rank 0
// listens, each worker gave its ranks a port of its own, and the rank
// apart never joined the others.
func TestDDPAcrossWorkers(t *testing.T) {
	python(t, "grpc, google.protobuf, numpy, torch")
	out := t.TempDir()
	plugin, err := filepath.Abs("../../plugins/python/testdata/dflow-plugin-ddp")
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(out, "ddp.hcl")
	os.WriteFile(spec, fmt.Appendf(nil, `plugin "ddp" {
  path = %q
}
stage "src" {
  node = "synthetic_source"
  config {
    count      = 7
    size_bytes = 8
  }
}
stage "train" {
  node     = "ddp/ddp"
  replicas = 3
  config {
    out      = %q
    lockstep = true
    crash_at = -1
  }
}
edge "a" {
  from = src.out
  to   = train.in
}
`, plugin, out), 0o644)
	code, stdout, stderr := dflow(t, "run", spec, "--local-cluster", "2", "--place", "train=local1,local2")
	if code != exitOK {
		t.Fatalf("code %d\n%s%s", code, stdout, stderr)
	}
	type rankFile struct {
		Env     map[string]string
		Trained int
		Sum     float64
		Params  [][]float64
	}
	var ranks [3]rankFile
	trained := 0
	for i := range ranks {
		b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("rank-%d.json", i)))
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if err := json.Unmarshal(b, &ranks[i]); err != nil {
			t.Fatal(err)
		}
		r := ranks[i]
		trained += r.Trained
		if r.Sum != 7 || fmt.Sprint(r.Params) != fmt.Sprint(ranks[0].Params) {
			t.Errorf("rank %d: sum %v, parameters %v; want 7 and rank 0's %v", i, r.Sum, r.Params, ranks[0].Params)
		}
		// ranks 0 and 2 on local1 (local ranks 0 and 1 of 2), rank 1 alone on local2
		local, size := map[int][2]string{0: {"0", "2"}, 1: {"0", "1"}, 2: {"1", "2"}}[i][0], map[int]string{0: "2", 1: "1", 2: "2"}[i]
		if r.Env["RANK"] != fmt.Sprint(i) || r.Env["WORLD_SIZE"] != "3" || r.Env["LOCAL_RANK"] != local || r.Env["LOCAL_WORLD_SIZE"] != size {
			t.Errorf("rank %d: env %v, want LOCAL_RANK %s of %s", i, r.Env, local, size)
		}
		if r.Env["MASTER_ADDR"] != ranks[0].Env["MASTER_ADDR"] || r.Env["MASTER_PORT"] != ranks[0].Env["MASTER_PORT"] || r.Env["MASTER_PORT"] == "" {
			t.Errorf("rank %d: master %s:%s, rank 0's %s:%s", i, r.Env["MASTER_ADDR"], r.Env["MASTER_PORT"], ranks[0].Env["MASTER_ADDR"], ranks[0].Env["MASTER_PORT"])
		}
	}
	if trained != 7 {
		t.Errorf("the ranks trained %d items, want 7", trained)
	}
}
