package engine

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
)

// keySink records which replica got each key.
type keySink struct {
	mu  sync.Mutex
	got map[string]map[int]int // key -> replica -> items
}

func (k *keySink) Run(ctx context.Context, r nodes.Replica) error {
	in := r.In("in")
	for {
		item, err := in.Recv(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		key := item.(nodes.Keyed).Key()
		k.mu.Lock()
		if k.got[key] == nil {
			k.got[key] = map[int]int{}
		}
		k.got[key][r.Index()]++
		k.mu.Unlock()
	}
}

const keySpec = `
stage "src" {
  node     = "synthetic_source"
  replicas = 2
  config {
    count = 600
    keys  = 25
  }
}
stage "mid" {
  node     = "synthetic_work"
  replicas = 2
}
stage "dst" {
  node     = "key_sink"
  replicas = 3
}
edge "a" {
  from   = src.out
  to     = mid.in
  policy = "key_hash"
}
edge "e" {
  from     = mid.out
  to       = dst.in
  policy   = "key_hash"
  capacity = 2
}`

func keyHarness(t *testing.T) (*harness, *keySink) {
	h := newHarness(t)
	ks := &keySink{got: map[string]map[int]int{}}
	h.reg.Register(nodes.Spec{Kind: graph.Kind{Name: "key_sink", Ports: func(*graph.Config) []graph.PortSpec {
		return []graph.PortSpec{{Name: "in", Dir: graph.In, Type: graph.Any}}
	}}, New: func(*graph.Config) (nodes.Node, error) { return ks, nil }})
	return h, ks
}

// TestKeyHash: through two key_hash edges (a forwarding stage keeps the
// keys), every item of a key reaches one consumer replica, the one
// hash(key) mod 3 names, and the per-replica counts are the hash's.
func TestKeyHash(t *testing.T) {
	t.Parallel()
	h, ks := keyHarness(t)
	rep, err := h.run(h.load(keySpec), Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkBalanced(t, rep)
	if len(ks.got) != 25 {
		t.Fatalf("%d keys arrived, want 25", len(ks.got))
	}
	want := make([]int64, 3)
	for key, by := range ks.got {
		c := graph.KeyConsumer(key, 3)
		if len(by) != 1 || by[c] != 24 { // 600 items over 25 keys taking turns
			t.Errorf("key %s: replicas %v, want 24 items all on replica %d", key, by, c)
		}
		want[c] += 24
	}
	for i, r := range rep.Stages["dst"].Replicas {
		if r.ItemsIn != want[i] {
			t.Errorf("dst replica %d got %d items, want %d (the hash's)", i, r.ItemsIn, want[i])
		}
	}
	if got := graph.KeyHashOf("k0"); got != 0x08be0e07b562230e { // FNV-1a 64 of "k0": stable across versions
		t.Errorf("KeyHashOf(k0) = %#x", got)
	}
}

// TestKeyHashNoKey: an item without a key on a key_hash edge fails the
// run, naming the edge, the stage and the replica.
func TestKeyHashNoKey(t *testing.T) {
	t.Parallel()
	h, _ := keyHarness(t)
	spec := strings.Replace(keySpec, "keys  = 25", "keys  = 0", 1)
	_, err := h.run(h.load(spec), Options{})
	if err == nil || !errors.Is(err, nodes.ErrNoKey) {
		t.Fatalf("err = %v, want ErrNoKey", err)
	}
	for _, want := range []string{`edge "a"`, `stage "src" replica `, "*items.Blob"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// One consumer still routes: a key is required on every key_hash edge.
	h, _ = keyHarness(t)
	spec = strings.Replace(spec, "replicas = 3", "replicas = 1", 1)
	if _, err := h.run(h.load(spec), Options{}); !errors.Is(err, nodes.ErrNoKey) {
		t.Errorf("one consumer: err = %v, want ErrNoKey", err)
	}
}
