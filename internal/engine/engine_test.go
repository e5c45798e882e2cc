package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

func TestMain(m *testing.M) { testutil.Main(m) }

const seedLike = `
stage "src" {
  node     = "t"
  replicas = 1
  config {
    role  = "source"
    count = 500
  }
}
stage "target" {
  node     = "t"
  replicas = 5
  config {
    jitter_us = 200
  }
}
stage "drafter" {
  node     = "t"
  replicas = 3
  config {
    role = "sink"
  }
}
edge "tokens" {
  from = src.out
  to   = target.in
}
edge "hs" {
  from     = target.out
  to       = drafter.in
  policy   = "round_robin"
  capacity = 2
}
`

// TestSeedShapeBothPolicies: the 5-on-3 shape delivers every item exactly
// once under both policies, and round_robin uses the 2-2-1 wiring.
func TestSeedShapeBothPolicies(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"round_robin", "shared"} {
		t.Run(policy, func(t *testing.T) {
			h := newHarness(t)
			rep, err := h.run(h.load(seedLike, "edge.hs.policy="+policy), Options{})
			if err != nil || rep.Status != report.OK {
				t.Fatalf("status %s, err %v", rep.Status, err)
			}
			checkBalanced(t, rep)
			h.deliveredOnce("drafter", 500)
			hs := rep.Edges["hs"]
			if hs.From != "target" || hs.To != "drafter" {
				t.Errorf("edge hs joins %q to %q in the report", hs.From, hs.To)
			}
			if policy == "round_robin" {
				if len(hs.Queues) != 3 || fmt.Sprint(hs.Queues[2].Producers) != "[2]" {
					t.Errorf("round_robin queues: %+v", hs.Queues)
				}
				// Each drafter receives exactly what its producers sent.
				target := rep.Stages["target"].Replicas
				for c, q := range hs.Queues {
					var sent int64
					for _, p := range q.Producers {
						sent += target[p].ItemsOut
					}
					if got := rep.Stages["drafter"].Replicas[c].ItemsIn; got != sent {
						t.Errorf("drafter %d got %d, its producers sent %d", c, got, sent)
					}
				}
			} else if len(hs.Queues) != 1 {
				t.Errorf("shared: %d queues", len(hs.Queues))
			}
		})
	}
}

// TestFinishingOrders: producers finishing before consumers start, and
// consumers starting first, in every order of replica start delays.
func TestFinishingOrders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ src, dst string }{
		{"[0]", "[30, 0, 15]"},      // producer done long before consumers start
		{"[30]", "[0, 0, 0]"},       // consumers wait for a late producer
		{"[0, 20, 40]", "[40, 0]"},  // producers finish one by one, P > C
		{"[40, 0, 20]", "[0, 10]"},  // other order
		{"[0, 30]", "[0, 0, 0, 0]"}, // P < C, rotation
	} {
		for _, policy := range graph.Policies {
			name := fmt.Sprintf("%s_src%s_dst%s", policy, tc.src, tc.dst)
			t.Run(name, func(t *testing.T) {
				np, nc := strings.Count(tc.src, ",")+1, strings.Count(tc.dst, ",")+1
				spec := fmt.Sprintf(`
stage "src" {
  node     = "t"
  replicas = %d
  config {
    role           = "source"
    count          = 60
    start_delay_ms = %s
    keyed          = %t
  }
}
stage "dst" {
  node     = "t"
  replicas = %d
  config {
    role           = "sink"
    start_delay_ms = %s
  }
}
edge "e" {
  from     = src.out
  to       = dst.in
  policy   = %q
  capacity = 1
}`, np, tc.src, policy == graph.KeyHash, nc, tc.dst, policy)
				h := newHarness(t)
				rep, err := h.run(h.load(spec), Options{})
				if err != nil {
					t.Fatal(err)
				}
				checkBalanced(t, rep)
				if n := len(h.got.counts["dst"]); n != 60 {
					t.Errorf("got %d items, want 60", n)
				}
			})
		}
	}
}

// TestRandomDAGs is the property test: random layered DAGs with fan-in,
// fan-out, random replicas, policies and capacities. Every item reaches
// every sink once per path from its source, and every run terminates.
func TestRandomDAGs(t *testing.T) {
	t.Parallel()
	n := 60
	if testing.Short() {
		n = 15
	}
	for seed := range n {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			spec, paths := randomDAG(rand.New(rand.NewPCG(uint64(seed), 1)))
			h := newHarness(t)
			rep, err := h.run(h.load(spec), Options{})
			if err != nil {
				t.Fatalf("%v\n%s", err, spec)
			}
			checkBalanced(t, rep)
			checkDeliveries(t, h, paths, spec)
		})
	}
}

// randomDAG writes a spec of 2-6 stages where each stage after the first
// reads from 1-2 earlier ones, and returns for each sink how many item
// deliveries it must see (items x paths).
func randomDAG(r *rand.Rand) (string, map[string]int) {
	nStages := 2 + r.IntN(5)
	var b strings.Builder
	type st struct {
		name    string
		ups     []int
		hasDown bool
	}
	stages := make([]*st, nStages)
	const count = 40
	for i := range stages {
		stages[i] = &st{name: fmt.Sprintf("s%d", i)}
		if i > 0 {
			stages[i].ups = append(stages[i].ups, r.IntN(i))
			if i > 1 && r.IntN(3) == 0 {
				if u := r.IntN(i); u != stages[i].ups[0] {
					stages[i].ups = append(stages[i].ups, u)
				}
			}
			for _, u := range stages[i].ups {
				stages[u].hasDown = true
			}
		}
	}
	// items[i]: deliveries arriving at stage i (the source's own count at 0).
	items := make([]int, nStages)
	items[0] = count
	paths := map[string]int{}
	for i, s := range stages {
		role := "work"
		switch {
		case i == 0:
			role = "source"
		case !s.hasDown:
			role = "sink"
		}
		for _, u := range s.ups {
			items[i] += items[u]
		}
		if role == "sink" {
			paths[s.name] = items[i]
		}
		fmt.Fprintf(&b, "stage %q {\n  node = \"t\"\n  replicas = %d\n  config {\n    role = %q\n    count = %d\n    jitter_us = %d\n  }\n}\n",
			s.name, 1+r.IntN(4), role, count, r.IntN(300))
		for k, u := range s.ups {
			fmt.Fprintf(&b, "edge \"e%d_%d\" {\n  from = s%d.out\n  to = %s.in\n  policy = %q\n  capacity = %d\n}\n",
				i, k, u, s.name, graph.Policies[r.IntN(2)], 1+r.IntN(4))
		}
	}
	return b.String(), paths
}

// TestFailure: the first error in any replica fails the run, naming stage
// and replica, and everything stops.
func TestFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		stage, set, want string
	}{
		{"target", "stage.target.config.fail_after=3", `stage "target" replica `},
		{"target", "stage.target.config.panic_after=2", "panic: panicking on purpose after 2 items"},
		{"src", "stage.src.config.fail_after=10", `stage "src" replica 0: failing on purpose after 10 items`},
		{"drafter", "stage.drafter.config.fail_after=1", `stage "drafter" replica `},
	} {
		t.Run(tc.set, func(t *testing.T) {
			h := newHarness(t)
			rep, err := h.run(h.load(seedLike, tc.set), Options{})
			if err == nil || rep.Status != report.Failed || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("status %s, err %v; want %q", rep.Status, err, tc.want)
			}
			if rep.Error != err.Error() {
				t.Errorf("report error %q != %q", rep.Error, err)
			}
		})
	}
}

// TestConsumerQuitsEarly: a consumer stage that returns while its
// producers still send is an error naming both stages, not a hang.
func TestConsumerQuitsEarly(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	_, err := h.run(h.load(seedLike, "stage.drafter.config.quit_after=2", "stage.target.config.jitter_us=0"), Options{})
	if err == nil || !strings.Contains(err.Error(), `edge "hs": stage "drafter" returned while stage "target" still produces`) {
		t.Fatalf("err = %v", err)
	}
}

// TestNoConsumersError: a producer blocked on a full queue whose consumers
// all returned gets ErrNoConsumers rather than hanging.
func TestNoConsumersError(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.load(seedLike)
	q := newQueue(&edge{g: g.Edge("hs")}, graph.Queue{Producers: []int{0}, Consumers: []int{0}}, 1, 0)
	if err := q.sendWait(context.Background(), &replica{}, 1); err != nil {
		t.Fatal(err)
	}
	if unfinished, unread := q.consumerDone(); !unfinished || unread != 1 {
		t.Errorf("consumerDone = %v, %d; want unfinished with 1 unread", unfinished, unread)
	}
	err := q.sendWait(context.Background(), &replica{}, 2)
	if !errors.Is(err, nodes.ErrNoConsumers) || !strings.Contains(err.Error(), `stage "drafter"`) {
		t.Fatalf("send to a queue without consumers: %v", err)
	}
}

// TestStuckReplicaGrace: a replica that ignores cancellation cannot hang
// the run: Run gives up after the grace period and names it.
func TestStuckReplicaGrace(t *testing.T) {
	// Not parallel: it reads every goroutine's stack, other tests' runs too.
	h := newHarness(t)
	g := h.load(seedLike, "stage.drafter.config.stuck=true", "stage.target.config.fail_after=1")
	rep, err := h.run(g, Options{Grace: 50 * time.Millisecond})
	// The wake-ups stop with the run, though stuck replicas remain.
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "engine.(*run).wake") {
		t.Error("the run's wake-ups outlive it")
	}
	close(h.stuck) // release the stuck goroutines so nothing leaks
	if err == nil || rep.Status != report.Failed {
		t.Fatalf("want a failure, got %v", err)
	}
	if !strings.HasPrefix(err.Error(), `stage "target"`) {
		t.Errorf("the first error should come first: %v", err)
	}
	if !strings.Contains(err.Error(), "drafter[0], drafter[1], drafter[2] did not stop within 50ms") {
		t.Errorf("the stuck replicas should be named: %v", err)
	}
}

// TestDrain: a drain stops the sources, lets items in flight finish, and
// ends interrupted with produced == consumed.
func TestDrain(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.load(`
stage "src" {
  node = "synthetic_source"
  config {
    count        = 100000
    service_time = "1ms"
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 2
  config {
    service_time = "2ms"
  }
}
stage "sink" {
  node = "t"
  config {
    role = "sink"
  }
}
edge "a" {
  from = src.out
  to   = work.in
}
edge "b" {
  from = work.out
  to   = sink.in
}`)
	drain := make(chan struct{})
	done := make(chan struct{})
	var rep *report.Report
	var err error
	go func() {
		defer close(done)
		rep, err = Run(context.Background(), g, Options{Registry: h.reg, Drain: drain})
	}()
	testutil.Eventually(t, 10*time.Second, func() bool {
		h.got.mu.Lock()
		defer h.got.mu.Unlock()
		return len(h.got.counts["sink"]) > 20
	}, "items to flow")
	close(drain)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("drain did not finish")
	}
	if err != nil || rep.Status != report.Interrupted {
		t.Fatalf("status %s, err %v", rep.Status, err)
	}
	checkBalanced(t, rep)
	if rep.Edges["a"].Produced >= 100000 {
		t.Error("the source was not stopped")
	}
}

// TestAbort: cancelling the context aborts at once, status aborted.
func TestAbort(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.load(seedLike, "stage.src.config.count=1000000", "stage.target.config.jitter_us=1000")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	rep, err := Run(ctx, g, Options{Registry: h.reg})
	if err != nil || rep.Status != report.Aborted {
		t.Fatalf("status %s, err %v", rep.Status, err)
	}
}

// TestAccounting: busy + idle + blocked add up to each replica's lifetime,
// and a node of known service time is measured close to it.
func TestAccounting(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.load(`
stage "src" {
  node = "synthetic_source"
  config {
    count        = 40
    service_time = "5ms"
  }
}
stage "work" {
  node = "synthetic_work"
  config {
    service_time = "10ms"
  }
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = work.in
}
edge "b" {
  from = work.out
  to   = sink.in
}`)
	rep, err := h.run(g, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, st := range rep.Stages {
		for _, r := range st.Replicas {
			sum := r.BusySeconds + r.IdleSeconds + r.BlockedSeconds
			// The sink lives as long as the run; every replica at most.
			if sum > rep.WallSeconds+0.001 || (name == "sink" && math.Abs(sum-rep.WallSeconds) > 0.01) {
				t.Errorf("%s[%d]: busy+idle+blocked = %.3fs, wall %.3fs", name, r.Index, sum, rep.WallSeconds)
			}
			if r.BusySeconds < 0 || r.IdleSeconds < 0 || r.BlockedSeconds < 0 {
				t.Errorf("%s[%d]: negative time %+v", name, r.Index, r)
			}
		}
	}
	// The source sleeps 5ms per item, 40 items: at least 0.2s busy.
	if b := rep.Stages["src"].Replicas[0].BusySeconds; b < 0.2 || b > 0.6 {
		t.Errorf("src busy %.3fs, want about 0.2s", b)
	}
	work := rep.Stages["work"].Replicas[0]
	// Sleeps overshoot, never undershoot; allow a loaded machine's slack.
	if m := work.ServiceSeconds.Mean; m < 0.010 || m > 0.030 {
		t.Errorf("work service mean %.4fs, want about 0.010s", m)
	}
	if work.ItemsIn != 40 || work.ItemsOut != 40 {
		t.Errorf("work in/out %d/%d", work.ItemsIn, work.ItemsOut)
	}
	// The source feeds faster than work consumes: work is the busy one.
	if work.Utilization < 0.5 {
		t.Errorf("work utilization %.2f; it is the bottleneck", work.Utilization)
	}
}

// TestCapacityBytes: with capacity_bytes an edge holds no more payload
// bytes than allowed, whatever its item capacity.
func TestCapacityBytes(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.load(`
stage "src" {
  node = "synthetic_source"
  config {
    count      = 50
    size_bytes = 1000
  }
}
stage "sink" {
  node = "sink"
  config {
    service_time = "1ms"
  }
}
edge "a" {
  from           = src.out
  to             = sink.in
  capacity       = 100
  capacity_bytes = 3000
}`)
	rep, err := h.run(g, Options{SampleEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	checkBalanced(t, rep)
	if d := rep.Edges["a"].Queues[0].MaxDepth; d > 3 {
		t.Errorf("max depth %d items of 1000 bytes under capacity_bytes 3000", d)
	}
}

// TestSyncUnevenEnds: synthetic_work with sync; replicas run out of input
// at different times (round_robin 2-2-1) and nobody hangs.
func TestSyncUnevenEnds(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.load(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 50
  }
}
stage "target" {
  node     = "synthetic_work"
  replicas = 5
}
stage "drafter" {
  node     = "synthetic_work"
  replicas = 3
  config {
    service_time = "100us"
    sync         = true
  }
}
stage "sink" {
  node = "t"
  config {
    role = "sink"
  }
}
edge "a" {
  from = src.out
  to   = target.in
  policy = "round_robin"
}
edge "hs" {
  from   = target.out
  to     = drafter.in
  policy = "round_robin"
}
edge "c" {
  from = drafter.out
  to   = sink.in
}`)
	rep, err := h.run(g, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkBalanced(t, rep)
	if rep.Edges["c"].Consumed != 50 {
		t.Errorf("consumed %d, want 50", rep.Edges["c"].Consumed)
	}
}

// TestRandomFaults injects a failure or a panic at a random stage and item
// of random DAGs: every run ends; a failed run names the stage at fault; a
// run that never reached the fault delivers everything.
func TestRandomFaults(t *testing.T) {
	t.Parallel()
	n := 40
	if testing.Short() {
		n = 10
	}
	for seed := range n {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(seed), 99))
			spec, paths := randomDAG(r)
			stage := fmt.Sprintf("s%d", r.IntN(strings.Count(spec, "stage \"")))
			kind := []string{"fail_after", "panic_after"}[r.IntN(2)]
			at := r.IntN(12)
			h := newHarness(t)
			rep, err := h.run(h.load(spec, fmt.Sprintf("stage.%s.config.%s=%d", stage, kind, at)), Options{})
			if at == 0 && err == nil {
				t.Fatalf("%s=0 on %s cannot succeed\n%s", kind, stage, spec)
			}
			if err != nil {
				if rep.Status != report.Failed || !strings.Contains(err.Error(), fmt.Sprintf("stage %q replica ", stage)) {
					t.Fatalf("status %s, error %v; want it to name %s\n%s", rep.Status, err, stage, spec)
				}
				return
			}
			checkBalanced(t, rep)
			checkDeliveries(t, h, paths, spec)
		})
	}
}

// checkDeliveries asserts each sink saw exactly the number of item
// deliveries the DAG's paths call for.
func checkDeliveries(t *testing.T, h *harness, paths map[string]int, spec string) {
	t.Helper()
	for sink, want := range paths {
		total := 0
		for _, c := range h.got.counts[sink] {
			total += c
		}
		if total != want {
			t.Fatalf("sink %s got %d item deliveries, want %d\n%s", sink, total, want, spec)
		}
	}
}
