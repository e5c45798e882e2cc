package control

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRootsAllow: paths under the roots pass, one to be made included; a
// link to nothing does not.
func TestRootsAllow(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := Roots{Write: []string{dir}}
	if err := r.CheckRead(filepath.Join(dir, "new", "deeper", "file")); err != nil {
		t.Errorf("a file to be made under the root: %v", err)
	}
	if err := r.CheckRead(os.Args[0]); err == nil && !strings.HasPrefix(os.Args[0], dir) {
		t.Errorf("%s, outside the root, passed", os.Args[0])
	}
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(t.TempDir(), "nothing"), dangling); err == nil {
		if err := r.CheckRead(dangling); err == nil {
			t.Errorf("a link to nothing passed")
		}
	}
}
