package share

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/broker"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/internal/engine"
	"github.com/dflow-dev/dflow/items"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go/jetstream"
)

// The figures of docs/performance.md, "Across hosts" (bench/run prints
// them): items across a remote edge (one producer instance, one consumer
// instance, an embedded server on loopback, capacity 8, 16 and 1024), and
// the same bytes over a bare loopback TCP connection (a 4-byte length,
// then the payload), in the same run.

var benchSizes = []int{64, 16 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dB", n)
}

func BenchmarkRemoteEdge(b *testing.B) {
	srv, err := broker.StartServer(broker.ServerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	type bench struct{ size, capacity int }
	cases := []bench{{64, 8}, {64, 16}, {64, 1024}, {16 << 20, 16}}
	for _, bc := range cases {
		size, name := bc.size, sizeName(bc.size)
		if bc.capacity != 16 {
			name += "-cap" + strconv.Itoa(bc.capacity)
		}
		b.Run(name, func(b *testing.B) {
			// a failed send ends the receiving too (it hung, waiting for
			// items that would never come)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			send, recv, _, cleanup := edgePairCap(b, srv, "bench"+strconv.Itoa(size)+"x"+strconv.Itoa(bc.capacity), bc.capacity)
			defer cleanup()
			item := &items.Blob{Data: make([]byte, size)}
			b.SetBytes(int64(size))
			b.ResetTimer()
			errs := make(chan error, 1)
			go func() {
				for range b.N {
					if err := send.Send(ctx, item, engine.Origin{}); err != nil {
						errs <- err
						cancel()
						return
					}
				}
				send.Close()
				errs <- nil
			}()
			for range b.N {
				if _, ok, err := recv.Recv(ctx); err != nil || !ok {
					select {
					case serr := <-errs:
						b.Fatalf("send: %v", serr)
					default:
					}
					b.Fatalf("recv: %v %v", ok, err)
				}
			}
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
			if _, ok, err := recv.Recv(ctx); ok || err != nil {
				b.Fatalf("after the last item: ok %v, %v", ok, err)
			}
		})
	}
}

func BenchmarkRawTCP(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			done := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				buf := make([]byte, size)
				var hdr [4]byte
				for range b.N {
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						done <- err
						return
					}
					if _, err := io.ReadFull(c, buf[:binary.LittleEndian.Uint32(hdr[:])]); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			payload := make([]byte, 4+size)
			binary.LittleEndian.PutUint32(payload, uint32(size))
			b.SetBytes(int64(size))
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(payload); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// edgePair is a remote edge of capacity 16 between two instances, each
// with a connection of its own: the producer's transport and the
// consumer's.
func edgePair(tb testing.TB, srv *broker.Server, run string) (send, recv engine.Transport, js jetstream.JetStream, cleanup func()) {
	return edgePairCap(tb, srv, run, 16)
}

// edgePairCap is edgePair with another capacity.
func edgePairCap(tb testing.TB, srv *broker.Server, run string, capacity int) (send, recv engine.Transport, js jetstream.JetStream, cleanup func()) {
	tb.Helper()
	l := &graph.Loader{Catalog: nodes.Default}
	g, diags := l.Load("edge.hcl", []byte(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 1
  }
}
stage "dst" {
  node = "sink"
}
edge "e" {
  from     = src.out
  to       = dst.in
  capacity = `+strconv.Itoa(capacity)+`
}`))
	if diags.HasErrors() {
		tb.Fatal(diags)
	}
	ctx := context.Background()
	pc, err := broker.Connect(broker.ConnOptions{URL: srv.URL, Token: srv.Token})
	if err != nil {
		tb.Fatal(err)
	}
	cc, err := broker.Connect(broker.ConnOptions{URL: srv.URL, Token: srv.Token})
	if err != nil {
		tb.Fatal(err)
	}
	job := &wire.Job{Run: run, Place: map[string][]string{"src": {"p"}, "dst": {"c"}}, Remote: map[string][]bool{"e": {true}}, DataKey: broker.NewToken()}
	pjs, _ := wire.NewJS(pc)
	cjs, _ := wire.NewJS(cc)
	if err := wire.SetupRun(ctx, pjs, job.Run, g, job.Remote, wire.DefaultAckWait); err != nil {
		tb.Fatal(err)
	}
	pl, err := newLinks(ctx, pc, pjs, job, g, "p", "")
	if err == nil {
		pl.start()
	}
	if err != nil {
		tb.Fatal(err)
	}
	cl, err := newLinks(ctx, cc, cjs, job, g, "c", "")
	if err == nil {
		cl.start()
	}
	if err != nil {
		tb.Fatal(err)
	}
	return pl.For(g.Edges[0], 0), cl.For(g.Edges[0], 0), pjs, func() {
		cl.close()
		pl.close()
		wire.TeardownRun(pjs, job.Run, g, job.Remote)
		pc.Close()
		cc.Close()
	}
}

// BenchmarkJetStream is the small items' baseline: JetStream's own rate
// on the same embedded server, one connection publishing asynchronously
// into a work-queue stream in memory (as `nats bench js pub async` does)
// and another consuming it through a pull consumer, acking every message
// (as a consumer worker does).
func BenchmarkJetStream(b *testing.B) {
	srv, err := broker.StartServer(broker.ServerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	b.Run("64B", func(b *testing.B) {
		ctx := context.Background()
		pc, err := broker.Connect(broker.ConnOptions{URL: srv.URL, Token: srv.Token})
		if err != nil {
			b.Fatal(err)
		}
		defer pc.Close()
		cc, err := broker.Connect(broker.ConnOptions{URL: srv.URL, Token: srv.Token})
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		pjs, _ := jetstream.New(pc)
		cjs, _ := jetstream.New(cc)
		s, err := pjs.CreateStream(ctx, jetstream.StreamConfig{Name: "JSBENCH", Subjects: []string{"jsbench"},
			Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage})
		if err != nil {
			b.Fatal(err)
		}
		defer pjs.DeleteStream(ctx, "JSBENCH")
		if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			b.Fatal(err)
		}
		cons, err := cjs.Consumer(ctx, "JSBENCH", "c")
		if err != nil {
			b.Fatal(err)
		}
		payload := make([]byte, 64)
		b.SetBytes(64)
		b.ResetTimer()
		errs := make(chan error, 1)
		go func() {
			for range b.N {
				if _, err := pjs.PublishAsync("jsbench", payload); err != nil {
					errs <- err
					return
				}
			}
			select {
			case <-pjs.PublishAsyncComplete():
				errs <- nil
			case <-time.After(time.Minute):
				errs <- fmt.Errorf("publishes unanswered after a minute")
			}
		}()
		it, err := cons.Messages()
		if err != nil {
			b.Fatal(err)
		}
		defer it.Stop()
		for range b.N {
			m, err := it.Next()
			if err != nil {
				b.Fatal(err)
			}
			m.Ack()
		}
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	})
}
