package cluster

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/internal/cluster/group/host"
	"github.com/dflow-dev/dflow/internal/cluster/wire"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/nats-io/nats.go"
)

// TestRestartPassesOverGoneWorker: a worker lost at the same time as
// another, not yet silent for a lease, may be picked for the first one's
// restart; nobody answers the request to it (its connection is gone), and
// the restart goes to the next live worker instead of failing the run.
func TestRestartPassesOverGoneWorker(t *testing.T) {
	t.Parallel()
	reg := nodes.NewRegistry()
	ports := func(*graph.Config) []graph.PortSpec { return nil }
	reg.Register(nodes.Spec{Kind: graph.Kind{Name: "stepper", Ports: ports}, Stateless: true, Resumes: true}) // restartable, wired or not
	g := &graph.Graph{Stages: []*graph.Stage{{Name: "src", Node: "stepper", Replicas: 1}, {Name: "work", Node: "stepper", Replicas: 3}}}
	conn := connector(t)
	nc := conn()
	var log strings.Builder // written by recover, in this goroutine
	js, _ := wire.NewJS(nc) // no end bucket: what finished cannot be read, so all restart
	c := &Coordinator{o: CoordOptions{Registry: reg, Conn: nc, Log: &log, Timings: wire.Timings{Lease: time.Minute}}, g: g, js: js,
		run: "r1", workers: []string{"w1", "w2", "w3"}, groups: map[string]*host.Host{},
		place:     map[string][]string{"src": {"w1"}, "work": {"w1", "w2", "w3"}},
		instances: map[string]*instance{"w1": {name: "w1", worker: "w1"}, "w2": {name: "w2", worker: "w2"}, "w3": {name: "w3", worker: "w3"}},
		seen:      map[string]time.Time{"w1": time.Now(), "w3": time.Now()}}
	// w1 answers; w3, the least loaded, has gone: nobody listens for it
	started := make(chan string, 1)
	w1 := conn()
	sub, err := w1.Subscribe(wire.SubjRun("w1"), func(m *nats.Msg) {
		var j wire.Job
		json.Unmarshal(m.Data, &j)
		started <- j.Instance
		m.Respond([]byte("{}"))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	// the server has w1's subscription before the coordinator asks (a
	// Subscribe returns before, and the request then met "no
	// responders": w1 too counted gone)
	if err := w1.Flush(); err != nil {
		t.Fatal(err)
	}
	c.instances["w2"].lost = true
	if err := c.recover(c.instances["w2"]); err != nil {
		t.Fatalf("recover: %v\n%s", err, log.String())
	}
	if inst := <-started; c.place["work"][1] != inst || !strings.HasPrefix(inst, "w1-") {
		t.Errorf("work[1] placed on %q, w1 started %q; want a restart on w1", c.place["work"][1], inst)
	}
	for name := range c.instances {
		if strings.HasPrefix(name, "w3-") {
			t.Errorf("the restart that never started is still an instance: %s", name)
		}
	}
	if out := log.String(); !strings.Contains(out, "restarting work[1] on w3") || !strings.Contains(out, "worker w3 did not answer (gone too): restarting work[1] elsewhere") {
		t.Errorf("log:\n%s", out)
	}
}

// connector starts a server for the test and returns a way to connect
// to it, each connection closed at the test's end.
func connector(t *testing.T) func() *nats.Conn {
	srv, err := StartServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return func() *nats.Conn {
		nc, err := Connect(ConnOptions{URL: srv.URL, Token: srv.Token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}
