package dataplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func newKey() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestRefusesStrangers: a share's data plane gives nothing to a
// request without the run's data key, or with another.
func TestRefusesStrangers(t *testing.T) {
	t.Parallel()
	dp, err := New("run1", newKey(), "127.0.0.1", false)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	dp.Put("x", [][]byte{[]byte("secret bytes")}, nil, nil)
	for _, auth := range []string{"", "Bearer " + newKey(), "Bearer "} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+dp.Addr()+"/v1/run1/x", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || bytes.Contains(body, []byte("secret")) {
			t.Errorf("authorization %q: %s %q", auth, resp.Status, body)
		}
	}
	// With the key: the bytes, then released.
	got, err := dp.Fetch(context.Background(), Ref{Addr: dp.Addr(), Size: 12}, "x")
	if err != nil || string(got) != "secret bytes" {
		t.Fatalf("with the key: %q, %v", got, err)
	}
	dp.Release(context.Background(), Ref{Addr: dp.Addr()}, "x")
	if n, _ := dp.Holding(); n != 0 {
		t.Errorf("%d items held after their release", n)
	}
	// A share speaking TLS: a client pinning another certificate is refused.
	tdp, err := New("run1", dp.Key(), "127.0.0.1", true)
	if err != nil {
		t.Fatal(err)
	}
	defer tdp.Close()
	tdp.Put("y", [][]byte{[]byte("tls bytes")}, nil, nil)
	if got, err := tdp.Fetch(context.Background(), Ref{Addr: tdp.Addr(), Pin: tdp.Pin(), Size: 9}, "y"); err != nil || string(got) != "tls bytes" {
		t.Errorf("over TLS, pinned: %q, %v", got, err)
	}
	if _, err := tdp.Fetch(context.Background(), Ref{Addr: tdp.Addr(), Pin: strings.Repeat("0", 64), Size: 9}, "y"); err == nil {
		t.Error("over TLS, a certificate other than the pinned one was accepted")
	}
}

// TestAddresses: a worker that reaches the broker on loopback
// listens on every interface and gives each of its addresses, loopback
// first; a consumer takes the first address that answers.
func TestAddresses(t *testing.T) {
	t.Parallel()
	dp, err := New("run1", newKey(), "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	addrs := strings.Split(dp.Addr(), ",")
	if !strings.HasPrefix(addrs[0], "127.0.0.1:") {
		t.Errorf("addresses %v: loopback first", addrs)
	}
	dp.Put("x", [][]byte{[]byte("bytes")}, nil, nil)
	// An address where nothing listens first (loopback port 1): the next.
	r := Ref{Addr: "127.0.0.1:1," + addrs[0], Size: 5}
	if got, err := dp.Fetch(context.Background(), r, "x"); err != nil || string(got) != "bytes" {
		t.Errorf("fetch past an address that does not answer: %q, %v", got, err)
	}
}

// input counts what the plane tells the input a held item derives from.
type input struct {
	mu                sync.Mutex
	derived, answered int
}

func (i *input) Derived()  { i.mu.Lock(); i.derived++; i.mu.Unlock() }
func (i *input) Answered() { i.mu.Lock(); i.answered++; i.mu.Unlock() }
func (i *input) counts() (int, int) {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.derived, i.answered
}

// queue is a Queue whose stream stores the sequences in stored.
type queue struct {
	mu          sync.Mutex
	stored      map[uint64]bool
	noConsumers bool
}

func (q *queue) Stores(_ context.Context, seq uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stored[seq]
}

func (q *queue) NoConsumers(context.Context) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.noConsumers
}

// TestHeldUntilDropped: an item's bytes are served from its Put until its
// Drop, never by a timer; the input it derives from is told once when put
// and once when dropped (a second Drop, a second Put of the same id tell
// it nothing), and only after the Drop; Drained waits for the Drop.
func TestHeldUntilDropped(t *testing.T) {
	t.Parallel()
	dp, err := New("run1", newKey(), "127.0.0.1", false)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	in := &input{}
	q := &queue{stored: map[uint64]bool{7: true}}
	if !dp.Put("x", [][]byte{[]byte("a"), []byte("bc")}, q, in) {
		t.Fatal("the first Put of x: false")
	}
	if dp.Put("x", [][]byte{[]byte("abc")}, q, in) {
		t.Error("a second Put of x: true, want false (held already)")
	}
	dp.Stored("x", 7)
	if d, a := in.counts(); d != 1 || a != 0 {
		t.Fatalf("after Put: derived %d, answered %d; want 1, 0", d, a)
	}
	if n, size := dp.Holding(); n != 1 || size != 3 {
		t.Errorf("holding %d items, %d bytes; want 1, 3", n, size)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if err := dp.Drained(ctx); err == nil {
		t.Fatal("Drained returned while x is held and its message stored")
	}
	got, err := dp.Fetch(context.Background(), Ref{Addr: dp.Addr(), Size: 3}, "x")
	if err != nil || string(got) != "abc" {
		t.Fatalf("fetch: %q, %v", got, err)
	}
	dp.Drop("x")
	dp.Drop("x")
	if d, a := in.counts(); d != 1 || a != 1 {
		t.Errorf("after two Drops: derived %d, answered %d; want 1, 1", d, a)
	}
	if err := dp.Drained(context.Background()); err != nil {
		t.Errorf("Drained after the Drop: %v", err)
	}
	if _, err := dp.Fetch(context.Background(), Ref{Addr: dp.Addr(), Size: 3}, "x"); err == nil {
		t.Error("x fetched after its Drop")
	}
}

// TestSweep: at a share's end the plane drops what no consumer will
// release: the bytes of an item whose message the stream no longer
// stores, and of one whose queue has no consumer left; an item whose
// message is still stored, with consumers, stays held.
func TestSweep(t *testing.T) {
	t.Parallel()
	dp, err := New("run1", newKey(), "127.0.0.1", false)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	acked := &queue{stored: map[uint64]bool{}}
	orphan := &queue{stored: map[uint64]bool{2: true}, noConsumers: true}
	waiting := &queue{stored: map[uint64]bool{3: true}}
	in := &input{}
	for i, q := range []*queue{acked, orphan, waiting} {
		id := string(rune('a' + i))
		dp.Put(id, [][]byte{[]byte(id)}, q, in)
		dp.Stored(id, uint64(i+1))
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		dp.Drained(ctx) // sweeps every 250ms
		n, _ := dp.Holding()
		return n == 1
	}, "the plane to hold only the waiting item")
	if _, a := in.counts(); a != 2 {
		t.Errorf("%d inputs answered, want 2 (the dropped items')", a)
	}
	// Reheld bytes go the same way, queue by queue.
	dp.Rehold("c")
	dp.SweepReheld(context.Background(), acked)
	if n, _ := dp.Holding(); n != 1 {
		t.Errorf("a sweep of another queue dropped c (%d held)", n)
	}
	waiting.mu.Lock()
	waiting.stored = nil
	waiting.mu.Unlock()
	dp.SweepReheld(context.Background(), waiting)
	if n, _ := dp.Holding(); n != 0 {
		t.Errorf("c reheld, its message acked: %d held after SweepReheld", n)
	}
}
