package share

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/broker"
	"github.com/dflow-dev/dflow/internal/cluster/clustertest"
	"github.com/dflow-dev/dflow/internal/cluster/edge"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// linksOf is the share a queue of its belongs to.
func linksOf(q engine.Transport) *links { return q.(*edge.Queue).Env().Share.(*links) }

// setUp makes job's streams and consumers, removed once the test and its
// shares (shareOf) have ended.
func setUp(t *testing.T, js jetstream.JetStream, job *wire.Job, g *graph.Graph) {
	t.Helper()
	if err := wire.SetupRun(context.Background(), js, job.Run, g, job.Remote, wire.DefaultAckWait); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wire.TeardownRun(js, job.Run, g, job.Remote) })
}

// shareOf is instance's share of job (its links), closed at the test's
// end, before the streams are removed.
func shareOf(t *testing.T, nc *nats.Conn, js jetstream.JetStream, job *wire.Job, g *graph.Graph, instance string) *links {
	t.Helper()
	l, err := newLinks(context.Background(), nc, js, job, g, instance, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.close)
	return l
}

// TestLargeItemsIntact: a 5 MiB item and a small one cross a remote edge
// in order, byte for byte, the large one's bytes over the data plane: held
// by the producer's share until the consumer has acked it, released then.
func TestLargeItemsIntact(t *testing.T) {
	t.Parallel()
	srv, err := broker.StartServer(broker.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	send, recv, _, cleanup := edgePair(t, srv, "large")
	defer cleanup()
	dp := linksOf(send).dp
	ctx := context.Background()
	big := &items.Blob{Data: make([]byte, 5<<20+123)}
	for i := range big.Data {
		big.Data[i] = byte(i * 7)
	}
	small := &items.Blob{Data: []byte("small")}
	for _, it := range []*items.Blob{big, small} {
		if err := send.Send(ctx, it, engine.Origin{}); err != nil {
			t.Fatal(err)
		}
	}
	send.Close()
	if n, size := dp.Holding(); n != 1 || size < int64(len(big.Data)) {
		t.Errorf("the producer holds %d items (%d bytes) before the consumer has them; want the large one", n, size)
	}
	for _, want := range []*items.Blob{big, small} {
		got, ok, err := recv.Recv(ctx)
		if err != nil || !ok {
			t.Fatalf("recv: %v %v", ok, err)
		}
		if !bytes.Equal(got.Item.(*items.Blob).Data, want.Data) {
			t.Fatalf("an item of %d bytes arrived changed (%d bytes)", len(want.Data), len(got.Item.(*items.Blob).Data))
		}
	}
	if _, ok, err := recv.Recv(ctx); ok || err != nil {
		t.Fatalf("after the last: %v %v", ok, err)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := dp.Drained(dctx); err != nil {
		n, _ := dp.Holding()
		t.Errorf("the producer still holds %d items' bytes after the consumer acked them", n)
	}
}

// TestHolderGone: when the share holding a large item's bytes is gone
// before its consumer has them, the consumer fails at once, naming the
// worker, instead of waiting for bytes that are nowhere else.
func TestHolderGone(t *testing.T) {
	t.Parallel()
	srv, err := broker.StartServer(broker.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	send, recv, _, cleanup := edgePair(t, srv, "gone")
	defer cleanup()
	pl := linksOf(send)
	pl.worker = "gpu3"
	if err := send.Send(context.Background(), &items.Blob{Data: make([]byte, 1<<20)}, engine.Origin{}); err != nil {
		t.Fatal(err)
	}
	pl.dp.Close() // the holder's host dies
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, err = recv.Recv(ctx)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "held by worker gpu3") {
		t.Errorf("err = %v, want one naming worker gpu3 before the deadline", err)
	}
}

// TestPlacedOnce: an item derived from one input, sent on an edge of
// three queues by two shares (a replica restarted, whose rotation starts
// afresh, or another replica of a shared input feeding another queue,
// which took the input over after a loss), goes where the first sent it,
// with the same id, and JetStream keeps it once: one message on the edge,
// not two.
func TestPlacedOnce(t *testing.T) {
	t.Parallel()
	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g, err := clustertest.Loader(nodes.Default)(&wire.Job{Filename: "rr.hcl", Src: []byte(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 1
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = 3
}
stage "sink" {
  node     = "sink"
  replicas = 3
}
edge "a" {
  from = src.out
  to   = work.in
}
edge "b" {
  from   = work.out
  to     = sink.in
  policy = "round_robin"
}
`)})
	if err != nil {
		t.Fatal(err)
	}
	job := &wire.Job{Run: "rr", Remote: map[string][]bool{"a": {false}, "b": {true, true, true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w1", "w2", "w2"}, "sink": {"w3", "w3", "w3"}}}
	ctx := context.Background()
	setUp(t, js, job, g)
	first, second := shareOf(t, nc, js, job, g, "w1"), shareOf(t, nc, js, job, g, "w2")
	e := g.Edges[1]
	send := func(l *links, qi, k int) {
		t.Helper()
		item := &items.Blob{Data: []byte{byte(k)}}
		q := l.For(e, qi).(*edge.Queue)
		in := l.Take(nil, "in-1", nil, false) // a delivery in hand, never finished here
		if err := q.Send(ctx, item, engine.Origin{Receipt: in, Sent: k}); err != nil {
			t.Fatal(err)
		}
		if err := q.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	send(first, 0, 0)  // the first share sends the input's item 0 to queue 0
	send(second, 2, 0) // and another, taking the input over, to queue 2
	send(second, 1, 1) // the input's item 1, first sent by the second share
	msgs := func(qi int) int {
		n, err := wire.QueueMsgs(ctx, js, job.Run, 1, qi)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := []int{msgs(0), msgs(1), msgs(2)}; got[0] != 1 || got[1] != 1 || got[2] != 0 {
		t.Errorf("messages on the three queues: %v, want [1 1 0] (item 0 once, where it went first)", got)
	}
}

// TestEndWaitsForLocalRestart: a producer replica whose end an earlier
// incarnation wrote restarts (its worker was lost after that end but
// before the replica was recorded settled and seen done:
// TestFinishedReplicaStays), here beside its consumer. The end key its first incarnation wrote does not end the
// queue for that consumer while the restart runs: it ends once the
// restart returns. (Taken from the earlier key, the consumer returned
// first and the engine failed the run: "stage sink returned while stage
// work still produces"; TestDFlashLost's "two lost" met it.)
func TestEndWaitsForLocalRestart(t *testing.T) {
	t.Parallel()
	nc := serverConn(t)
	js, _ := wire.NewJS(nc)
	g := clustertest.Chain(t, 1)
	job := &wire.Job{Run: "end", Remote: map[string][]bool{"a": {false}, "b": {true}},
		Place: map[string][]string{"src": {"w1"}, "work": {"w2"}, "sink": {"w2"}}}
	ctx := context.Background()
	setUp(t, js, job, g)
	share := func(job *wire.Job, name string) *edge.Queue {
		l := shareOf(t, nc, js, job, g, name)
		l.env.Started = time.Now().Add(-time.Hour) // past a restart's guard
		return l.For(g.Edges[1], 0).(*edge.Queue)
	}
	share(job, "w2").Close() // work's first incarnation finished: its end is written
	restart := *job          // w2 lost: work and sink restart on w2-r1
	restart.Restart = true
	restart.Place = map[string][]string{"src": {"w1"}, "work": {"w2-r1"}, "sink": {"w2-r1"}}
	q := share(&restart, "w2-r1")
	wait, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, ok, err := q.Recv(wait); ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("while the restarted producer runs, the consumer's Recv gave ok=%v err=%v; want it to wait", ok, err)
	}
	q.Close() // the restart returns
	end, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, ok, err := q.Recv(end); ok || err != nil {
		t.Fatalf("once the restarted producer returned, Recv gave ok=%v err=%v; want the queue's end", ok, err)
	}
}

// TestQueueHoldsItsCapacity: a queue across hosts holds its capacity by
// its producers' credit alone: with its consumer's worker holding three
// capacities' worth unacked (as a group holds what it trained on until its
// save), the producer goes on as the consumer takes, never refused for
// room, and the messages not yet delivered never pass the capacity: its
// consumer fetches by itself and grants nothing, so the room read alone
// holds it (a read crossing a grant, or producer shares reading the same
// room at once, may each add their part: package edge's rule 4).
func TestQueueHoldsItsCapacity(t *testing.T) {
	t.Parallel()
	srv, _ := clustertest.Server(t)
	const capacity = 16
	send, _, js, cleanup := edgePairCap(t, srv, "holds", capacity)
	defer cleanup()
	q := send.(*edge.Queue)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := 3 * capacity
	errs := sendSmall(ctx, send, n, q.Flush)
	cons, err := js.Consumer(ctx, wire.StreamEdge("holds", 0), wire.ConsumerQueue(0))
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	undelivered := func() int {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return int(info.NumPending)
	}
	most := 0
	if !testutil.Within(30*time.Second, func() bool {
		most = max(most, undelivered())
		b, err := cons.Fetch(4, jetstream.FetchMaxWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			held = append(held, m) // kept unacked
		}
		return len(held) >= n
	}) {
		t.Fatalf("the consumer holds %d messages unacked, want all %d sent", len(held), n)
	}
	if err := <-errs; err != nil {
		t.Fatalf("the producer, its consumer holding %d unacked: %v", len(held), err)
	}
	if most > capacity {
		t.Errorf("%d messages waited undelivered at once, past the capacity of %d", most, capacity)
	}
	for _, m := range held {
		m.Ack()
	}
}

// TestQueueHoldsItsCapacityGranted: the same through a consumer share
// that grants as it pulls, slower than its producer: the producer runs on
// the grants, and what waits undelivered stays within the capacity and
// the one part a read crossing a grant may add (package edge's rule 4),
// every item received.
func TestQueueHoldsItsCapacityGranted(t *testing.T) {
	t.Parallel()
	srv, _ := clustertest.Server(t)
	const capacity = 8
	send, recv, js, cleanup := edgePairCap(t, srv, "granted", capacity)
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 120
	errs := sendSmall(ctx, send, n, func() error { send.Close(); return nil })
	cons, err := js.Consumer(ctx, wire.StreamEdge("granted", 0), wire.ConsumerQueue(0))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	most := make(chan int, 1)
	go func() {
		m := 0
		defer func() { most <- m }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if info, err := cons.Info(ctx); err == nil {
				m = max(m, int(info.NumPending))
			}
		}
	}()
	got := 0
	for {
		_, ok, err := recv.Recv(ctx)
		if err != nil {
			t.Fatalf("recv after %d: %v", got, err)
		}
		if !ok {
			break
		}
		got++
		time.Sleep(time.Millisecond) // a consumer slower than its producer
	}
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Errorf("received %d items, want %d", got, n)
	}
	if m := <-most; m > 2*capacity {
		t.Errorf("%d messages waited undelivered at once, past the capacity of %d and the part a read crossing a grant may add", m, capacity)
	}
	if said, ok := send.(*edge.Queue).Grants(); !ok || said == 0 {
		t.Errorf("the producer heard %d grants (listening: %v): it ran on room reads alone", said, ok)
	}
}

// TestRoomSaid: a producer waiting for room in a queue whose consumer is
// on another worker is told when that consumer fetches (on the queue's
// room subject), and reads the room two or three times for each item it
// then sends, not every few milliseconds while it waits: reading every 2 ms, a
// blocked target of the seed read it about ten times for each item its
// slower drafter took, two JetStream API requests a read.
func TestRoomSaid(t *testing.T) {
	t.Parallel()
	srv, _ := clustertest.Server(t)
	send, recv, js, cleanup := edgePairCap(t, srv, "said", 4)
	defer cleanup()
	if _, ok := send.(*edge.Queue).Grants(); !ok {
		t.Fatal("the producer does not listen for the room its consumer makes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	requests := func() uint64 {
		info, err := js.AccountInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.API.Total
	}
	const n = 40
	errs := sendSmall(ctx, send, n, func() error { send.Close(); return nil })
	before := requests()
	for range n {
		if _, ok, err := recv.Recv(ctx); err != nil || !ok {
			t.Fatalf("recv: %v %v", ok, err)
		}
		time.Sleep(20 * time.Millisecond) // a consumer slower than its producer
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	// About three reads an item (one that finds the room, one that finds
	// it gone and one 2 ms later, two requests each), and both sides'
	// depth reads and keep-alives; reading every 2 ms, 10 or more an item.
	got := requests() - before
	t.Logf("%d JetStream API requests for %d items", got, n)
	if got > 8*n {
		t.Errorf("%d JetStream API requests for %d items through a full queue, want at most %d", got, n, 8*n)
	}
	// and it was told (with no word, reading every 100 ms, it would make
	// fewer requests, and take 40 times as long): one word for what came
	// together, and at most the consumer side's inbox (4 here) comes at once
	if said, ok := send.(*edge.Queue).Grants(); !ok || said < n/4 {
		t.Errorf("the producer was told of room %d times (listening: %v) for %d items, want at least one for every four", said, ok, n)
	}
}

// sendSmall sends n items of 64 bytes on send from a goroutine, then
// end's error, or the first Send's, on the channel it returns.
func sendSmall(ctx context.Context, send engine.Transport, n int, end func() error) <-chan error {
	errs := make(chan error, 1)
	go func() {
		for range n {
			if err := send.Send(ctx, &items.Blob{Data: make([]byte, 64)}, engine.Origin{}); err != nil {
				errs <- err
				return
			}
		}
		errs <- end()
	}()
	return errs
}

// TestFullQueueWaitIsQuiet: a sender held back by a full queue across
// workers reads its room less often the longer it waits, up to every
// maxRoomWait: blocked for two seconds (a consumer that takes nothing, as
// in a deadlock) it costs the server a few dozen API requests, where it
// cost about two thousand when it read its room every 2 ms (two requests
// a read) for as long as the wait lasted. Where the queue's consumer is in
// the sender's own instance, the reads are only a fallback: its fetch
// wakes the sender.
func TestFullQueueWaitIsQuiet(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		consumer  string // where stage work runs
		requests  uint64 // at most, in a wait of 2 s
		thenTaken bool   // the consumer takes an item: the send goes
	}{
		{"consumer elsewhere", "w2", 200, false},
		{"consumer here", "w1", 100, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv, nc := clustertest.Server(t)
			js, _ := wire.NewJS(nc)
			g := clustertest.Chain(t, 1)
			g.Edges[0].Capacity = 2
			job := &wire.Job{Run: "quiet", Remote: map[string][]bool{"a": {true}, "b": {false}},
				Place: map[string][]string{"src": {"w1"}, "work": {c.consumer}, "sink": {c.consumer}}}
			ctx := context.Background()
			setUp(t, js, job, g)
			q := shareOf(t, nc, js, job, g, "w1").For(g.Edges[0], 0).(*edge.Queue)
			for i := range 2 {
				if err := q.Send(ctx, &items.Blob{Data: []byte{byte(i)}}, engine.Origin{}); err != nil {
					t.Fatal(err)
				}
			}
			api := func() uint64 {
				n, err := srv.APIRequests()
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := api()
			blocked, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if err := q.Send(blocked, &items.Blob{Data: []byte{2}}, engine.Origin{}); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a send to a full queue: %v, want it held until its context ended", err)
			}
			if n := api() - before; n > c.requests {
				t.Errorf("%d JetStream API requests while a send waited 2 s for room, want at most %d: it reads its room too often", n, c.requests)
			} else {
				t.Logf("%d JetStream API requests while a send waited 2 s for room", n)
			}
			if !c.thenTaken {
				return
			}
			sent := make(chan error, 1)
			go func() { sent <- q.Send(ctx, &items.Blob{Data: []byte{3}}, engine.Origin{}) }()
			if _, _, err := q.Recv(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-sent:
				if err != nil {
					t.Errorf("the send once the consumer took an item: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the send waited on after the consumer here took an item")
			}
		})
	}
}

// serverConn starts an embedded server for the test and connects to it.
func serverConn(t *testing.T) *nats.Conn {
	t.Helper()
	_, nc := clustertest.Server(t)
	return nc
}
