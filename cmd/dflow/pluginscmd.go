package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"path/filepath"
	"slices"

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
	return e.host().LoaderHook(e.registry, host.Dirs())(declared, referenced)
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
