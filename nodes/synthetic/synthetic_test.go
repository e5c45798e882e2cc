package synthetic

import (
	"fmt"
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
