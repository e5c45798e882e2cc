package main

import "runtime/debug"

// version is dflow's version. A release build sets it:
//
//	go build -ldflags "-X main.version=v0.4.0" ./cmd/dflow
//
// Without it the version comes from the build information the Go
// toolchain records: the module version for `go install ...@v0.4.0`, and
// for a build from a checkout the commit, its time and "+dirty" when the
// tree had changes.
var version = ""

func dflowVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v != "" && v != "(devel)" {
		return v // a module version (tagged, or a pseudo-version naming its commit)
	}
	v = "(devel)"
	var rev, at string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return v
	}
	out := v + " " + rev[:min(len(rev), 12)]
	if dirty {
		out += "+dirty"
	}
	if at != "" {
		out += " (" + at + ")"
	}
	return out
}
