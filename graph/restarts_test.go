package graph_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// restartsSpec: a source feeding train (a group kind that restores) and
// work; %s goes in train's block, %s at the end of the file.
const restartsSpec = `stage "source" {
  node = "synthetic_source"
  config {
    count = 4
  }
}

stage "work" {
  node = "synthetic_work"
  %s
}

stage "train" {
  node     = "ranks"
  replicas = 3
  %s
}

edge "a" {
  from = source.out
  to   = work.in
}

edge "b" {
  from = work.out
  to   = train.in
}
%s`

// TestRestarts: a stage's restarts is a whole number from 0, on a group
// kind that restores (Kind.Restores) whose outputs feed no edge; each
// error is at the attribute, naming the stage; --set sets it and is
// checked as the file is.
func TestRestarts(t *testing.T) {
	reg := testRegistry()
	reg.Register(nodes.Spec{Kind: graph.Kind{
		Name:     "ranks",
		Restores: true,
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}, {Name: "out", Dir: graph.Out, Type: graph.Any}}
		},
	}, Sync: nodes.Always})
	for _, tc := range []struct {
		name             string
		work, train, end string
		sets             []string
		want             int    // Restarts of train, where no error
		err              string // the diagnostics, as printed
	}{
		{name: "default", want: 0},
		{name: "set", train: "restarts = 2", want: 2},
		{name: "flag", sets: []string{"stage.train.restarts=3"}, want: 3},
		{name: "flag over the file", train: "restarts = 2", sets: []string{"stage.train.restarts=0"}, want: 0},
		{name: "not a group that restores", work: "restarts = 1",
			err: `p.hcl:10:14: error: restarts on a kind that does not restore
  stage "work": restarts = 1 needs a plugin group kind that restores (restores = True in Python, Sync and Moves in a Go plugin): its ranks start again from the group's last save. Kind "synthetic_work" does not; remove restarts.`},
		{name: "output edge", train: "restarts = 1", end: "stage \"sink\" {\n  node = \"sink\"\n}\nedge \"c\" {\n  from = train.out\n  to   = sink.in\n}\n",
			err: `p.hcl:16:14: error: restarts on a stage with output edges
  stage "train": restarts = 1, but its output "out" feeds edge "c": a restart trains again on the items since the group's last save, and what it sent on them would be sent twice. Restarts are for a stage whose outputs go nowhere (a trainer that writes its checkpoint); remove restarts or the edge.`},
		{name: "negative", train: "restarts = -1", err: `p.hcl:16:14: error: invalid restarts
  stage "train": restarts must be at least 0; got -1.`},
		{name: "fraction", train: "restarts = 1.5", err: `p.hcl:16:14: error: invalid restarts
  stage "train": restarts must be a whole number; got 1.5.`},
		{name: "too many", train: "restarts = 101", err: `p.hcl:16:14: error: invalid restarts
  stage "train": restarts must be at most 100; got 101.`},
		{name: "a string", train: `restarts = "two"`, err: `p.hcl:16:14: error: invalid value for restarts
  restarts must be a whole number; got the string "two".`},
		{name: "flag negative", sets: []string{"stage.train.restarts=-2"}, err: `error: invalid --set
  --set stage.train.restarts=-2: restarts must be at least 0; got -2.`},
		{name: "flag on a kind that does not restore", sets: []string{"stage.work.restarts=1"}, err: `error: restarts on a kind that does not restore
  stage "work": restarts = 1 needs a plugin group kind that restores`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &graph.Loader{Catalog: reg, Sets: tc.sets}
			src := []byte(strings.Replace(strings.Replace(strings.Replace(restartsSpec, "%s", tc.work, 1), "%s", tc.train, 1), "%s", tc.end, 1))
			g, diags := l.Load("p.hcl", src)
			var buf bytes.Buffer
			graph.WriteDiagnostics(&buf, diags, l.Sources())
			if tc.err != "" {
				if !diags.HasErrors() || !strings.Contains(buf.String(), tc.err) {
					t.Fatalf("diagnostics:\n%s\nwant them to hold:\n%s", buf.String(), tc.err)
				}
				return
			}
			if diags.HasErrors() {
				t.Fatal(buf.String())
			}
			if s := g.Stage("train"); s.Restarts != tc.want {
				t.Errorf("train's Restarts = %d, want %d", s.Restarts, tc.want)
			}
		})
	}
	g, diags := graph.NewBuilder("p", reg).Stage("s", "synthetic_source", graph.ConfigAttr("count", 4)).Stage("t", "ranks", graph.Restarts(2)).Edge("e", "s.out", "t.in").Build()
	if diags.HasErrors() || g.Stage("t").Restarts != 2 {
		t.Errorf("Builder with Restarts(2): %v, %v", diags, g)
	}
}
