package python

import (
	"encoding/json"
	"os/exec"
	"testing"
)

// timesScript drives the SDK's _Times (dflowplugin.times) on a clock it
// moves, in the interleaving of the Go SDK's TestTimesOverlappingWaits: a
// recv waiting 0-30 on one thread, a send waiting 10-50 on another, two
// sends from two threads waiting 55-70 and 60-80, the next recv at 100.
// It prints the Times said at 20 and at 120, with waits on two recvs (two
// ports) after.
const timesScript = `
import json
from dflowplugin import times as d

class Clock:
    at = 0

c = Clock()
t = d._Times(True, False)
t._now = lambda: c.at

def say(at):
    c.at = at
    m = t.message(final=True).times
    return {"busy": m.busy_ns, "idle": m.idle_ns, "blocked": m.blocked_ns, "now": int(m.now),
            "service": m.service_ns, "items": sum(b.count for b in m.service)}

out = {}
t.next()
recv = t.wait(d._IDLE); recv.__enter__()
c.at = 10
send = t.wait(d._BLOCKED); send.__enter__()
out["at20"] = say(20)
c.at = 30; recv.__exit__(None, None, None)
c.at = 50; send.__exit__(None, None, None)
c.at = 55; s1 = t.wait(d._BLOCKED); s1.__enter__()
c.at = 60; s2 = t.wait(d._BLOCKED); s2.__enter__()
c.at = 70; s1.__exit__(None, None, None)
c.at = 80; s2.__exit__(None, None, None)
c.at = 100; t.next()
out["at120"] = say(120)
c.at = 125; r1 = t.wait(d._IDLE); r1.__enter__()
c.at = 135; r2 = t.wait(d._IDLE); r2.__enter__()
out["at145"] = say(145)
print(json.dumps(out))
`

// TestTimesOverlappingWaits: the Python SDK counts each instant of
// overlapping waits once, as the Go SDK does (blocked while any send
// waits, else idle while any recv waits), so busy + idle + blocked is the
// wall time and an item's service time is the busy time between its recv
// and the next. Counted per wait, the item's service time was 0 and busy
// clamped to 0 while a recv and a send both waited.
func TestTimesOverlappingWaits(t *testing.T) {
	needModules(t, "grpc", "google.protobuf")
	out, err := exec.Command(system, "-c", timesScript).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	type said struct{ Busy, Idle, Blocked, Now, Service, Items int64 }
	var got map[string]said
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	const busy, idle, blocked = 0, 1, 2 // Activity
	for _, c := range []struct {
		at   string
		want said
	}{
		{"at20", said{Busy: 0, Idle: 10, Blocked: 10, Now: blocked}},
		{"at120", said{Busy: 45, Idle: 10, Blocked: 65, Now: busy, Service: 25, Items: 1}},
		{"at145", said{Busy: 50, Idle: 30, Blocked: 65, Now: idle}},
	} {
		if g := got[c.at]; g != c.want {
			t.Errorf("%s: %+v, want %+v", c.at, g, c.want)
		}
	}
}
