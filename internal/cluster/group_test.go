package cluster

import (
	"context"
	"github.com/dflow-dev/dflow/internal/nn"
	nnreduce "github.com/dflow-dev/dflow/internal/nn/reduce"
	"sync"
	"testing"
	"time"

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
	h := newGroupHost("s", 3)
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
	members[2].Leave(2)
	reduce(0, 1)
	done := make(chan error, 1)
	go func() { done <- members[1].Barrier(ctx, 1) }()
	members[0].Leave(0)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := members[0].AllReduce(ctx, 0, nodes.Floats{1}); err == nil {
		t.Error("a member that left took part in a collective")
	}
}
