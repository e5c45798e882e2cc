package synthetic

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/dflow-dev/dflow/nodes/text"
	"github.com/zclconf/go-cty/cty"
)

func TestShare(t *testing.T) {
	for _, tc := range []struct{ count, n int }{{10, 3}, {2, 5}, {0, 4}, {300, 1}, {7, 7}} {
		total := 0
		for i := 0; i < tc.n; i++ {
			s := Share(tc.count, i, tc.n)
			if s < tc.count/tc.n || s > tc.count/tc.n+1 {
				t.Errorf("Share(%d, %d, %d) = %d, uneven", tc.count, i, tc.n, s)
			}
			total += s
		}
		if total != tc.count {
			t.Errorf("shares of %d over %d add to %d", tc.count, tc.n, total)
		}
	}
}

// TestClockReproducible: the same seed and replica draw the same service
// times; another replica draws others; speed divides them.
func TestClockReproducible(t *testing.T) {
	cfg := graph.NewConfig(map[string]cty.Value{
		"service_time": cty.StringVal("lognormal(40ms, 0.3)"),
		"seed":         cty.NumberIntVal(42),
		"speed":        cty.ListVal([]cty.Value{cty.NumberIntVal(1), cty.NumberFloatVal(0.5)}),
	})
	tm, err := newTiming(cfg)
	if err != nil {
		t.Fatal(err)
	}
	draw := func(replica int) []time.Duration {
		c := tm.clock("s", replica)
		var out []time.Duration
		for range 5 {
			out = append(out, c.next())
		}
		return out
	}
	a, b, other := draw(0), draw(0), draw(1)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("draw %d differs between runs: %v vs %v", i, a[i], b[i])
		}
	}
	if a[0] == other[0] {
		t.Error("replicas 0 and 1 drew the same first time")
	}
	if tm.clock("t", 0).next() == a[0] {
		t.Error("stages s and t drew the same first time with the same seed")
	}
	// Replica 2 has speed[2 % 2] = 1 and replica 3 speed 0.5: same stream
	// seeds differ, so compare the mean instead over many draws.
	c := tm.clock("s", 3)
	var sum time.Duration
	for range 2000 {
		sum += c.next()
	}
	if mean := sum / 2000; mean < 72*time.Millisecond || mean > 88*time.Millisecond {
		t.Errorf("speed 0.5 replica mean %v, want about 80ms", mean)
	}
}

func TestCheckRejects(t *testing.T) {
	cfg := graph.NewConfig(map[string]cty.Value{
		"service_time": cty.StringVal("soon"),
		"speed":        cty.ListValEmpty(cty.Number),
		"count":        cty.NumberIntVal(-1),
		"type":         cty.StringVal("any"),
	})
	errs := sourceKind.Check(cfg)
	if len(errs) != 4 {
		t.Errorf("want 4 errors (service_time, speed, count, type), got %v", errs)
	}
}

// TestSourceItemsAreTheirType: synthetic_source's items are of the Go
// type its port type means (graph.WireTypes): a type it cannot make is
// an error at validation, not items its consumer cannot use.
func TestSourceItemsAreTheirType(t *testing.T) {
	config := func(typ string) *graph.Config {
		return graph.NewConfig(map[string]cty.Value{"count": cty.NumberIntVal(1), "size_bytes": cty.NumberIntVal(16),
			"type": cty.StringVal(typ), "service_time": cty.StringVal("0s")})
	}
	for _, typ := range []string{"hidden_states", "hidden_states(d=8,layers=1)"} {
		if errs := sourceKind.Check(config(typ)); len(errs) != 1 || !strings.Contains(errs[0].Error(), "*items.HiddenStates") {
			t.Errorf("type %q: %v", typ, errs)
		}
	}
	for typ, want := range map[string]string{"blob": "*items.Blob", "frames": "*items.Blob", "bytes": "[]uint8", "tokens": "*items.Batch"} {
		if errs := sourceKind.Check(config(typ)); len(errs) != 0 {
			t.Errorf("type %q: %v", typ, errs)
		}
		n, err := newSource(config(typ))
		if err != nil {
			t.Fatal(err)
		}
		item := n.(*source).item(1, 7)
		if got := fmt.Sprintf("%T", item); got != want {
			t.Errorf("type %q: a %s item, want %s", typ, got, want)
		}
		if s, ok := item.(nodes.Sizer); ok && s.SizeBytes() != 16 {
			t.Errorf("type %q: %d bytes, want 16", typ, s.SizeBytes())
		}
		if b, ok := item.(*text.Batch); ok && (b.B*(b.T+1) != len(b.Tokens) || b.Seq != 7) {
			t.Errorf("tokens: %+v", b)
		}
	}
}

// TestCostChange: with change_after the stage's first N items take
// service_time and the rest changed_service_time, counted over its
// replicas (one node, shared by them); with change_at the change comes
// with the time since the stage's start.
func TestCostChange(t *testing.T) {
	config := func(kv ...string) *graph.Config {
		m := map[string]cty.Value{"service_time": cty.StringVal("10ms"), "changed_service_time": cty.StringVal("30ms")}
		for i := 0; i < len(kv); i += 2 {
			if kv[i] == "change_after" {
				n, _ := strconv.Atoi(kv[i+1])
				m[kv[i]] = cty.NumberIntVal(int64(n))
			} else {
				m[kv[i]] = cty.StringVal(kv[i+1])
			}
		}
		return graph.NewConfig(m)
	}
	tm, err := newTiming(config("change_after", "5"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := tm.clock("s", 0), tm.clock("s", 1)
	var got []time.Duration
	for range 4 {
		got = append(got, a.next(), b.next())
	}
	want := []time.Duration{10, 10, 10, 10, 10, 30, 30, 30}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("draws over two replicas %v; want the stage's first 5 at 10ms, then 30ms", got)
		}
	}
	tm, err = newTiming(config("change_at", "1h"))
	if err != nil {
		t.Fatal(err)
	}
	if d := tm.clock("s", 0).next(); d != 10*time.Millisecond {
		t.Errorf("change_at 1h: first draw %v, want 10ms", d)
	}
	tm, err = newTiming(config("change_at", "1ns"))
	if err != nil {
		t.Fatal(err)
	}
	c := tm.clock("s", 0)
	deadline := time.Now().Add(10 * time.Second)
	for c.next() != 30*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatal("change_at 1ns: still 10ms a draw after 10s")
		}
	}
	// The simulator's model draws the same, from the time and count the
	// simulation gives.
	m, err := simModel(config("change_after", "3"))
	if err != nil {
		t.Fatal(err)
	}
	if m.ServiceAt == nil {
		t.Fatal("a changing cost gives the simulator no ServiceAt")
	}
	at := m.ServiceAt("s", 0)
	if d0, d3 := at(0, 2), at(0, 3); d0 != 10*time.Millisecond || d3 != 30*time.Millisecond {
		t.Errorf("ServiceAt: item 2 takes %v, item 3 %v; want 10ms then 30ms", d0, d3)
	}
	m, err = simModel(config("change_at", "2s"))
	if err != nil {
		t.Fatal(err)
	}
	at = m.ServiceAt("s", 0)
	if d0, d1 := at(1999*time.Millisecond, 100), at(2*time.Second, 0); d0 != 10*time.Millisecond || d1 != 30*time.Millisecond {
		t.Errorf("ServiceAt: at 1.999s %v, at 2s %v; want 10ms then 30ms", d0, d1)
	}
	if m, _ := simModel(graph.NewConfig(map[string]cty.Value{"service_time": cty.StringVal("10ms")})); m.ServiceAt != nil {
		t.Error("a cost that does not change gives the simulator a ServiceAt")
	}
}

// TestCostChangeCheck: changed_service_time and one of change_after and
// change_at go together, each valid.
func TestCostChangeCheck(t *testing.T) {
	for _, tc := range []struct {
		cfg  map[string]cty.Value
		want string
	}{
		{map[string]cty.Value{"changed_service_time": cty.StringVal("30ms")}, "needs change_after = N (items) or change_at"},
		{map[string]cty.Value{"change_after": cty.NumberIntVal(5)}, "change_after: needs changed_service_time"},
		{map[string]cty.Value{"change_at": cty.StringVal("30s")}, "change_at: needs changed_service_time"},
		{map[string]cty.Value{"change_at": cty.StringVal("soon"), "changed_service_time": cty.StringVal("1ms")}, `change_at: must be a duration above 0 after the stage's start, such as "30s"; got "soon"`},
		{map[string]cty.Value{"change_after": cty.NumberIntVal(-1)}, "change_after: must be 0 (no change) or more; got -1"},
		{map[string]cty.Value{"change_after": cty.NumberIntVal(5), "change_at": cty.StringVal("1s"), "changed_service_time": cty.StringVal("1ms")}, "not both"},
		{map[string]cty.Value{"change_after": cty.NumberIntVal(5), "changed_service_time": cty.StringVal("later")}, "changed_service_time:"},
	} {
		tc.cfg["service_time"] = cty.StringVal("1ms")
		errs := workKind.Check(graph.NewConfig(tc.cfg))
		var msgs []string
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}
		if all := strings.Join(msgs, "; "); !strings.Contains(all, tc.want) {
			t.Errorf("%v: errors %q, want one with %q", tc.cfg, all, tc.want)
		}
	}
	ok := graph.NewConfig(map[string]cty.Value{"service_time": cty.StringVal("1ms"),
		"change_after": cty.NumberIntVal(5), "changed_service_time": cty.StringVal("lognormal(4ms, 0.2)")})
	if errs := sinkKind.Check(ok); len(errs) != 0 {
		t.Errorf("a valid change: %v", errs)
	}
}
