package control

import (
	"errors"
	"fmt"
	"github.com/dflow-dev/dflow/nodes"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dflow-dev/dflow/graph"
)

// Roots are the folders under which a worker lets a job's nodes read and
// write files: every config field a node kind declares a path
// (graph.Field.Path) must resolve, symbolic links followed, under one of
// them, the written ones under Write, the read ones under Read or Write.
type Roots struct {
	Write []string
	Read  []string
}

// DefaultRoots are a worker's roots when it is given none: it writes under
// the folder it runs in, and reads there and under the Go root (the
// default corpus of the documented recipes is $GOROOT/src).
func DefaultRoots() Roots {
	wd, _ := os.Getwd()
	return Roots{Write: []string{wd}, Read: []string{nodes.ExpandPath("$GOROOT")}}
}

// resolved are the roots, absolute, with their links resolved.
func (r Roots) resolved() (write, read []string, err error) {
	res := func(dirs []string) ([]string, error) {
		var out []string
		for _, d := range dirs {
			p, err := resolvePath(d)
			if err != nil {
				return nil, fmt.Errorf("root %s: %v", d, err)
			}
			out = append(out, p)
		}
		return out, nil
	}
	if write, err = res(r.Write); err != nil {
		return nil, nil, err
	}
	if read, err = res(r.Read); err != nil {
		return nil, nil, err
	}
	return write, append(read, write...), nil
}

// Check refuses a graph whose declared path fields leave the roots, with
// the stage, the field, the path and the folders allowed. It opens
// nothing and writes nothing.
func (r Roots) Check(g *graph.Graph) error {
	write, read, err := r.resolved()
	if err != nil {
		return err
	}
	var errs []error
	pathFields(g, func(s *graph.Stage, f graph.Field, v string) {
		allowed, which := read, "read"
		if f.Path == graph.WritePath {
			allowed, which = write, "write"
		}
		if err := within(v, allowed); err != nil {
			errs = append(errs, fmt.Errorf("stage %q: %s = %q: %v; this worker lets a job %s only under %s (dflow worker --write DIR, --read DIR)",
				s.Name, f.Name, v, err, which, strings.Join(allowed, ", ")))
		}
	})
	return errors.Join(errs...)
}

// CheckRead refuses a file outside the roots a job may read.
func (r Roots) CheckRead(path string) error {
	_, read, err := r.resolved()
	if err != nil {
		return err
	}
	if err := within(path, read); err != nil {
		return fmt.Errorf("%v; this worker lets a job read only under %s (dflow worker --read DIR)", err, strings.Join(read, ", "))
	}
	return nil
}

// SpecFolders are the folders a graph's declared path fields lead to,
// those it writes and those it reads: the roots a worker on the
// coordinator's own host (--local-cluster) is given, so that it may do
// what the spec does in one process.
func SpecFolders(g *graph.Graph) (write, read []string) {
	add := func(list []string, d string) []string {
		if d != "" && !slices.Contains(list, d) {
			list = append(list, d)
		}
		return list
	}
	pathFields(g, func(_ *graph.Stage, f graph.Field, v string) {
		for _, c := range []string{v, nodes.ExpandPath(v)} {
			d := staticDir(c)
			if rp, err := resolvePath(d); err == nil {
				d = rp
			}
			for { // the folder that is there: one to be made is under it
				if fi, err := os.Stat(d); (err == nil && fi.IsDir()) || filepath.Dir(d) == d {
					break
				}
				d = filepath.Dir(d)
			}
			if f.Path == graph.WritePath {
				write = add(write, d)
			} else {
				read = add(read, d)
			}
		}
	})
	return write, read
}

// pathFields calls f with every path a stage of g sets in a config field
// its kind declares a path (graph.Field.Path); "" names no file
// (drafter_train's checkpoint) and is skipped.
func pathFields(g *graph.Graph, f func(s *graph.Stage, fd graph.Field, path string)) {
	for _, s := range g.Stages {
		if s.Kind == nil || s.Config == nil {
			continue
		}
		for _, fd := range s.Kind.Config {
			if fd.Path == graph.NotPath || !s.Config.Has(fd.Name) {
				continue
			}
			var values []string
			switch fd.Type {
			case graph.String:
				values = []string{s.Config.String(fd.Name)}
			case graph.StringList:
				values = s.Config.Strings(fd.Name)
			}
			for _, v := range values {
				if v != "" {
					f(s, fd, v)
				}
			}
		}
	}
}

// staticDir is the folder of a path before any glob in it.
func staticDir(p string) string {
	if i := strings.IndexAny(p, "*?["); i >= 0 {
		p = p[:i]
	}
	return filepath.Dir(p)
}

// within checks one path's value: as written and with $VAR expanded
// (both, where they differ, as a corpus is expanded and a model path is
// not), and each file a glob in it matches.
func within(v string, roots []string) error {
	cands := []string{v}
	if x := nodes.ExpandPath(v); x != v {
		cands = append(cands, x)
	}
	for _, c := range cands {
		paths := []string{c}
		if strings.ContainsAny(c, "*?[") {
			if m, err := filepath.Glob(c); err == nil {
				paths = append(paths, m...)
			}
		}
		for _, p := range paths {
			rp, err := resolvePath(p)
			if err != nil {
				return err
			}
			if !under(rp, roots) {
				if rp != filepath.Clean(absOf(p)) {
					return fmt.Errorf("it leads to %s, outside the folders allowed", rp)
				}
				return errors.New("outside the folders allowed")
			}
		}
	}
	return nil
}

func absOf(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// resolvePath makes p absolute, from the working folder, with the links
// of its longest existing prefix resolved (filepath.EvalSymlinks) and the
// rest, which does not exist yet, joined on. A ".." in that rest is
// refused: it would climb out of a folder that is not there.
func resolvePath(p string) (string, error) {
	if !filepath.IsAbs(p) {
		wd, err := os.Getwd()
		if err != nil {
			return "", err
		}
		p = wd + string(filepath.Separator) + p // not Join: its Clean would undo ".." before the links are seen
	}
	sep := string(filepath.Separator)
	parts := strings.Split(p, sep)
	for n := len(parts); n > 0; n-- {
		cur := strings.Join(parts[:n], sep)
		if cur == "" {
			cur = sep
		}
		r, err := filepath.EvalSymlinks(cur)
		if err != nil {
			if _, lerr := os.Lstat(cur); lerr == nil {
				// there, but not resolved: a link to nothing, which a
				// write would follow wherever it points
				return "", fmt.Errorf("%s is there but does not resolve (a link to a file that is not there?): %v", cur, err)
			}
			continue
		}
		rest := parts[n:]
		for _, c := range rest {
			if c == ".." {
				return "", fmt.Errorf("%q climbs (..) out of a folder that does not exist", p)
			}
		}
		return filepath.Join(append([]string{r}, rest...)...), nil
	}
	return filepath.Clean(p), nil
}

func under(p string, roots []string) bool {
	for _, r := range roots {
		if rel, err := filepath.Rel(r, p); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return true
		}
	}
	return false
}
