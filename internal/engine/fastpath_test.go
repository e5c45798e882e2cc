package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/report"
)

// Tests of the per-item fast path: plain channel waits released by wake
// tokens, lazily published counters, sampled service times, coarse waits.

// funcKind registers a one-off node kind with an optional input and an
// optional output port, both of type "x".
func funcKind(reg *nodes.Registry, name string, in, out bool, run func(ctx context.Context, r nodes.Replica) error) {
	reg.Register(nodes.Spec{
		Kind: graph.Kind{Name: name, Ports: func(*graph.Config) []graph.PortSpec {
			var ps []graph.PortSpec
			if in {
				ps = append(ps, graph.PortSpec{Name: "in", Dir: graph.In, Type: "x"})
			}
			if out {
				ps = append(ps, graph.PortSpec{Name: "out", Dir: graph.Out, Type: "x"})
			}
			return ps
		}},
		New: func(*graph.Config) (nodes.Node, error) { return nodes.NodeFunc(run), nil },
	})
}

func loadPair(t *testing.T, reg *nodes.Registry, from, to string, producers, consumers int, policy graph.Policy) *graph.Graph {
	t.Helper()
	src := fmt.Sprintf(`
stage "p" {
  node     = %q
  replicas = %d
}
stage "c" {
  node     = %q
  replicas = %d
}
edge "e" {
  from     = p.out
  to       = c.in
  policy   = %q
  capacity = 4
}`, from, producers, to, consumers, policy)
	g, diags := (&graph.Loader{Catalog: reg}).Load("pair.hcl", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return g
}

// abortWhen executes p, waits until every replica of stage is in state,
// aborts the run and returns what Execute returned.
func abortWhen(t *testing.T, p *Pipeline, stage int, state int32, what string) (*report.Report, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	var rep *report.Report
	var err error
	go func() {
		defer close(done)
		rep, err = p.Execute(ctx)
	}()
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, rp := range p.r.stages[stage].replicas {
			if _, _, st := rp.waits(); st != state {
				return false
			}
		}
		return true
	}, "%s", what)
	cancel()
	<-done
	return rep, err
}

// readAll receives until the end of input.
func readAll(ctx context.Context, in nodes.Input) error {
	for {
		if _, err := in.Recv(ctx); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// TestAbortReleasesBlockedProducers: producers blocked on full queues (in
// plain channel sends) return when the run is aborted, well within the
// grace period, and the run ends interrupted without naming stuck
// replicas.
func TestAbortReleasesBlockedProducers(t *testing.T) {
	t.Parallel()
	for _, policy := range []graph.Policy{graph.Shared, graph.RoundRobin} {
		t.Run(string(policy), func(t *testing.T) {
			reg := nodes.NewRegistry()
			funcKind(reg, "flood", false, true, func(ctx context.Context, r nodes.Replica) error {
				out := r.Out("out")
				for i := 0; ; i++ {
					if err := out.Send(ctx, i); err != nil {
						return err
					}
				}
			})
			funcKind(reg, "deaf", true, false, func(ctx context.Context, r nodes.Replica) error {
				<-ctx.Done() // never reads: the queues fill up
				return ctx.Err()
			})
			p, err := New(loadPair(t, reg, "flood", "deaf", 5, 3, policy), Options{Registry: reg, Grace: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := abortWhen(t, p, 0, stateBlocked, "every producer blocked on a full queue")
			if err != nil || rep.Status != report.Aborted {
				t.Fatalf("status %s, err %v", rep.Status, err)
			}
		})
	}
}

// TestAbortReleasesBlockedConsumers: consumers blocked on empty queues (in
// plain channel receives) get ctx.Err() from Recv when the run is
// aborted, while their producers are still running, so it is the wake
// token that releases them, not the end of input; no token reaches a node.
func TestAbortReleasesBlockedConsumers(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	const consumers = 3
	var (
		mu       sync.Mutex
		recvErrs []error
		released = make(chan struct{})
	)
	funcKind(reg, "silent", false, true, func(ctx context.Context, r nodes.Replica) error {
		<-ctx.Done()
		// Stay alive (keeping the queue open) until every consumer has
		// returned from Recv; give up after a while so a failure cannot
		// hang the test.
		select {
		case <-released:
		case <-time.After(5 * time.Second):
		}
		return ctx.Err()
	})
	funcKind(reg, "listener", true, false, func(ctx context.Context, r nodes.Replica) error {
		item, err := r.In("in").Recv(ctx)
		mu.Lock()
		recvErrs = append(recvErrs, err)
		if len(recvErrs) == consumers {
			close(released)
		}
		mu.Unlock()
		if err == nil {
			return fmt.Errorf("received %T %v from a producer that sends nothing", item, item)
		}
		return err
	})
	p, err := New(loadPair(t, reg, "silent", "listener", 2, consumers, graph.Shared), Options{Registry: reg, Grace: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := abortWhen(t, p, 1, stateIdle, "every consumer waiting on an empty queue"); err != nil {
		t.Fatal(err)
	}
	if len(recvErrs) != consumers {
		t.Fatalf("%d consumers returned from Recv, want %d", len(recvErrs), consumers)
	}
	for _, e := range recvErrs {
		if !errors.Is(e, context.Canceled) {
			t.Errorf("Recv returned %v, want context.Canceled", e)
		}
	}
}

// TestRecvOwnDeadline: a node that waits with a context of its own (here
// with a deadline) gets that context's error: only waits on the
// replica's own context take the plain path. The producer holds the queue
// open meanwhile, so the deadline is the only way out of that Recv.
func TestRecvOwnDeadline(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	waited := make(chan struct{})
	funcKind(reg, "once", false, true, func(ctx context.Context, r nodes.Replica) error {
		if err := r.Out("out").Send(ctx, 1); err != nil {
			return err
		}
		select {
		case <-waited:
		case <-time.After(10 * time.Second): // the deadline was ignored
		}
		return nil
	})
	var recvErr error
	funcKind(reg, "patient", true, false, func(ctx context.Context, r nodes.Replica) error {
		in := r.In("in")
		if _, err := in.Recv(ctx); err != nil {
			return err
		}
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, recvErr = in.Recv(short)
		close(waited)
		return readAll(ctx, in)
	})
	rep, err := Run(context.Background(), loadPair(t, reg, "once", "patient", 1, 1, graph.Shared), Options{Registry: reg})
	if err != nil || rep.Status != report.OK {
		t.Fatalf("status %s, err %v", rep.Status, err)
	}
	if !errors.Is(recvErr, context.DeadlineExceeded) {
		t.Errorf("Recv with a deadline returned %v, want context.DeadlineExceeded", recvErr)
	}
}

// TestCountsWhileWaiting: live counters are exact for a replica in a wait
// and for one whose items are slow, though both publish lazily.
func TestCountsWhileWaiting(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	release := make(chan struct{})
	const sent = 10
	funcKind(reg, "burst", false, true, func(ctx context.Context, r nodes.Replica) error {
		out := r.Out("out")
		for i := range sent {
			time.Sleep(time.Millisecond) // slow items: counts published at once
			if err := out.Send(ctx, i); err != nil {
				return err
			}
		}
		<-release // holds the queue open, busy in its own code
		return nil
	})
	funcKind(reg, "drain", true, false, func(ctx context.Context, r nodes.Replica) error {
		return readAll(ctx, r.In("in"))
	})
	p, err := New(loadPair(t, reg, "burst", "drain", 1, 1, graph.Shared), Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err = p.Execute(context.Background())
	}()
	// Fewer than publishEvery items each: without publishing at every slow
	// item (the producer) and before every wait (the consumer), both would
	// show 0 until the end.
	testutil.Eventually(t, 10*time.Second, func() bool {
		s := p.Snapshot()
		return len(s.Edges) == 1 && s.Edges[0].Produced == sent && s.Edges[0].Consumed == sent &&
			s.Stages[0].Replicas[0].ItemsOut == sent && s.Stages[1].Replicas[0].ItemsIn == sent
	}, "live counts to show every item while the producer holds the queue open")
	close(release)
	<-done
	if err != nil {
		t.Fatal(err)
	}
}

// TestServiceSampling: fast items are timed on a sample, slow ones all;
// either way the mean is near the truth.
func TestServiceSampling(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		items int
		work  time.Duration
	}{
		{"fast", 20000, 0},
		{"slow", 40, 2 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := nodes.NewRegistry()
			funcKind(reg, "src", false, true, func(ctx context.Context, r nodes.Replica) error {
				out := r.Out("out")
				for i := range tc.items {
					if err := out.Send(ctx, i); err != nil {
						return err
					}
				}
				return nil
			})
			funcKind(reg, "work", true, false, func(ctx context.Context, r nodes.Replica) error {
				in := r.In("in")
				for {
					if _, err := in.Recv(ctx); err == io.EOF {
						return nil
					} else if err != nil {
						return err
					}
					if tc.work > 0 {
						time.Sleep(tc.work)
					}
				}
			})
			p, err := New(loadPair(t, reg, "src", "work", 1, 1, graph.Shared), Options{Registry: reg})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := p.Execute(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			timed := p.r.stages[1].replicas[0].clock.service.count.Load()
			mean := time.Duration(rep.Stages["c"].Replicas[0].ServiceSeconds.Mean * 1e9)
			if tc.work == 0 {
				// One in every sampleBudget/mean (at least 1 in
				// maxSampleEvery) is timed; the mean depends on the machine
				// (and -race).
				want := float64(tc.items) / float64(sampleEvery(mean))
				if timed == 0 || timed >= int64(tc.items) || float64(timed) > 3*want+50 {
					t.Errorf("%d of %d fast items timed (mean %v), want about %.0f", timed, tc.items, mean, want)
				}
				if mean > 100*time.Microsecond {
					t.Errorf("fast items' mean service %v", mean)
				}
				return
			}
			if timed != int64(tc.items) {
				t.Errorf("%d of %d slow items timed, want all", timed, tc.items)
			}
			if mean < tc.work || mean > 10*tc.work {
				t.Errorf("mean service %v, want about %v", mean, tc.work)
			}
		})
	}
}

// TestCoarseWaitsUnbiased drives a replica's wait accounting with a coarse
// clock that ticks every 10ms, over waits shorter than a tick that begin
// at random phases: each wait counts as 0 or a whole tick, and the total
// must match the true total within the sampling error, which is that of
// asking at each tick whether the replica is waiting (4 sigma here).
func TestCoarseWaitsUnbiased(t *testing.T) {
	t.Parallel()
	const tick, ticks = int64(10 * time.Millisecond), 4000
	rng := rand.New(rand.NewPCG(1, 2))
	for _, meanWait := range []int64{20_000, 300_000, 3_000_000} { // 20µs, 300µs, 3ms
		var c coarseClock
		r := &replica{coarse: &c}
		r.clock.every.Store(maxSampleEvery) // fast items: coarse waits
		now, truth := int64(0), int64(0)
		advance := func(d int64) {
			now += d
			c.now.Store(now - now%tick)
		}
		for now < ticks*tick {
			advance(rng.Int64N(2 * meanWait)) // busy
			w := r.beginWait(&r.idle, opaqueWait)
			if w.exact {
				t.Fatal("a replica with fast items timed a wait exactly")
			}
			d := rng.Int64N(2 * meanWait)
			advance(d)
			truth += d
			r.endWait(w)
		}
		share := float64(truth) / float64(now)
		sigma := math.Sqrt(share*(1-share)/ticks) / share
		total, _ := waitsAt(r.idle.v.Load(), now)
		ratio := float64(total) / float64(truth)
		if math.Abs(ratio-1) > 4*sigma {
			t.Errorf("mean wait %v: coarse total %v, true %v: ratio %.3f, sigma %.3f",
				time.Duration(meanWait), time.Duration(total), time.Duration(truth), ratio, sigma)
		}
	}
}

// TestWaitTotal: the word that holds a replica's wait total also shows
// the waits in progress, counted up to now, whatever the clock's origin
// (0 included: a coarse clock or a test clock may start there), with
// several at once.
func TestWaitTotal(t *testing.T) {
	t.Parallel()
	for _, origin := range []int64{0, 1, 5e15, 1 << 57} { // clocks up to 4.5 years from their origin
		var w waitTotal
		at := func(now int64) (int64, int) { return waitsAt(w.v.Load(), origin+now) }
		if total, n := at(0); total != 0 || n != 0 {
			t.Fatalf("origin %d: fresh total %d, %d waiting", origin, total, n)
		}
		w.begin(origin + 0)
		w.end(origin + 100)
		w.begin(origin + 150)
		if total, n := at(180); total != 130 || n != 1 {
			t.Fatalf("origin %d: in a wait: total %d, %d waiting; want 130, 1", origin, total, n)
		}
		w.begin(origin + 170) // a second wait, from another goroutine
		if total, n := at(200); total != 100+50+30 || n != 2 {
			t.Fatalf("origin %d: two waits: total %d, %d waiting; want 180, 2", origin, total, n)
		}
		w.end(origin + 200)
		w.end(origin + 210)
		if total, n := at(1000); total != 100+60+30 || n != 0 {
			t.Fatalf("origin %d: after: total %d, %d waiting; want 190, 0", origin, total, n)
		}
	}
}

// TestMaxDepth: max_depth is the deepest a producer saw the queue, read
// after each send until the producer has seen it full (then it is the
// capacity, and the fast path stops reading the channel's length).
func TestMaxDepth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ items, want int }{{3, 3}, {4, 4}, {20, 4}} {
		reg := nodes.NewRegistry()
		release := make(chan struct{})
		funcKind(reg, "src", false, true, func(ctx context.Context, r nodes.Replica) error {
			out := r.Out("out")
			// The consumer starts reading once the queue is as deep as it
			// gets: all the items, or a full queue.
			defer func() {
				if tc.items <= 4 {
					close(release)
				}
			}()
			for i := range tc.items {
				if i == 4 {
					close(release)
				}
				if err := out.Send(ctx, i); err != nil {
					return err
				}
			}
			return nil
		})
		funcKind(reg, "sink", true, false, func(ctx context.Context, r nodes.Replica) error {
			<-release
			return readAll(ctx, r.In("in"))
		})
		rep, err := Run(context.Background(), loadPair(t, reg, "src", "sink", 1, 1, graph.Shared), Options{Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		if got := rep.Edges["e"].Queues[0].MaxDepth; got != int64(tc.want) {
			t.Errorf("%d items through capacity 4: max depth %d, want %d", tc.items, got, tc.want)
		}
	}
}

// TestPortsFollowTheRate: every port learns its replica's sampling rate,
// including the output of a stage that is not a source (it picks no items
// to time): a port stuck at the initial rate would publish its count, a
// barrier, on every item.
func TestPortsFollowTheRate(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	funcKind(reg, "src", false, true, func(ctx context.Context, r nodes.Replica) error {
		out := r.Out("out")
		for i := range 20000 {
			if err := out.Send(ctx, i); err != nil {
				return err
			}
		}
		return nil
	})
	funcKind(reg, "pass", true, true, func(ctx context.Context, r nodes.Replica) error {
		in, out := r.In("in"), r.Out("out")
		for {
			item, err := in.Recv(ctx)
			if err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
			if err := out.Send(ctx, item); err != nil {
				return err
			}
		}
	})
	funcKind(reg, "sink", true, false, func(ctx context.Context, r nodes.Replica) error {
		return readAll(ctx, r.In("in"))
	})
	g, diags := (&graph.Loader{Catalog: reg}).Load("chain.hcl", []byte(`
stage "a" { node = "src" }
stage "b" { node = "pass" }
stage "c" { node = "sink" }
edge "ab" {
  from = a.out
  to   = b.in
}
edge "bc" {
  from = b.out
  to   = c.in
}`))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	p, err := New(g, Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Execute(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A port's rate starts at 0 (publish every count) and takes the
	// replica's, at least 1, once an item has been timed: whether items
	// count as fast here depends on the machine (and -race), so the test
	// is that every port took it up, not what it is.
	for _, s := range p.r.stages {
		rep := s.replicas[0]
		every := rep.clock.every.Load()
		if every < 1 {
			t.Fatalf("stage %s: no item timed in 20000", s.g.Name)
		}
		for name, in := range rep.inputs {
			if in.clock.every < 1 {
				t.Errorf("stage %s input %s: rate %d, the replica's %d", s.g.Name, name, in.clock.every, every)
			}
		}
		for name, out := range rep.outputs {
			if out.clock.every < 1 {
				t.Errorf("stage %s output %s: rate %d, the replica's %d", s.g.Name, name, out.clock.every, every)
			}
		}
	}
}

// TestFitWaits: waits that add up to more than the lifetime (coarse
// timing overcounts by up to a tick) are scaled to fit, keeping their
// proportions, so that busy, idle and blocked add up to the lifetime.
func TestFitWaits(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tc := range []struct{ idle, blocked, life, wantIdle, wantBlocked time.Duration }{
		{300 * ms, 100 * ms, 500 * ms, 300 * ms, 100 * ms}, // fits: unchanged
		{330 * ms, 110 * ms, 400 * ms, 300 * ms, 100 * ms}, // 10% over
		{410 * ms, 0, 400 * ms, 400 * ms, 0},
		{5 * ms, 5 * ms, 0, 0, 0},
	} {
		idle, blocked := fitWaits(tc.idle, tc.blocked, tc.life)
		if idle != tc.wantIdle || blocked != tc.wantBlocked || idle+blocked > max(tc.life, 0) {
			t.Errorf("fitWaits(%v, %v, %v) = %v, %v; want %v, %v", tc.idle, tc.blocked, tc.life, idle, blocked, tc.wantIdle, tc.wantBlocked)
		}
	}
}
