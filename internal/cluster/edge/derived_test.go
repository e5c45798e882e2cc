package edge

import (
	"encoding/base64"
	"testing"
)

// TestDerivedID: an id derived from a delivery is the same for the same
// delivery, count and edge, differs where any of them does, and carries
// 128 bits, so that two different items' ids do not meet in a stream's
// window of duplicates (which would drop the second).
func TestDerivedID(t *testing.T) {
	a := DerivedID("in-1", 0, "0")
	if a != DerivedID("in-1", 0, "0") {
		t.Fatal("the same delivery, count and edge derive two ids")
	}
	seen := map[string]string{a: "in-1 0 0"}
	for _, c := range []struct {
		id string
		k  int
		at string
	}{{"in-2", 0, "0"}, {"in-1", 1, "0"}, {"in-1", 0, "1"}, {"in-10", 0, "0"}, {"in-1", 10, "0"}} {
		d := DerivedID(c.id, c.k, c.at)
		if was, ok := seen[d]; ok {
			t.Errorf("%v derives %s, as %s does", c, d, was)
		}
		seen[d] = c.id
	}
	raw, err := base64.RawURLEncoding.DecodeString(a[1:])
	if a[0] != 'f' || err != nil || len(raw) != 16 {
		t.Errorf("derived id %q: want f and 128 bits (%d bytes, %v)", a, len(raw), err)
	}
}
