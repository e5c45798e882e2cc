package host

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/group"
	"github.com/dflow-dev/dflow/internal/nn"
	nnreduce "github.com/dflow-dev/dflow/internal/nn/reduce"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// serve answers the group's requests with h on host's connection, on the
// subject of stage's group in run r, until the test ends; it returns
// that subject.
func serve(t *testing.T, host *nats.Conn, h *Host, stage string) string {
	t.Helper()
	subject := "dflow.r.r.grp." + stage
	sub, err := host.Subscribe(subject, h.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	host.Flush()
	return subject
}

// TestGroupAcrossWorkers: the coordinator-hosted group sums the members'
// vectors, and a member's leaving is no longer waited for, whether it
// leaves between rounds or while the others wait (uneven ends).
func TestGroupAcrossWorkers(t *testing.T) {
	t.Parallel()
	conn := clustertest.Connector(t)
	host := conn()
	h := New("s", 3, host.MaxPayload(), false)
	serve(t, host, h, "s")
	var members []*group.Member
	for range 3 {
		members = append(members, &group.Member{NC: conn(), Subject: "dflow.r.r.grp.s"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Member 1 all-reduces a kernel backend's buffer (as drafter_train's
	// gradients are), the others host vectors: the buffer crosses to the
	// host and back.
	reduce := func(ids ...int) {
		t.Helper()
		var wg sync.WaitGroup
		for _, i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v := nodes.Floats{float32(i + 1), 10}
				var x nodes.Reducible = v
				var buf nn.Buffer
				if i == 1 {
					buf = nn.CPU().Alloc(2)
					nn.CPU().FromHost(buf, v)
					x = nnreduce.Of(buf)
				}
				n, err := members[i].AllReduce(ctx, i, x)
				if i == 1 {
					nn.CPU().ToHost(v, buf)
				}
				want := float32(0)
				for _, j := range ids {
					want += float32(j + 1)
				}
				if err != nil || n != len(ids) || v[0] != want || v[1] != float32(10*len(ids)) {
					t.Errorf("member %d: n %d, %v, err %v; want %d, [%v %d]", i, n, v, err, len(ids), want, 10*len(ids))
				}
			}()
		}
		wg.Wait()
	}
	reduce(0, 1, 2)
	// A vector past the message limit (a model's gradients) crosses in
	// parts, and its sum comes back in parts.
	big := int(host.MaxPayload()/4)*2 + 3
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := make(nodes.Floats, big)
			for j := range v {
				v[j] = float32(i + j%7)
			}
			n, err := members[i].AllReduce(ctx, i, v)
			if err != nil || n != 3 {
				t.Errorf("member %d, %d values: n %d, err %v", i, big, n, err)
				return
			}
			for j, x := range v {
				if want := float32(3 + 3*(j%7)); x != want {
					t.Errorf("member %d: value %d is %v, want %v", i, j, x, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	leave := func(i int, want bool) {
		t.Helper()
		if last, err := members[i].Leave(ctx, i); err != nil || last != want {
			t.Errorf("member %d's leave: last %v, err %v; want last %v", i, last, err, want)
		}
	}
	leave(2, false)
	leave(2, false) // again: idempotent, and never the last
	reduce(0, 1)
	done := make(chan error, 1)
	go func() { done <- members[1].Barrier(ctx, 1) }()
	leave(0, false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := members[0].AllReduce(ctx, 0, nodes.Floats{1}); err == nil {
		t.Error("a member that left took part in a collective")
	}
	// The last member to leave is told so, once: it is the one that does
	// what the group does once per run, whichever worker it runs on.
	leave(1, true)
	leave(1, false)
}

// TestGroupPartialVector: a member that leaves mid-vector (cancelled, or
// returned) adds nothing to the round's sum, whether others wait or not.
func TestGroupPartialVector(t *testing.T) {
	t.Parallel()
	h := New("s", 2, 1<<20, false)
	part := func(replica, total, off int, vals ...float32) []byte {
		b := make([]byte, 13+4*len(vals))
		b[0] = group.OpReduce
		binary.LittleEndian.PutUint32(b[1:], uint32(replica))
		binary.LittleEndian.PutUint32(b[5:], uint32(total))
		binary.LittleEndian.PutUint32(b[9:], uint32(off))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(b[13+4*i:], math.Float32bits(v))
		}
		return b
	}
	// Member 1 sends half its vector, then leaves; nobody waits yet.
	h.mu.Lock()
	h.open, h.reduce = true, true // as handle begins a round
	if h.addPartLocked(1, part(1, 4, 0, 100, 100)[5:]) {
		t.Fatal("a first part taken as the last")
	}
	h.leaveLocked(1)
	if h.open || len(h.vecs) != 0 || len(h.partial) != 0 {
		t.Fatalf("after the leave: open %v, vectors %v, partial %v", h.open, h.vecs, h.partial)
	}
	// The next round: member 0 alone, its own vector.
	h.open, h.reduce, h.err, h.total = true, true, "", 0
	if !h.addPartLocked(0, part(0, 4, 0, 1, 1, 1, 1)[5:]) {
		t.Fatal("a whole vector not taken as the last part")
	}
	got := sumOf(h.vecs, []int{0}, 4)
	h.mu.Unlock()
	for i, v := range got {
		if v != 1 {
			t.Fatalf("sum %v: value %d has member 1's part in it", got, i)
		}
	}
}

// weights is a member's state in the tests: a vector and a step.
type weights struct {
	w    []float32
	step int
}

func (s *weights) MarshalBinary() ([]byte, error) {
	b := binary.LittleEndian.AppendUint32(nil, uint32(s.step))
	for _, v := range s.w {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b, nil
}

func (s *weights) UnmarshalBinary(b []byte) error {
	s.step = int(binary.LittleEndian.Uint32(b))
	s.w = make([]float32, (len(b)-4)/4)
	group.Decode(s.w, b[4:])
	return nil
}

// TestGroupLostMember: a member lost mid-step adds nothing to the step
// (its vector is dropped); at the next step a member still present hands
// the group's state over for the lost member's restart, and the step
// waits for the restart, which takes the state, is told the item of the
// lost member's last completed step, and counts in the step; what the
// lost share asks after is refused.
func TestGroupLostMember(t *testing.T) {
	t.Parallel()
	conn := clustertest.Connector(t)
	host := conn()
	h := New("train", 3, host.MaxPayload(), true)
	serve(t, host, h, "train")
	held := make([]string, 3)
	var hmu sync.Mutex
	member := func(share string, restart bool) *group.Member {
		return &group.Member{NC: conn(), Subject: "dflow.r.r.grp.train", Share: share, Restart: restart,
			Held: func(i int) string { hmu.Lock(); defer hmu.Unlock(); return held[i] }}
	}
	members := []*group.Member{member("w0", false), member("w1", false), member("w2", false)}
	states := []*weights{{w: []float32{1, 2}}, {w: []float32{1, 2}}, {w: []float32{1, 2}}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, m := range members {
		if err := m.Keep(ctx, i, states[i]); err != nil {
			t.Fatal(err)
		}
	}
	// step: each of ids reduces (its index+1, 1) with item "it<step>-<i>" in hand.
	step := func(ids ...int) (errs []error) {
		t.Helper()
		var wg sync.WaitGroup
		errs = make([]error, len(ids))
		for k, i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hmu.Lock()
				held[i] = fmt.Sprintf("it%d-%d", states[i].step, i)
				hmu.Unlock()
				v := nodes.Floats{float32(i + 1), 1}
				n, err := members[i].AllReduce(ctx, i, v)
				if err != nil {
					errs[k] = err
					return
				}
				if n != len(ids) || v[1] != float32(len(ids)) {
					errs[k] = fmt.Errorf("member %d: %d contributors, sum %v; want %d", i, n, v, len(ids))
				}
				states[i].w[0] += v[0]
				states[i].step++
			}()
		}
		wg.Wait()
		return errs
	}
	for _, err := range step(0, 1, 2) {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Member 2 arrives in the next step and is lost there (its request
	// is never answered: its worker is gone).
	hmu.Lock()
	held[2] = "it1-2"
	hmu.Unlock()
	go members[2].AllReduce(ctx, 2, nodes.Floats{100, 100})
	testutil.Eventually(t, 10*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.arrived) == 1
	}, "member 2 arriving")
	if left := h.Lose(2, "w2"); left != 2 {
		t.Fatalf("%d members left present, want 2", left)
	}
	h.mu.Lock()
	if len(h.arrived) != 0 || len(h.vecs) != 0 {
		t.Fatalf("the lost member still in the step: arrived %v", h.arrived)
	}
	h.mu.Unlock()
	// The lost share is refused.
	if err := members[2].Barrier(ctx, 2); err == nil || !strings.Contains(err.Error(), "counted lost") {
		t.Fatalf("the lost share's barrier: %v", err)
	}
	// The next step: a member present hands its state over first (as of
	// its last step), then the step waits for the restart.
	stepped := make(chan []error, 1)
	go func() { stepped <- step(0, 1) }()
	testutil.Eventually(t, 10*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.stash[2] != nil && h.members == 3
	}, "member 2's state handed over")
	members[2] = member("w0-r1", true)
	var skipped string
	members[2].Skip = func(_ int, ids []string) { skipped = strings.Join(ids, ",") }
	states[2] = &weights{}
	if err := members[2].Keep(ctx, 2, states[2]); err != nil {
		t.Fatal(err)
	}
	if states[2].step != 1 || states[2].w[0] != 1+6 || skipped != "it0-2" {
		t.Fatalf("the restart took step %d, weights %v, skip %q; want step 1, weight 7, skip it0-2", states[2].step, states[2].w, skipped)
	}
	select {
	case errs := <-stepped:
		t.Fatalf("the step completed without the restart: %v", errs)
	default:
	}
	// The restart joins the step under way; all three count, and the lost
	// member's vector is not among them.
	hmu.Lock()
	held[2] = "it1-2"
	hmu.Unlock()
	v := nodes.Floats{3, 1}
	if n, err := members[2].AllReduce(ctx, 2, v); err != nil || n != 3 || v[0] != 6 {
		t.Fatalf("the restart's step: n %d, sum %v, err %v; want 3, 6", n, v, err)
	}
	for _, err := range <-stepped {
		if err == nil {
			continue
		}
		// step(0, 1) expects 2 contributors: 3 took part, as they should
		if !strings.Contains(err.Error(), "3 contributors") {
			t.Fatal(err)
		}
	}
}

// TestGroupLostWhole: a group that saves, lost whole, restores its last
// save: every restart is told the save's step and the items trained on
// up to it (dropped if they come back), not those after it (trained
// again); the restarts are all waited for from their first step; members
// hear the round the last save holds with every answer; a member that
// finished after the save restores with the others (its share, counted
// live, is evicted for it). A group that saves nothing cannot restore.
func TestGroupLostWhole(t *testing.T) {
	t.Parallel()
	conn := clustertest.Connector(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name         string
		saves, leave bool
		why          string
	}{
		{name: "saves", saves: true},
		{name: "saves nothing", why: "saves nothing"},
		// member 2 finished after the save: it restores too, its share
		// (still counted live) evicted
		{name: "finishing", saves: true, leave: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := conn()
			stage := strings.ReplaceAll(tc.name, " ", "_")
			h := New(stage, 3, host.MaxPayload(), true)
			serve(t, host, h, stage)
			var mu sync.Mutex
			held := make([]string, 3)
			heard := make([]uint32, 3)
			member := func(share string, restart bool) *group.Member {
				return &group.Member{NC: conn(), Subject: "dflow.r.r.grp." + stage, Share: share, Restart: restart,
					Held:    func(i int) string { mu.Lock(); defer mu.Unlock(); return held[i] },
					Durable: func(i int, round uint32) { mu.Lock(); heard[i] = round; mu.Unlock() }}
			}
			members := []*group.Member{member("w0", false), member("w1", false), member("w2", false)}
			for i, m := range members {
				if tc.saves {
					if err := m.Saves(ctx, i); err != nil {
						t.Fatal(err)
					}
				}
				if err := m.Keep(ctx, i, &weights{w: []float32{0}}); err != nil {
					t.Fatal(err)
				}
			}
			step := func(k int, ids ...int) {
				t.Helper()
				var wg sync.WaitGroup
				for _, i := range ids {
					wg.Add(1)
					go func() {
						defer wg.Done()
						mu.Lock()
						held[i] = fmt.Sprintf("it%d-%d", k, i)
						mu.Unlock()
						if _, err := members[i].AllReduce(ctx, i, nodes.Floats{1}); err != nil {
							t.Error(err)
						}
					}()
				}
				wg.Wait()
			}
			step(0, 0, 1, 2)
			step(1, 0, 1, 2)
			if tc.saves {
				if err := members[0].Saved(ctx, 0, 2); err != nil { // the state of rounds 1 and 2
					t.Fatal(err)
				}
			}
			step(2, 0, 1, 2)
			mu.Lock()
			if want := map[bool]uint32{true: 2}[tc.saves]; heard[1] != want {
				t.Errorf("member 1 heard the last save holds round %d, want %d", heard[1], want)
			}
			mu.Unlock()
			if tc.leave {
				if _, err := members[2].Leave(ctx, 2); err != nil {
					t.Fatal(err)
				}
			}
			h.Lose(0, "w0")
			h.Lose(1, "w1")
			if tc.leave {
				if e := h.Evictions(); !slices.Equal(e, []Eviction{{Member: 2, Share: "w2"}}) {
					t.Fatalf("lost whole after member 2 finished: evicts %v, want member 2 on w2", e)
				}
			}
			h.Lose(2, "w2") // (for the finished member: its share evicted)
			if tc.why != "" {
				if !h.AnyDue() || !strings.Contains(h.Why(), tc.why) {
					t.Fatalf("lost whole: due %v, why %q; want due, and %q", h.AnyDue(), h.Why(), tc.why)
				}
				return
			}
			if h.AnyDue() || !h.Restoring(0) || !h.Restoring(2) {
				t.Fatalf("lost whole: due %v, restoring %v %v; want none due, all restoring", h.AnyDue(), h.Restoring(0), h.Restoring(2))
			}
			// The restarts: each told the save's step and what any member
			// trained on up to the save (a shared queue gives an item one
			// member trained to whichever restart takes it).
			skipped := make([]string, 3)
			for i := range members {
				members[i] = member(fmt.Sprintf("w%d-r1", i), true)
				members[i].Skip = func(i int, ids []string) { skipped[i] = strings.Join(ids, ",") }
			}
			var re *nodes.Restore
			if err := members[1].Keep(ctx, 1, &weights{}); !errors.As(err, &re) || re.Step != 2 {
				t.Fatalf("the restart's Keep: %v, want a restore of step 2", err)
			}
			if want := "it0-0,it1-0,it0-1,it1-1,it0-2,it1-2"; skipped[1] != want {
				t.Errorf("restart 1 drops %q, want %s (every member's items up to the save; it2-N came after it)", skipped[1], want)
			}
			// A step of restart 1 alone waits for the others.
			done := make(chan error, 1)
			go func() {
				_, err := members[1].AllReduce(ctx, 1, nodes.Floats{1})
				done <- err
			}()
			testutil.Eventually(t, 5*time.Second, func() bool {
				h.mu.Lock()
				defer h.mu.Unlock()
				return len(h.arrived) == 1
			}, "restart 1 in the step")
			select {
			case err := <-done:
				t.Fatalf("a step of one restart of three completed: %v", err)
			default:
			}
			for _, i := range []int{0, 2} {
				if err := members[i].Keep(ctx, i, &weights{}); !errors.As(err, &re) || re.Step != 2 {
					t.Fatalf("restart %d's Keep: %v, want a restore of step 2", i, err)
				}
			}
			var wg sync.WaitGroup
			for _, i := range []int{0, 2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v := nodes.Floats{1}
					if n, err := members[i].AllReduce(ctx, i, v); err != nil || n != 3 || v[0] != 3 {
						t.Errorf("restart %d's first step: %d contributors, sum %v, %v; want 3, 3", i, n, v, err)
					}
				}()
			}
			wg.Wait()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLeftLost: a member that had finished on a lost worker, and stays
// finished, has left its group even where its leave never came, once: no
// round waits for it, and its share is gone.
func TestLeftLost(t *testing.T) {
	t.Parallel()
	h := New("drafter", 3, 1<<20, false)
	h.LeftLost(2, "w3")
	h.LeftLost(2, "w3") // its leave came after all, or a second word of the loss
	if !h.left[2] || h.members != 2 || !h.gone["w3"] {
		t.Errorf("left %v, members %d, gone %v; want replica 2 left, 2 members, w3 gone", h.left, h.members, h.gone)
	}
}
