package host

import (
	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/nodes"
	"github.com/hashicorp/hcl/v2"
)

// LoaderHook is the plugin hook of a graph.Loader (its Plugins field), as
// dflow's commands and workers set it: it starts in h every plugin the
// spec declares with a path, and every plugin it references without
// declaring that is found by name in dirs, and registers their kinds in
// reg. A plugin that fails to start is an error at its block.
func (h *Host) LoaderHook(reg *nodes.Registry, dirs []string) func(declared []*graph.Plugin, referenced []string) hcl.Diagnostics {
	return func(declared []*graph.Plugin, referenced []string) hcl.Diagnostics {
		var diags hcl.Diagnostics
		done := map[string]bool{}
		for _, p := range declared {
			done[p.Name] = true
			if p.Path == "" {
				continue
			}
			if _, err := h.Load(p.Name, p.Path, reg); err != nil {
				diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "plugin failed to start",
					Detail: err.Error(), Subject: p.DeclRange.Ptr(), Extra: graph.FailedPlugin(p.Name)})
			}
		}
		for _, name := range referenced {
			if done[name] {
				continue
			}
			if path, ok := Find(name, dirs); ok {
				if _, err := h.Load(name, path, reg); err != nil {
					diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "plugin failed to start", Detail: err.Error(),
						Extra: graph.FailedPlugin(name)})
				}
			}
		}
		return diags
	}
}
