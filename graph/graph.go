package graph

import (
	"fmt"
	"time"

	"github.com/hashicorp/hcl/v2"
)

// Graph is a validated pipeline: stages, the ports their nodes declare, and
// the edges between them already wired into queues. A Graph returned by
// Load with no error diagnostics is complete and acyclic; its stages and
// edges are in declaration order. It is read-only after loading; With
// returns a changed copy.
type Graph struct {
	Filename    string
	Name        string // the pipeline block's label, or "" when absent
	Description string
	// Lease is the pipeline block's lease: on a cluster, how long a
	// worker may stay silent before it is counted lost (0: the default).
	Lease   time.Duration
	Plugins []*Plugin
	Stages  []*Stage
	Edges   []*Edge
	// Rebalance is the rebalance block (stages sharing a budget of
	// replicas), or nil.
	Rebalance *Rebalance

	stages map[string]*Stage
	edges  map[string]*Edge
}

// Stage returns the stage with the given name, or nil.
func (g *Graph) Stage(name string) *Stage { return g.stages[name] }

// Edge returns the edge with the given name, or nil.
func (g *Graph) Edge(name string) *Edge { return g.edges[name] }

// Plugin is a `plugin "NAME" { path = "..." }` block, kept for the plugin
// loader.
type Plugin struct {
	Name string
	// Path is the plugin's executable: the path as written where it is
	// absolute, otherwise that path in the folder of the spec file that
	// declares it (as Terraform reads a module's source), made absolute,
	// so that a spec means the same plugin from whatever folder dflow
	// runs in.
	Path string
	// Written is the path as the spec writes it.
	Written   string
	DeclRange hcl.Range
	PathRange hcl.Range // the path attribute's value
}

// Stage is one `stage` block: a node kind run by Replicas concurrent
// replicas.
type Stage struct {
	Name     string
	Node     string // node kind, "text_reader" or "PLUGIN/KIND"
	Replicas int
	// Devices lists where replicas run; replica i uses
	// Devices[i%len(Devices)]. Empty means "cpu".
	Devices []string
	// Placement names the cluster workers the replicas run on, replica
	// i on Placement[i%len(Placement)], in a run across hosts (`dflow run
	// --cluster`); empty spreads them evenly. A local run ignores it.
	Placement []string
	// Restarts is how many times the stage's group may restart whole in
	// one process (`dflow run`) when a rank's process dies: a group kind
	// that restores (Kind.Restores), its ranks all stopped and started
	// again from the group's last save, the items since coming back
	// (docs/groups.md). 0, the default: a dead rank fails the run.
	Restarts int
	Config   *Config
	Sim      *Sim // nil when the stage has no sim block
	Kind     *Kind
	Inputs   []*Port
	Outputs  []*Port

	DeclRange     hcl.Range // the block header
	NameRange     hcl.Range
	NodeRange     hcl.Range
	ReplicasRange hcl.Range
	RestartsRange hcl.Range // zero when the spec does not set restarts

	order int // declaration index, for a stable reading order
}

// Device returns the device replica i runs on.
func (s *Stage) Device(i int) string {
	if len(s.Devices) == 0 {
		return "cpu"
	}
	return s.Devices[i%len(s.Devices)]
}

// Port returns the named port of the stage, or nil.
func (s *Stage) Port(name string) *Port {
	for _, p := range s.Inputs {
		if p.Name == name {
			return p
		}
	}
	for _, p := range s.Outputs {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Sim is a stage's `sim` block: what the simulator assumes about a node
// whose cost it cannot know.
type Sim struct {
	ServiceTime string // a duration or distribution, "lognormal(40ms, 0.2)"
	Range       hcl.Range
}

// Port is a stage's port with its resolved type. In edges list the edges
// ending on an input port; Out edges those starting at an output port.
type Port struct {
	Stage *Stage
	Name  string
	Dir   Direction
	Type  string // resolved: SameAs ports carry their source's type
	Edges []*Edge

	noKeys, noKeysField string // PortSpec.NoKeys and NoKeysField
}

func (p *Port) String() string { return p.Stage.Name + "." + p.Name }

// DefaultCapacity is an edge's queue bound when the spec gives none.
const DefaultCapacity = 8

// Edge is one `edge` block joining an output port to an input port.
type Edge struct {
	Name          string
	From, To      *Port
	Policy        Policy
	Capacity      int   // bound of each queue, in items
	CapacityBytes int64 // optional bound of each queue in payload bytes; 0 = none
	// Queues is the wiring: which producer replicas push to which queue
	// and which consumer replicas pull from it. See Wire.
	Queues []Queue

	DeclRange, NameRange, FromRange, ToRange hcl.Range
	PolicyRange, CapacityRange               hcl.Range
}

// Queue is one bounded queue of an edge.
type Queue struct {
	Index     int
	Producers []int // producer replica indices, ascending
	Consumers []int // consumer replica indices, ascending
}

// ProducerQueues returns, for producer replica p, the indices of the
// queues it pushes to, in the order it rotates over them.
func (e *Edge) ProducerQueues(p int) []int {
	var qs []int
	for _, q := range e.Queues {
		for _, pp := range q.Producers {
			if pp == p {
				qs = append(qs, q.Index)
				break
			}
		}
	}
	return qs
}

// ConsumerQueue returns the index of the queue consumer replica c pulls
// from.
func (e *Edge) ConsumerQueue(c int) int {
	for _, q := range e.Queues {
		for _, cc := range q.Consumers {
			if cc == c {
				return q.Index
			}
		}
	}
	panic(fmt.Sprintf("graph: edge %q has no queue for consumer %d", e.Name, c))
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// Names lists the graph's stages and edges in the spec's order (what a
// report keeps, report.Report.SetOrder).
func (g *Graph) Names() (stages, edges []string) {
	for _, s := range g.Stages {
		stages = append(stages, s.Name)
	}
	for _, e := range g.Edges {
		edges = append(edges, e.Name)
	}
	return stages, edges
}
