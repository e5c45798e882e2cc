package host

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/plugins/proto"
	"github.com/dflow-dev/dflow/plugins/sdk"
	"github.com/zclconf/go-cty/cty"
)

// rankEnvNames are the variables a group kind's replica starts with.
var rankEnvNames = []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "DFLOW_DEVICE"}

// rankReport is what a replica of lockstepKind says at its end, on its
// output.
type rankReport struct {
	Index   int
	Env     map[string]string
	Device  string  // Start.device
	Steps   int     // steps taken
	Items   int     // items of its own
	Totals  int     // the steps' totals, summed
	SeqSum  float32 // all-reduced per step: each item's seq+1, over the group
	Members []int   // each step's members
	Param   float32 // a parameter trained as DDP would: the same on every rank
	Last    bool    // Finish said it was the group's last member
}

// lockstepKind is a group kind (Sync, so served at protocol version 2)
// that trains a parameter over its input in steps of k items
// (sdk.Steps), all-reducing a gradient each step, and sends what it saw.
// crash_at: replica 1 exits abruptly at that step.
var lockstepKind = nodes.Spec{
	Kind: graph.Kind{
		Name: "lockstep",
		Config: []graph.Field{
			{Name: "k", Type: graph.Int, Default: cty.NumberIntVal(1)},
			{Name: "crash_at", Type: graph.Int, Default: cty.NumberIntVal(-1)},
		},
		Ports: func(*graph.Config) []graph.PortSpec {
			return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}, {Name: "out", Dir: graph.Out, Type: "bytes"}}
		},
	},
	Sync: nodes.Always,
	New: func(cfg *graph.Config) (nodes.Node, error) {
		k, crash := int(cfg.Int("k")), int(cfg.Int("crash_at"))
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			g := r.Group()
			if err := g.Saves(ctx); err != nil {
				return err
			}
			rep := rankReport{Index: r.Index(), Env: map[string]string{}, Device: r.Device()}
			for _, name := range rankEnvNames {
				if v, ok := os.LookupEnv(name); ok {
					rep.Env[name] = v
				}
			}
			for st, err := range sdk.Steps(ctx, r, "in", k) {
				if err != nil {
					return err
				}
				if st.Index == crash && r.Index() == 1 {
					fmt.Fprintf(sdk.Stderr, "lockstep: rank 1 dying on purpose at step %d\n", st.Index)
					os.Exit(3)
				}
				grad := []float32{0}
				for _, it := range st.Items {
					grad[0] += float32(it.(*synthetic.Blob).Seq + 1)
				}
				n, err := g.AllReduceSum(ctx, grad)
				if err != nil {
					return err
				}
				rep.Steps++
				rep.Items += len(st.Items)
				rep.Totals += st.Total
				rep.SeqSum += grad[0]
				rep.Members = append(rep.Members, n)
				rep.Param -= 0.01 * grad[0] / float32(st.Total)
				if st.Index == 1 && r.Index() == 0 {
					if err := g.Saved(ctx, st.Index); err != nil {
						return err
					}
				}
			}
			last, err := g.Finish(ctx)
			if err != nil {
				return err
			}
			rep.Last = last
			b, err := json.Marshal(rep)
			if err != nil {
				return err
			}
			return r.Out("out").Send(ctx, b)
		}), nil
	},
}

const lockstepSpec = `
stage "src" {
  node = "synthetic_source"
  config {
    count      = %d
    size_bytes = 8
  }
}
stage "t" {
  node     = "tg/lockstep"
  replicas = %d
  %s
}
stage "reports" {
  node = "rank_reports"
}
edge "a" {
  from = src.out
  to   = t.in
}
edge "b" {
  from = t.out
  to   = reports.in
}`

// runLockstep runs items through the group plugin's replicas and returns
// each replica's report, by index.
func runLockstep(t *testing.T, f *fixture, items, replicas int, extra string, sets ...string) ([]rankReport, error) {
	t.Helper()
	var mu sync.Mutex
	reports := make([]rankReport, replicas)
	reg := f.reg.Clone()
	reg.Register(plugintest.Sink("rank_reports", "bytes", func(item any) error {
		var rep rankReport
		if err := json.Unmarshal(item.([]byte), &rep); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		reports[rep.Index] = rep
		return nil
	}))
	l := &graph.Loader{Catalog: reg, Sets: sets}
	g, diags := l.Load("p.hcl", []byte(fmt.Sprintf(lockstepSpec, items, replicas, extra)))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := engine.Run(ctx, g, engine.Options{Registry: reg})
	return reports, err
}

// TestGroupPlugin: a plugin kind that steps together (protocol version
// 2) gets a process per replica with torchrun's environment, and its
// input in lockstep: 7 items over 3 ranks, k at a time, end on every
// rank after the same step, each item once, the parameter the same on
// every rank, one last member.
func TestGroupPlugin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.h.Load("tg", wrapper(t, f.dir, "tg", "group"), f.reg); err != nil {
		t.Fatal(err)
	}
	spec, _ := f.reg.Spec("tg/lockstep")
	if spec.Sync == nil || !spec.Sync(nil) {
		t.Fatal("tg/lockstep is not registered as stepping together (Spec.Sync)")
	}
	ports := map[string]bool{}
	for _, k := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
			reps, err := runLockstep(t, f, 7, 3, "", fmt.Sprintf("stage.t.config.k=%d", k))
			if err != nil {
				t.Fatalf("%v\n%s", err, f.stderr.String())
			}
			items := 0
			lasts := 0
			for i, rep := range reps {
				t.Logf("rank %d: %d steps, %d items, members %v, param %v, last %v", i, rep.Steps, rep.Items, rep.Members, rep.Param, rep.Last)
				items += rep.Items
				if rep.Last {
					lasts++
				}
				if rep.Steps != reps[0].Steps {
					t.Errorf("rank %d took %d steps, rank 0 %d: not in lockstep", i, rep.Steps, reps[0].Steps)
				}
				if rep.Totals != 7 || rep.SeqSum != 28 {
					t.Errorf("rank %d: the steps' totals sum to %d, their all-reduced seqs to %v; want 7 and 28 (1+...+7)", i, rep.Totals, rep.SeqSum)
				}
				if rep.Param != reps[0].Param {
					t.Errorf("rank %d's parameter is %v, rank 0's %v", i, rep.Param, reps[0].Param)
				}
				for s, n := range rep.Members {
					if n != 3 {
						t.Errorf("rank %d step %d: %d members took part, want 3", i, s, n)
					}
				}
				want := map[string]string{"RANK": fmt.Sprint(i), "WORLD_SIZE": "3", "LOCAL_RANK": fmt.Sprint(i), "LOCAL_WORLD_SIZE": "3",
					"MASTER_ADDR": "127.0.0.1", "CUDA_VISIBLE_DEVICES": "", "DFLOW_DEVICE": "cpu"}
				for name, v := range want {
					if got, ok := rep.Env[name]; !ok || got != v {
						t.Errorf("rank %d: %s=%q (set: %v), want %q", i, name, got, ok, v)
					}
				}
				if p := rep.Env["MASTER_PORT"]; p == "" || p == "0" || p != reps[0].Env["MASTER_PORT"] {
					t.Errorf("rank %d: MASTER_PORT %q, rank 0's %q", i, p, reps[0].Env["MASTER_PORT"])
				}
			}
			if items != 7 {
				t.Errorf("the ranks took %d items in all, want 7", items)
			}
			// Each rank takes k items a step until its input ends: the
			// group steps as long as the rank with the most items needs.
			want := 0
			for _, rep := range reps {
				want = max(want, (rep.Items+k-1)/k)
			}
			if reps[0].Steps != want {
				t.Errorf("%d steps of up to %d items; the rank with the most items needed %d", reps[0].Steps, k, want)
			}
			if lasts != 1 {
				t.Errorf("%d ranks were told they were the group's last, want 1", lasts)
			}
			port := reps[0].Env["MASTER_PORT"]
			if ports[port] {
				t.Errorf("MASTER_PORT %s again: each run of the stage gets a fresh one", port)
			}
			ports[port] = true
		})
	}
	t.Run("no items", func(t *testing.T) {
		reps, err := runLockstep(t, f, 0, 3, "")
		if err != nil {
			t.Fatal(err)
		}
		for i, rep := range reps {
			if rep.Steps != 0 {
				t.Errorf("rank %d took %d steps of no items", i, rep.Steps)
			}
		}
	})
}

// devReplica is a replica of a stage of three, on a device.
type devReplica struct {
	nodes.Replica
	index  int
	device string
}

func (r devReplica) Index() int     { return r.index }
func (r devReplica) Replicas() int  { return 3 }
func (r devReplica) Device() string { return r.device }

// TestRestoringGroupPlugin: a group kind that restores (the Go SDK's
// Sync and Moves) registers as moving state that its group restores
// whole (Spec.Moves, Spec.Whole), and in one process runs as any group
// kind, its members asking for their items one at a time: the host
// refuses credit ahead, and 7 items over 3 ranks, k a step, end on every
// rank after the same step, each item once. (On a cluster it restarts
// whole: cmd/dflow's TestTorchDrafterLost.)
func TestRestoringGroupPlugin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.h.Load("tg", wrapper(t, f.dir, "tg", "group-restores"), f.reg); err != nil {
		t.Fatal(err)
	}
	spec, _ := f.reg.Spec("tg/lockstep")
	if !spec.Moves || !spec.Whole {
		t.Fatalf("tg/lockstep registered with Moves %v, Whole %v; want both", spec.Moves, spec.Whole)
	}
	for _, k := range []int{1, 2} {
		t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
			reps, err := runLockstep(t, f, 7, 3, "", fmt.Sprintf("stage.t.config.k=%d", k))
			if err != nil {
				t.Fatalf("%v\n%s", err, f.stderr.String())
			}
			items := 0
			for i, rep := range reps {
				items += rep.Items
				if rep.Steps != reps[0].Steps || rep.Totals != 7 {
					t.Errorf("rank %d: %d steps (rank 0 %d), totals %d; want lockstep over 7 items", i, rep.Steps, reps[0].Steps, rep.Totals)
				}
			}
			if items != 7 {
				t.Errorf("the ranks took %d items, want 7", items)
			}
		})
	}
}

// TestRankDevices: a rank's device is bound by CUDA_VISIBLE_DEVICES
// before its process starts (a dflow built without CUDA refuses cuda
// devices in a spec, so rankEnv is tested alone).
func TestRankDevices(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	for _, tc := range []struct {
		name, dflows string   // dflow's own CUDA_VISIBLE_DEVICES
		devices      []string // the stage's
		visible      []string // each rank's CUDA_VISIBLE_DEVICES
		device       []string // each rank's device, as its process numbers it
	}{
		// Distinct: every rank sees them all, in rank order, its own as
		// cuda:LOCAL_RANK.
		{"distinct", "", []string{"cuda:2", "cuda:0", "cuda:5"}, []string{"2,0,5", "2,0,5", "2,0,5"}, []string{"cuda:0", "cuda:1", "cuda:2"}},
		// dflow's own numbering is its CUDA_VISIBLE_DEVICES's.
		{"renumbered", "4,6,7", []string{"cuda:2", "cuda:0", "cuda:1"}, []string{"7,4,6", "7,4,6", "7,4,6"}, []string{"cuda:0", "cuda:1", "cuda:2"}},
		// Shared: each sees its own only, as cuda:0.
		{"shared", "", []string{"cuda:1", "cuda:1", "cuda:3"}, []string{"1", "1", "3"}, []string{"cuda:0", "cuda:0", "cuda:0"}},
		{"cpu", "", []string{"cpu", "cpu", "cpu"}, []string{"", "", ""}, []string{"cpu", "cpu", "cpu"}},
		{"mixed", "", []string{"cuda:1", "cpu", "cuda:0"}, []string{"1", "", "0"}, []string{"cuda:0", "cpu", "cuda:0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.dflows != "" {
				t.Setenv("CUDA_VISIBLE_DEVICES", tc.dflows)
			}
			for i := range 3 {
				r := devReplica{index: i, device: tc.devices[i]}
				env, device := rankEnv(r, Place{MasterAddr: "10.0.0.1", MasterPort: 29500, LocalRank: i, LocalWorldSize: 3, LocalDevices: tc.devices})
				got := map[string]string{}
				for _, kv := range env {
					k, v, _ := strings.Cut(kv, "=")
					got[k] = v
				}
				want := map[string]string{"RANK": fmt.Sprint(i), "WORLD_SIZE": "3", "LOCAL_RANK": fmt.Sprint(i), "LOCAL_WORLD_SIZE": "3",
					"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": tc.visible[i], "DFLOW_DEVICE": tc.device[i]}
				for k, v := range want {
					if g, ok := got[k]; !ok || g != v {
						t.Errorf("rank %d: %s=%q, want %q", i, k, g, v)
					}
				}
				if device != tc.device[i] {
					t.Errorf("rank %d: device %q, want %q", i, device, tc.device[i])
				}
			}
		})
	}
}

// TestGroupRankDies: a rank whose process dies mid-step fails the run,
// naming the stage, the rank and its last words, and the other ranks,
// waiting in the step's collective, do not hang it.
func TestGroupRankDies(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.h.Load("tg", wrapper(t, f.dir, "tg", "group"), f.reg); err != nil {
		t.Fatal(err)
	}
	_, err := runLockstep(t, f, 7, 3, "", "stage.t.config.crash_at=1")
	if err == nil {
		t.Fatal("the run ended ok")
	}
	for _, want := range []string{`stage "t" replica 1: plugin tg (`, "): rank 1 of 3: the plugin process failed", "lockstep: rank 1 dying on purpose at step 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// TestGroupNeedsVersion2: a plugin that answers protocol version 1 yet
// says a kind is a group kind is refused at its load.
func TestGroupNeedsVersion2(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := f.h.Load("old", wrapper(t, f.dir, "old", "group-v1"), f.reg)
	if err == nil || !strings.Contains(err.Error(), `kind "lockstep" says its replicas step together (group), which needs protocol version 2; the plugin answered version 1`) {
		t.Fatalf("err = %v", err)
	}
}

// oldGroup answers protocol version 1 but says its kind is a group kind.
type oldGroup struct{ proto.UnimplementedNodeServer }

func (oldGroup) Describe(context.Context, *proto.DescribeRequest) (*proto.DescribeResponse, error) {
	return &proto.DescribeResponse{Kinds: []*proto.Kind{{Name: "lockstep", Group: true}}}, nil
}

// recordingGroup records the collectives a replica's group is asked for.
type recordingGroup struct {
	mu    sync.Mutex
	calls []string
}

func (g *recordingGroup) add(s string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, s)
}

func (g *recordingGroup) Barrier(context.Context) error { g.add("barrier"); return nil }
func (g *recordingGroup) AllReduce(_ context.Context, x nodes.Reducible) (int, error) {
	f := x.(nodes.Floats)
	g.add(fmt.Sprintf("all-reduce %v", []float32(f)))
	for i := range f {
		f[i] *= 3 // as if three members had the same
	}
	return 3, nil
}
func (g *recordingGroup) AllReduceSum(ctx context.Context, buf []float32) (int, error) {
	return g.AllReduce(ctx, nodes.Floats(buf))
}
func (g *recordingGroup) Leave()                                  { g.add("leave") }
func (g *recordingGroup) Finish(context.Context) (bool, error)    { g.add("finish"); return true, nil }
func (g *recordingGroup) Keep(context.Context, nodes.State) error { g.add("keep"); return nil }
func (g *recordingGroup) Saves(context.Context) error             { g.add("saves"); return nil }
func (g *recordingGroup) Saved(_ context.Context, step int) error {
	g.add(fmt.Sprintf("saved %d", step))
	if step < 0 {
		return fmt.Errorf("no step %d", step)
	}
	return nil
}

type groupReplica struct {
	nodes.Replica
	g *recordingGroup
}

func (r groupReplica) Group() nodes.Group { return r.g }

// TestCollectivesReachTheGroup: each Collective a group member's plugin
// sends is the same call on its replica's nodes.Group (a cluster's as an
// engine's), answered with its result: the sums and members, whether a
// finish was the last, the step a save names, an error's text.
func TestCollectivesReachTheGroup(t *testing.T) {
	g := &recordingGroup{}
	answers := make(chan *proto.CollectiveResult, 8)
	c := &collectives{r: groupReplica{g: g}, send: func(m *proto.Message) error {
		answers <- m.GetCollectiveResult()
		return nil
	}}
	for _, tc := range []struct {
		m    *proto.Collective
		call string
		want string // the answer, as %v of its fields
	}{
		{&proto.Collective{Id: 1, Op: proto.CollectiveOp_COLLECTIVE_SAVES}, "saves", "1 [] 0 false "},
		{&proto.Collective{Id: 2, Op: proto.CollectiveOp_COLLECTIVE_ALL_REDUCE, Values: []float32{1, 2}}, "all-reduce [1 2]", "2 [3 6] 3 false "},
		{&proto.Collective{Id: 3, Op: proto.CollectiveOp_COLLECTIVE_BARRIER}, "barrier", "3 [] 0 false "},
		{&proto.Collective{Id: 4, Op: proto.CollectiveOp_COLLECTIVE_SAVED, Step: 5}, "saved 5", "4 [] 0 false "},
		{&proto.Collective{Id: 5, Op: proto.CollectiveOp_COLLECTIVE_SAVED, Step: -1}, "saved -1", "5 [] 0 false no step -1"},
		{&proto.Collective{Id: 6, Op: proto.CollectiveOp_COLLECTIVE_FINISH}, "finish", "6 [] 0 true "},
	} {
		c.do(context.Background(), tc.m)
		c.wg.Wait()
		r := <-answers
		got := fmt.Sprintf("%d %v %d %v %s", r.Id, r.Values, r.Members, r.Last, r.Error)
		if got != tc.want {
			t.Errorf("%v: answered %q, want %q", tc.m, got, tc.want)
		}
		if last := g.calls[len(g.calls)-1]; last != tc.call {
			t.Errorf("%v: the group was asked for %q, want %q", tc.m, last, tc.call)
		}
	}
	if len(g.calls) != 6 {
		t.Errorf("calls %v", g.calls)
	}
}
