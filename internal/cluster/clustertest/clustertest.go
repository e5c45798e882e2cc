// Package clustertest holds what the tests of internal/cluster and its
// packages share: an embedded server per test, the loader workers build a
// job's graph with, a spec written into the test's folder.
package clustertest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/broker"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	_ "github.com/dflow-dev/dflow/nodes/synthetic" // the kinds of Chain
	"github.com/nats-io/nats.go"
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
