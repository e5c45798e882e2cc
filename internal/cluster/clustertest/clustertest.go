// Package clustertest holds what the tests of internal/cluster and its
// packages share: an embedded server per test (or a plain NATS server,
// for what uses no JetStream), a run's streams and end bucket, the loader
// workers build a job's graph with, a spec written into the test's folder.
package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/broker"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	_ "github.com/dflow-dev/dflow/nodes/synthetic" // the kinds of Chain
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Loader is the workers' and the tests' way to build a job's graph with
// the kinds of reg.
func Loader(reg *nodes.Registry) func(*wire.Job) (*graph.Graph, error) {
	return func(job *wire.Job) (*graph.Graph, error) {
		l := &graph.Loader{Catalog: reg, Vars: job.Vars, Sets: job.Sets}
		g, diags := l.Load(job.Filename, job.Src)
		if diags.HasErrors() {
			return nil, diags
		}
		return g, nil
	}
}

// Server starts an embedded server and connects to it, both ended with
// the test.
func Server(t testing.TB) (*broker.Server, *nats.Conn) {
	t.Helper()
	srv, err := broker.StartServer(broker.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := broker.Connect(broker.ConnOptions{URL: srv.URL, Token: srv.Token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return srv, nc
}

// Connector starts a plain NATS server for the test, without JetStream
// (Server's is the same NATS server, with it), for what uses none, such
// as a group across workers; it returns a way to connect to it, each
// connection closed at the test's end, before the server is shut down.
func Connector(t testing.TB) func() *nats.Conn {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server: not ready after 10s")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return func() *nats.Conn {
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// SetupRun sets up job's streams, consumers and buckets for g on js,
// removed once the test has ended, and returns the run's end bucket,
// where shares write their ends and records.
func SetupRun(t testing.TB, js jetstream.JetStream, job *wire.Job, g *graph.Graph) jetstream.KeyValue {
	t.Helper()
	ctx := context.Background()
	if err := wire.SetupRun(ctx, js, job.Run, g, job.Remote, wire.DefaultAckWait); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wire.TeardownRun(js, job.Run, g, job.Remote) })
	ends, err := js.KeyValue(ctx, wire.BucketEnds(job.Run))
	if err != nil {
		t.Fatal(err)
	}
	return ends
}

// WriteSpec writes a spec into the test's folder and returns its path.
func WriteSpec(t testing.TB, name, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Chain is the graph src -> work (replicas of synthetic_work) -> sink,
// over edges a and b.
func Chain(t testing.TB, replicas int) *graph.Graph {
	t.Helper()
	g, err := Loader(nodes.Default)(&wire.Job{Filename: "chain.hcl", Src: []byte(fmt.Sprintf(`
stage "src" {
  node = "synthetic_source"
  config {
    count = 1
  }
}
stage "work" {
  node     = "synthetic_work"
  replicas = %d
}
stage "sink" {
  node = "sink"
}
edge "a" {
  from = src.out
  to   = work.in
}
edge "b" {
  from = work.out
  to   = sink.in
}
`, replicas))})
	if err != nil {
		t.Fatal(err)
	}
	return g
}
