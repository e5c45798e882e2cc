package python

import (
	"os/exec"
	"strings"
	"testing"
)

// keptScript plays dflow's side of a replica's pool 0 (anonymous maps in
// place of dflow's memfds): two items by reference, the node keeps the
// first past its next recv, then dflow takes the first's region again
// for a third item, which the node has not asked for yet. It prints what
// sending each item did.
const keptScript = `
import mmap, queue, types
import dflowplugin as d
from dflowplugin.shm import _Pools

N, SIZE = 100 << 10, 1 << 20
p = _Pools([mmap.mmap(-1, SIZE), mmap.mmap(-1, SIZE)], 64 << 10)

r = d.Replica(types.SimpleNamespace(stage="s", replica=0, replicas=1, device=""), {}, queue.Queue())
r._pools = p
q = r._inputs["in"] = queue.Queue()

def deliver(off):  # the receiver's part: an item by reference
    with p.lock:
        p.held[off] = N
    q.put((p.view[0][off:off + N], off))

def send(name, item):
    try:
        r.send("out", item)
        print(name, "sent")
    except d.BadItem as e:
        print(name, "failed:", e)

deliver(0)
deliver(N)
items = r.recv("in")
first = next(items)
second = next(items)  # the first's lifetime ends: its region is released
send("second", second)
deliver(0)  # dflow took the first's region again, for a third item
send("first", first)
third = next(items)
send("third", third)
`

// TestKeptWhileItsRegionHoldsALaterItem: as the Go SDK's, a Python node
// that sends an item it kept past its lifetime fails with the rule also
// once dflow has written a later item to its region, as long as the
// node has not asked for that item (only the regions held were checked:
// the kept item went out silently as the later one).
func TestKeptWhileItsRegionHoldsALaterItem(t *testing.T) {
	needModules(t, "grpc", "google.protobuf", "numpy")
	out, err := exec.Command(system, "-c", keptScript).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{"second sent", "first failed: the item lies in the memory of an item received by reference that the node no longer holds", "third sent"}
	if len(got) != len(want) {
		t.Fatalf("got\n%s\nwant lines starting\n%s", out, strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("line %d: %q, want it to start %q", i+1, got[i], want[i])
		}
	}
}
