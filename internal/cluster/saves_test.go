package cluster

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/nats-io/nats.go"
)

// TestFirstNoteBeforeASave: a local group's first note, sent before its
// first save (step -1), is a group with nothing to restore: it starts
// again, everything it trained on comes back. Taken for a save of step 0
// (the zero note it replaced read as one), the restart of a group lost
// before its first save's note failed to restore it ("restores its save
// of step 0, but the checkpoint holds step 4"). A restored group's first
// note, from its new share, still keeps the save it restored.
func TestFirstNoteBeforeASave(t *testing.T) {
	c := &Coordinator{instances: map[string]*instance{"w2": {name: "w2"}, "w3-r1": {name: "w3-r1"}}}
	note := func(n wire.SavesNote) {
		b, _ := json.Marshal(n)
		c.savesNote(&nats.Msg{Data: b})
	}
	note(wire.SavesNote{Share: "w2", Stage: "drafter", Saves: true, Step: -1})
	if r, ok := c.restoreFor("drafter"); !ok || r.Step != -1 {
		t.Errorf("before any save: restore %+v (%v), want step -1", r, ok)
	}
	if step, ok := c.LastSave("drafter"); ok {
		t.Errorf("before any save: LastSave %d", step)
	}
	note(wire.SavesNote{Share: "w2", Stage: "drafter", Saves: true, Step: 4, Skip: [][]string{{"a"}}})
	note(wire.SavesNote{Share: "w3-r1", Stage: "drafter", Saves: true, Step: -1})
	if r, ok := c.restoreFor("drafter"); !ok || r.Step != 4 || !slices.Equal(r.Skip[0], []string{"a"}) {
		t.Errorf("restored, before its first save: restore %+v (%v), want step 4 skipping a", r, ok)
	}
	if step, ok := c.LastSave("drafter"); !ok || step != 4 {
		t.Errorf("restored: LastSave %d (%v), want 4", step, ok)
	}
}
