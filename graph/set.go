package graph

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// applySets applies the loader's --set overrides to the decoded stages and
// edges, before validation, so an override is checked like the spec.
func (d *decoder) applySets() {
	d.pendingConfig = map[*Stage]map[string]string{}
	for _, set := range d.loader.Sets {
		if err := d.applySet(set); err != nil {
			d.diags = append(d.diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "invalid --set",
				Detail:   sentence(fmt.Sprintf("--set %s: %v", set, err)),
			})
		}
	}
}

func (d *decoder) applySet(set string) error {
	path, raw, ok := strings.Cut(set, "=")
	if !ok {
		return fmt.Errorf("want PATH=VALUE, such as edge.hs.policy=shared")
	}
	parts := strings.Split(path, ".")
	if len(parts) < 3 {
		return fmt.Errorf("want edge.NAME.ATTR or stage.NAME.ATTR")
	}
	switch parts[0] {
	case "edge":
		e, err := d.g.lookupEdge(parts[1])
		if err != nil {
			return err
		}
		return d.setEdge(e, parts[2:], raw)
	case "stage":
		s, err := d.g.lookupStage(parts[1])
		if err != nil {
			return err
		}
		return d.setStage(s, parts[2:], raw)
	}
	return fmt.Errorf("%q is neither edge nor stage", parts[0])
}

func (d *decoder) setEdge(e *Edge, attr []string, raw string) error {
	if len(attr) != 1 {
		return fmt.Errorf("edges have no nested attributes")
	}
	switch attr[0] {
	case "policy":
		e.Policy = Policy(raw)
		return e.Policy.check()
	case "capacity":
		n, err := setCount(raw, "capacity")
		e.Capacity = n
		return err
	case "capacity_bytes":
		n, err := setCount(raw, "capacity_bytes")
		e.CapacityBytes = int64(n)
		return err
	}
	return fmt.Errorf("edges have no settable attribute %q; use policy, capacity or capacity_bytes", attr[0])
}

func (d *decoder) setStage(s *Stage, attr []string, raw string) error {
	switch {
	case len(attr) == 1 && attr[0] == "replicas":
		n, err := setCount(raw, "replicas")
		s.Replicas = n
		return err
	case len(attr) == 1 && attr[0] == "restarts":
		v, err := ParseValue(raw, cty.Number)
		if err != nil {
			return err
		}
		n, err := checkRestarts(v)
		if err != nil {
			return fmt.Errorf("restarts %v", err)
		}
		s.Restarts = n
		return nil
	case len(attr) == 2 && attr[0] == "config":
		if d.pendingConfig[s] == nil {
			d.pendingConfig[s] = map[string]string{}
		}
		d.pendingConfig[s][attr[1]] = raw
		return nil
	}
	return fmt.Errorf("stages have no settable attribute %q; use replicas, restarts or config.KEY", strings.Join(attr, "."))
}

// lookupEdge is the named edge, or an error naming it with the closest
// name (for --set and Graph.With).
func (g *Graph) lookupEdge(name string) (*Edge, error) {
	if e := g.edges[name]; e != nil {
		return e, nil
	}
	return nil, fmt.Errorf("no edge %q%s", name, DidYouMean(name, slices.Sorted(maps.Keys(g.edges))))
}

// lookupStage is the named stage, or an error naming it with the closest
// name.
func (g *Graph) lookupStage(name string) (*Stage, error) {
	if s := g.stages[name]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("no stage %q%s", name, DidYouMean(name, slices.Sorted(maps.Keys(g.stages))))
}

func setCount(raw, name string) (int, error) {
	v, err := ParseValue(raw, cty.Number)
	if err != nil {
		return 0, err
	}
	n, err := checkCount(v, name)
	if err != nil {
		return 0, fmt.Errorf("%s %v", name, err)
	}
	return n, nil
}
