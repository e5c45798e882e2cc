package cluster

import (
	"context"
	"encoding/binary"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/nn"
	nnreduce "github.com/dflow-dev/dflow/internal/nn/reduce"
	"github.com/dflow-dev/dflow/nodes"
)

// TestGroupAcrossWorkers: the coordinator-hosted group sums the members'
// vectors, and a member's leaving is no longer waited for, whether it
// leaves between rounds or while the others wait (uneven ends).
func TestGroupAcrossWorkers(t *testing.T) {
	srv, err := StartServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	host, _ := Connect(ConnOptions{URL: srv.URL, Token: srv.Token})
	defer host.Close()
	h := newGroupHost("s", 3, host.MaxPayload())
	sub, err := host.Subscribe(subjGroup("r", "s"), h.handle)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	host.Flush()
	var members []*remoteGroup
	for range 3 {
		nc, _ := Connect(ConnOptions{URL: srv.URL, Token: srv.Token})
		defer nc.Close()
		members = append(members, &remoteGroup{nc: nc, subject: subjGroup("r", "s")})
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
	h := newGroupHost("s", 2, 1<<20)
	part := func(replica, total, off int, vals ...float32) []byte {
		b := make([]byte, 13+4*len(vals))
		b[0] = opReduce
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
	h.mu.Unlock()
	h.leave(1)
	if h.open || h.sum != nil || len(h.partial) != 0 {
		t.Fatalf("after the leave: open %v, sum %v, partial %v", h.open, h.sum, h.partial)
	}
	// The next round: member 0 alone, its own vector.
	h.mu.Lock()
	h.open, h.reduce, h.err = true, true, ""
	if !h.addPartLocked(0, part(0, 4, 0, 1, 1, 1, 1)[5:]) {
		t.Fatal("a whole vector not taken as the last part")
	}
	got := h.sum
	h.mu.Unlock()
	for i, v := range got {
		if v != 1 {
			t.Fatalf("sum %v: value %d has member 1's part in it", got, i)
		}
	}
}
