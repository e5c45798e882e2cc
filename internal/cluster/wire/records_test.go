package wire

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
)

// TestChainTwice: a stream's head settled by more than one share (its
// first holder recorded it in its last settle and was lost before the
// ack; later ones saw it delivered before) counts once: what it derived
// comes off for each share past the first; a head settled once, and a
// redelivered one only one share settled, come off nothing.
func TestChainTwice(t *testing.T) {
	t.Parallel()
	recs := map[string]ChainRecord{
		"lost":  {Last: ChainHeads{IDs: []string{"x", "y"}}},
		"again": {Redone: map[string]map[string]int64{"x": {"e": 2, "f": 1}}},
		"third": {Redone: map[string]map[string]int64{"x": {"e": 2, "f": 1}, "z": {"e": 5}}},
	}
	if got, want := ChainTwice(recs), map[string]int64{"e": 4, "f": 2}; !maps.Equal(got, want) {
		t.Errorf("chainTwice = %v, want %v", got, want)
	}
	b, _ := json.Marshal(recs["lost"])
	var back ChainRecord
	if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back.Last.IDs, []string{"x", "y"}) {
		t.Errorf("a record through JSON: %+v, %v", back, err)
	}
}
