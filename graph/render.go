package graph

import (
	"fmt"
	"io"
	"strings"
)

// Formats lists what Render writes.
var Formats = []string{"text", "dot", "mermaid"}

// Render writes the graph as "text", "dot" (Graphviz) or "mermaid".
func Render(w io.Writer, g *Graph, format string) error {
	var s string
	switch format {
	case "text":
		s = renderText(g)
	case "dot":
		s = renderDOT(g)
	case "mermaid":
		s = renderMermaid(g)
	default:
		return fmt.Errorf("graph: unknown format %q; use text, dot or mermaid", format)
	}
	_, err := io.WriteString(w, s)
	return err
}

func (s *Stage) label() string {
	return fmt.Sprintf("%s (%s) x%d", s.Name, s.Node, s.Replicas)
}

// label reads like "hs: hidden_states, round_robin, cap 8, 2-2-1" (the
// last part is the policy's word on the wiring: "hash(key) mod 3" for
// key_hash).
func (e *Edge) label() string {
	l := fmt.Sprintf("%s: %s, %s, cap %d", e.Name, e.From.Type, e.Policy, e.Capacity)
	if e.CapacityBytes > 0 {
		l += fmt.Sprintf(" / %d B", e.CapacityBytes)
	}
	if w := e.Policy.impl().wiring(e); w != "" {
		l += ", " + w
	}
	return l
}

// Fanin describes a round-robin wiring by the number of producers of each
// queue ("2-2-1").
func (e *Edge) Fanin() string {
	parts := make([]string, len(e.Queues))
	for i, q := range e.Queues {
		parts[i] = fmt.Sprint(len(q.Producers))
	}
	return strings.Join(parts, "-")
}

func renderText(g *Graph) string {
	var b strings.Builder
	name := g.Name
	if name == "" {
		name = g.Filename
	}
	fmt.Fprintf(&b, "pipeline %s\n", name)
	if g.Description != "" {
		fmt.Fprintf(&b, "  %s\n", g.Description)
	}
	b.WriteString("\nstages:\n")
	for _, s := range g.Stages {
		fmt.Fprintf(&b, "  %s\n", s.label())
		for _, p := range s.Inputs {
			fmt.Fprintf(&b, "    in  %-10s %s\n", p.Name, p.Type)
		}
		for _, p := range s.Outputs {
			fmt.Fprintf(&b, "    out %-10s %s\n", p.Name, p.Type)
		}
	}
	b.WriteString("\nedges:\n")
	for _, e := range g.Edges {
		fmt.Fprintf(&b, "  %s: %s -> %s  %s, %s, capacity %d", e.Name, e.From, e.To, e.From.Type, e.Policy, e.Capacity)
		if e.CapacityBytes > 0 {
			fmt.Fprintf(&b, ", capacity_bytes %d", e.CapacityBytes)
		}
		b.WriteString("\n")
		for _, q := range e.Queues {
			fmt.Fprintf(&b, "    queue %d: %s %v -> %s %v\n", q.Index,
				e.From.Stage.Name, q.Producers, e.To.Stage.Name, q.Consumers)
		}
	}
	return b.String()
}

func renderDOT(g *Graph) string {
	var b strings.Builder
	fmt.Fprintf(&b, "digraph %q {\n  rankdir=LR;\n  node [shape=box];\n", g.Name)
	for _, s := range g.Stages {
		fmt.Fprintf(&b, "  %q [label=%q];\n", s.Name, s.label())
	}
	for _, e := range g.Edges {
		style := ""
		if e.Policy == Shared {
			style = ", style=bold"
		}
		fmt.Fprintf(&b, "  %q -> %q [label=%q%s];\n", e.From.Stage.Name, e.To.Stage.Name,
			e.label()+"\n"+e.From.Name+" -> "+e.To.Name, style)
	}
	b.WriteString("}\n")
	return b.String()
}

func renderMermaid(g *Graph) string {
	var b strings.Builder
	b.WriteString("flowchart LR\n")
	id := map[string]string{}
	for i, s := range g.Stages {
		id[s.Name] = fmt.Sprintf("s%d", i)
		fmt.Fprintf(&b, "  %s[\"%s\"]\n", id[s.Name], mermaidEscape(s.label()))
	}
	for _, e := range g.Edges {
		fmt.Fprintf(&b, "  %s -->|\"%s\"| %s\n", id[e.From.Stage.Name], mermaidEscape(e.label()), id[e.To.Stage.Name])
	}
	return b.String()
}

func mermaidEscape(s string) string { return strings.ReplaceAll(s, `"`, "#quot;") }
