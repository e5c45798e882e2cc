package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dflow-dev/dflow/graph"
	"github.com/dflow-dev/dflow/plugins/host"
	"github.com/hashicorp/hcl/v2"
)

func (e *env) host() *host.Host {
	if e.plugins == nil {
		e.plugins = host.New(e.stderr)
	}
	return e.plugins
}

func (e *env) closePlugins() {
	if e.plugins != nil {
		e.plugins.Close()
	}
}

// loadPlugins is the loader's plugin hook: it starts every plugin a spec
// declares or references and registers its kinds.
func (e *env) loadPlugins(declared []*graph.Plugin, referenced []string) hcl.Diagnostics {
	return e.loadPluginsFrom(host.Dirs(), declared, referenced)
}

// loadPluginsFrom is loadPlugins with the referenced plugins that no block
// declares found in dirs.
func (e *env) loadPluginsFrom(dirs []string, declared []*graph.Plugin, referenced []string) hcl.Diagnostics {
	var diags hcl.Diagnostics
	done := map[string]bool{}
	for _, p := range declared {
		done[p.Name] = true
		if p.Path == "" {
			continue
		}
		if _, err := e.host().Load(p.Name, p.Path, e.registry); err != nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "plugin failed to start",
				Detail: err.Error(), Subject: p.DeclRange.Ptr(), Extra: graph.FailedPlugin(p.Name)})
		}
	}
	for _, name := range referenced {
		if done[name] {
			continue
		}
		if path, ok := host.Find(name, dirs); ok {
			if _, err := e.host().Load(name, path, e.registry); err != nil {
				diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "plugin failed to start", Detail: err.Error(),
					Extra: graph.FailedPlugin(name)})
			}
		}
	}
	return diags
}

func cmdPlugins(e *env, args []string) int {
	fs := flag.NewFlagSet("plugins", flag.ContinueOnError)
	dirs, code, ok := parse(e, fs, args, "[DIR...]")
	if !ok {
		return code
	}
	if len(dirs) == 0 {
		dirs = host.Dirs()
	}
	found := host.Discover(dirs)
	if len(found) == 0 {
		abs := make([]string, len(dirs))
		for i, d := range dirs {
			abs[i], _ = filepath.Abs(d)
		}
		fmt.Fprintf(e.stdout, "no plugins (executables named %sNAME) in %v\n", host.Prefix, abs)
		return exitOK
	}
	names := slices.Sorted(maps.Keys(found))
	status := exitOK
	for _, n := range names {
		kinds, err := e.host().Load(n, found[n], e.registry)
		if err != nil {
			fmt.Fprintf(e.stderr, "dflow plugins: %v\n", err)
			status = exitFailed
			continue
		}
		fmt.Fprintf(e.stdout, "plugin %s (%s)\n", n, found[n])
		for _, k := range kinds {
			writeKind(e.stdout, pluginKindDoc(n, found[n], k), "  ", false) // as dflow nodes prints it
			if len(k.Ports) == 0 {
				if why := e.portsUnknown(k.Name); why != nil {
					fmt.Fprintf(e.stderr, "dflow plugins: %s lists no ports: the plugin's check of its default config (no attribute set) failed: %v\n", k.Name, why)
					status = exitFailed
				}
			}
		}
	}
	return status
}

// portsUnknown is why a plugin kind registered in e.registry reported no
// ports for its default config: the errors of the plugin's check of it
// that are not about one attribute's value (the check itself failed), or
// nil when there are none (a kind may have no ports).
func (e *env) portsUnknown(name string) error {
	k, ok := e.registry.Kind(name)
	if !ok || k.Check == nil {
		return nil
	}
	var errs []error
	for _, err := range k.Check(defaultConfig(k.Config)) {
		if fe := (*graph.FieldError)(nil); !errors.As(err, &fe) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// workerPlugin is a worker's FindPlugin: the plugin a job's block names is
// the executable dflow-plugin-NAME in the worker's own plugin folders,
// whatever path the block gives.
func workerPlugin(dirs []string) func(p *graph.Plugin) (string, error) {
	return func(p *graph.Plugin) (string, error) {
		if path, ok := host.Find(p.Name, dirs); ok {
			return path, nil
		}
		return "", fmt.Errorf("this worker has no plugin %q: no executable %s%s in its plugin folders %s "+
			"(a worker starts only plugins of its own folders, found by name, never the spec's path %q; "+
			"put the plugin there, or start the worker with --plugins DIR)",
			p.Name, host.Prefix, p.Name, strings.Join(dirs, ", "), p.Written)
	}
}
