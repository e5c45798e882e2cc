package host

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/plugintest"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/synthetic"
	"github.com/dflow-dev/dflow/plugins/internal/wire"
	"github.com/dflow-dev/dflow/plugins/sdk"
)

// remakeKind sends, for every blob it receives, a new blob of the same
// size whose bytes are all byte(Seq): an item made in the plugin, which
// goes out through the plugin's pool.
var remakeKind = nodes.Spec{
	Kind: graph.Kind{Name: "remake", Ports: func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "blob"}, {Name: "out", Dir: graph.Out, Type: "blob"}}
	}},
	New: func(*graph.Config) (nodes.Node, error) {
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			for {
				item, err := r.In("in").Recv(ctx)
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				if sdk.Shared(item) {
					r.Metrics().Add("shared", 1)
				}
				b := item.(*synthetic.Blob)
				// bytes.Repeat copies, as the check below counts, a range
				// at a time: a loop over each byte costs more than the rest
				// of the test under -race
				data := bytes.Repeat([]byte{byte(b.Seq)}, len(b.Data))
				if err := r.Out("out").Send(ctx, &synthetic.Blob{Replica: b.Replica, Seq: b.Seq, Data: data}); err != nil {
					return err
				}
			}
		}), nil
	},
}

// lateKind breaks the lifetime rule: it sends its first item after it
// has received the second.
var lateKind = nodes.Spec{
	Kind: graph.Kind{Name: "late", Ports: func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: "blob"}, {Name: "out", Dir: graph.Out, Type: "blob"}}
	}},
	New: func(*graph.Config) (nodes.Node, error) {
		return nodes.NodeFunc(func(ctx context.Context, r nodes.Replica) error {
			first, err := r.In("in").Recv(ctx)
			if err != nil {
				return err
			}
			if _, err := r.In("in").Recv(ctx); err != nil {
				return err
			}
			return r.Out("out").Send(ctx, first)
		}), nil
	},
}

// poolWatch records, for every replica's pools as its stream ends, the
// regions of pool 0 the plugin has not released.
func poolWatch(t *testing.T) *[]int {
	var mu sync.Mutex
	var live []int
	poolsClosing = func(ps *wire.Pools) {
		mu.Lock()
		live = append(live, ps.In.Live())
		mu.Unlock()
	}
	t.Cleanup(func() { poolsClosing = nil })
	return &live
}

// shmLeft lists what names shared memory in /dev/shm, and the pools this
// process still maps.
func shmLeft(t *testing.T) (devShm []string, maps []string) {
	t.Helper()
	entries, _ := os.ReadDir("/dev/shm")
	for _, e := range entries {
		devShm = append(devShm, e.Name())
	}
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skip("no /proc/self/maps")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "dflow-pool") {
			maps = append(maps, line)
		}
	}
	return devShm, maps
}

// TestSharedMemory: large items cross by reference, both ways, with
// counts and contents exact; a plugin that does not take shared memory
// (as one built before it) gets the same items as bytes. Every region
// sent is released by the end, and nothing is left in /dev/shm or mapped.
func TestSharedMemory(t *testing.T) {
	if !wire.SharedMemoryEnabled() {
		t.Skip("no shared memory here")
	}
	shmBefore, _ := shmLeft(t)
	live := poolWatch(t)
	f := newFixture(t)
	var mu sync.Mutex
	bad := 0
	f.reg.Register(plugintest.Sink("seq_sink", "blob", func(item any) error {
		b := item.(*synthetic.Blob)
		if len(b.Data) != 1<<20 || bytes.Count(b.Data, []byte{byte(b.Seq)}) != len(b.Data) {
			mu.Lock()
			bad++
			mu.Unlock()
		}
		return nil
	}))
	if _, err := f.h.Load("tp", wrapper(t, f.dir, "tp", "serve"), f.reg); err != nil {
		t.Fatal(err)
	}
	old := script(t, f.dir, "old", fmt.Sprintf("DFLOW_PLUGIN_SHM=off DFLOW_TEST_PLUGIN=serve exec %q -test.run='^$' \"$0\"\n", self(t)))
	if _, err := f.h.Load("old", old, f.reg); err != nil {
		t.Fatal(err)
	}
	// In by reference, passed on unchanged: the items that went in.
	rep, err := f.run(fmt.Sprintf(passSpec, 200, 1<<20, "tp/pass", 2))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Edges["b"].Consumed != 200 || len(f.got.sizes) != 200 || rep.Stages["p"].Metrics["shared"] != 200 {
		t.Errorf("pass: %d items out, %d at the sink, %v by reference; want 200", rep.Edges["b"].Consumed, len(f.got.sizes), rep.Stages["p"].Metrics["shared"])
	}
	// Made in the plugin: out through its pool.
	spec := strings.Replace(fmt.Sprintf(passSpec, 100, 1<<20, "tp/remake", 2), `"check_sink"`, `"seq_sink"`, 1)
	rep, err = f.run(spec)
	if err != nil {
		t.Fatalf("%v\n%s", err, f.stderr)
	}
	if rep.Edges["b"].Consumed != 100 || rep.Stages["p"].Metrics["shared"] != 100 || bad != 0 {
		t.Errorf("remake: %d items out, %v by reference, %d with the wrong bytes", rep.Edges["b"].Consumed, rep.Stages["p"].Metrics["shared"], bad)
	}
	if len(*live) != 4 || slices.ContainsFunc(*live, func(n int) bool { return n != 0 }) {
		t.Errorf("regions of pool 0 not released by the end of each replica: %v", *live)
	}
	// A plugin without shared memory: the same items, as bytes.
	f.got.sizes = map[string]int{}
	rep, err = f.run(fmt.Sprintf(passSpec, 50, 1<<20, "old/pass", 1))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Edges["b"].Consumed != 50 || len(f.got.sizes) != 50 || rep.Stages["p"].Metrics["shared"] != 0 {
		t.Errorf("old: %d items out, %d at the sink, %v by reference; want 50, 50, 0", rep.Edges["b"].Consumed, len(f.got.sizes), rep.Stages["p"].Metrics["shared"])
	}
	if len(*live) != 4 {
		t.Errorf("pools offered to a plugin that did not say shared_memory")
	}
	shmAfter, maps := shmLeft(t)
	if !slices.Equal(shmBefore, shmAfter) || len(maps) > 0 {
		t.Errorf("shared memory left behind: /dev/shm %v then %v; mapped: %v", shmBefore, shmAfter, maps)
	}
}

// TestSharedMemoryCrash: a plugin killed mid-stream (it exits at once, as
// with SIGKILL) with items of dflow's pool in hand fails its stage, and
// leaves nothing mapped or named.
func TestSharedMemoryCrash(t *testing.T) {
	if !wire.SharedMemoryEnabled() {
		t.Skip("no shared memory here")
	}
	shmBefore, _ := shmLeft(t)
	f := newFixture(t)
	f.h.Load("tp", wrapper(t, f.dir, "tp", "serve"), f.reg)
	_, err := f.run(fmt.Sprintf(passSpec, 100, 1<<20, "tp/pass", 1), "stage.p.config.crash_after=7")
	if err == nil || !strings.Contains(err.Error(), "crashing on purpose after 7 items") {
		t.Fatalf("err = %v", err)
	}
	shmAfter, maps := shmLeft(t)
	if !slices.Equal(shmBefore, shmAfter) || len(maps) > 0 {
		t.Errorf("shared memory left behind: /dev/shm %v then %v; mapped: %v", shmBefore, shmAfter, maps)
	}
}

// TestKeptPastItsLifetime: a node that sends an item by reference after
// its next Recv on the port (when dflow may have reused its region) fails
// with the rule, instead of sending bytes that may have changed.
func TestKeptPastItsLifetime(t *testing.T) {
	if !wire.SharedMemoryEnabled() {
		t.Skip("no shared memory here")
	}
	f := newFixture(t)
	f.h.Load("tp", wrapper(t, f.dir, "tp", "serve"), f.reg)
	_, err := f.run(fmt.Sprintf(passSpec, 10, 1<<20, "tp/late", 1))
	if err == nil || !strings.Contains(err.Error(), "valid until the next Recv on its port") {
		t.Fatalf("err = %v", err)
	}
}

// TestPoolFewRegionsInARun: a run of 16 MiB items through a plugin writes
// them to a few regions of its replica's pool 0, over and over (what the
// windows let be in flight, and the regions resting: wire's
// TestPoolFewRegions), not to the whole pool in turn, where every item
// would be written to memory long out of the cache.
func TestPoolFewRegionsInARun(t *testing.T) {
	if !wire.SharedMemoryEnabled() {
		t.Skip("no shared memory here")
	}
	var mu sync.Mutex
	var touched []int64
	poolsClosing = func(ps *wire.Pools) {
		mu.Lock()
		touched = append(touched, ps.In.Touched())
		mu.Unlock()
	}
	t.Cleanup(func() { poolsClosing = nil })
	f := newFixture(t)
	if _, err := f.h.Load("tp", wrapper(t, f.dir, "tp", "serve"), f.reg); err != nil {
		t.Fatal(err)
	}
	const size, items = 16 << 20, 40
	if _, err := f.run(fmt.Sprintf(passSpec, items, size, "tp/pass", 1)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(touched) != 1 {
		t.Fatalf("%d replicas' pools seen closing, want 1", len(touched))
	}
	// In flight at most: what the plugin's input window holds (the SDK's
	// default InputBytes, 64 MiB), what its output window to dflow holds
	// on the way back (outletBytes; a region of pool 0 is released once
	// its reference back is sent), the node's item, and the two regions
	// resting. Taken in turn, the 40 items would have gone round the
	// whole pool (256 MiB).
	if limit := 64<<20 + outletBytes + 3*size; touched[0] > limit {
		t.Errorf("pool 0 written up to %d MiB by %d items of 16 MiB, want %d MiB at most", touched[0]>>20, items, limit>>20)
	}
	t.Logf("pool 0 written up to %d MiB", touched[0]>>20)
}
