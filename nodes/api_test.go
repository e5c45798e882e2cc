package nodes_test

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestPublicAPINamesNoInternal enforces a rule of the module's layout: no
// exported name of a public (importable) package mentions a type, value
// or function of an internal package. Go forbids a user outside the module
// to import anything under internal/, so a public func taking an
// *nn.AdamW, a field of type *nn.Model or a method returning []nn.Tensor
// is API that a user sees in go doc and can never call or fill in. Such a
// thing belongs in an internal package itself (the drafter model in
// internal/nn, the speculative-decoding evaluation in internal/speceval)
// or behind a public type.
//
// It walks every non-internal, non-main package of the module (separate
// modules such as examples/embed, testdata and _test.go files excluded)
// and, with go/parser and go/ast, checks the exported funcs (parameters,
// results, type parameters), the exported methods of exported types, the
// exported fields and methods of exported types (struct fields, interface
// methods, embedded types), aliases and defined types, and exported vars
// and consts (their declared type, or, when they have none, a value that
// is visibly an internal package's: a call of its function, a composite
// literal of its type, one of its names). An unexported type that an
// exported name reaches (an exported func returning it) is followed: its
// exported fields and methods are API too. Function bodies and unexported
// fields are not API and may use internal packages freely.
func TestPublicAPINamesNoInternal(t *testing.T) {
	root, module := moduleRoot(t)
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if p != root {
			if name == "internal" || name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
		}
		dirs = append(dirs, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, dir := range dirs {
		bp, err := build.ImportDir(dir, 0)
		if err != nil {
			continue // no Go files for this platform
		}
		if bp.Name == "main" {
			continue // not importable
		}
		rel, _ := filepath.Rel(root, dir)
		fset := token.NewFileSet()
		var files []*ast.File
		for _, name := range append(append([]string{}, bp.GoFiles...), bp.CgoFiles...) {
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		checked++
		pkgName := func(imp string) string {
			if r, ok := strings.CutPrefix(imp, module+"/"); ok {
				if p, err := build.ImportDir(filepath.Join(root, filepath.FromSlash(r)), 0); err == nil {
					return p.Name
				}
			}
			return path.Base(imp)
		}
		for _, l := range internalLeaks(fset, files, pkgName) {
			t.Errorf("%s: %s", filepath.ToSlash(rel), l)
		}
	}
	if checked < 5 {
		t.Fatalf("checked %d packages under %s: the walk is broken", checked, root)
	}
}

// TestInternalLeaksFinds: the checker flags each way an internal type can
// show in a public API, and nothing that is not API.
func TestInternalLeaksFinds(t *testing.T) {
	const src = `package p

import (
	"fmt"
	"example.com/m/internal/nn"
	alias "example.com/m/internal/other"
)

func Takes(o *nn.AdamW) {}
func Returns() []nn.Tensor { return nil }
func Fine(s string) error { nn.Use(); return fmt.Errorf("%s", s) }
func Hidden() hidden { return hidden{} }
func Generic[T nn.Number](x T) {}

type S struct {
	Target *nn.Model
	M      map[string]func(alias.X) int
	inner  *nn.Model
}
type Alias = nn.Model
type I interface {
	Do(x nn.In) error
	private(nn.In)
}
type hidden struct {
	Out  chan nn.Out
	priv nn.Out
}

func (hidden) Method() *nn.Ret { return nil }
func (S) Method(x nn.Arg)      {}
func (S) private(x nn.Arg)     {}

type unexported struct{ X nn.Unreached }

func (unexported) M() nn.Unreached { return nn.Unreached{} }

var V = nn.New()
var W *nn.Typed
var Plain = fmt.Sprint(1)
var Lit = nn.Lit{}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(internalLeaks(fset, []*ast.File{f}, path.Base), "\n")
	for _, want := range []string{"func Takes", "func Returns", "func Generic", "field S.Target", "field S.M",
		"type Alias", "method I.Do", "field hidden.Out", "method hidden.Method", "method S.Method", "var V", "var W", "var Lit",
		"example.com/m/internal/nn (nn.AdamW)", "example.com/m/internal/other (alias.X)"} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q among:\n%s", want, got)
		}
	}
	for _, notWant := range []string{"Fine", "inner", "private", "priv", "Unreached", "Plain"} {
		if strings.Contains(got, notWant) {
			t.Errorf("%q flagged, but it is not API:\n%s", notWant, got)
		}
	}
}

// moduleRoot finds the folder holding go.mod and the module's path.
func moduleRoot(t *testing.T) (dir, module string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if m, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(m), `"`)
				}
			}
			t.Fatalf("%s/go.mod names no module", dir)
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's folder")
		}
		dir = up
	}
}

// internalLeaks lists the exported API of one package (its files) that
// names an internal package; pkgName gives an import path's package name.
func internalLeaks(fset *token.FileSet, files []*ast.File, pkgName func(string) string) []string {
	c := &leakChecker{fset: fset, types: map[string]decl[*ast.TypeSpec]{}, methods: map[string][]decl[*ast.FuncDecl]{},
		followed: map[string]bool{}, imports: map[*ast.File]map[string]string{}}
	for _, f := range files {
		internal := map[string]string{} // import name -> path
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if !strings.Contains(p, "/internal/") && !strings.HasSuffix(p, "/internal") && !strings.HasPrefix(p, "internal/") {
				continue
			}
			name := pkgName(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			if name == "." {
				c.out = append(c.out, fmt.Sprintf("dot-imports %s, so its names pass for this package's, at %s", p, fset.Position(imp.Pos())))
			}
			internal[name] = p
		}
		c.imports[f] = internal
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok {
						c.types[ts.Name.Name] = decl[*ast.TypeSpec]{f, ts}
					}
				}
			case *ast.FuncDecl:
				if d.Recv != nil && len(d.Recv.List) == 1 {
					if r := recvName(d.Recv.List[0].Type); r != "" {
						c.methods[r] = append(c.methods[r], decl[*ast.FuncDecl]{f, d})
					}
				}
			}
		}
	}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					c.check(f, "func "+d.Name.Name, d.Type)
					continue
				}
				if r := recvName(d.Recv.List[0].Type); ast.IsExported(r) {
					c.check(f, "method "+r+"."+d.Name.Name, d.Type)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							c.checkType(f, s)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							what := d.Tok.String() + " " + n.Name
							if s.Type != nil {
								c.check(f, what, s.Type)
								continue
							}
							for _, v := range s.Values {
								c.check(f, what, v)
							}
						}
					}
				}
			}
		}
	}
	sort.Strings(c.out)
	return c.out
}

// decl is a declaration with the file it is in (whose imports it sees).
type decl[T any] struct {
	file *ast.File
	node T
}

type leakChecker struct {
	fset     *token.FileSet
	imports  map[*ast.File]map[string]string // per file: internal import name -> path
	types    map[string]decl[*ast.TypeSpec]
	methods  map[string][]decl[*ast.FuncDecl] // by receiver type name
	followed map[string]bool                  // unexported types already checked
	out      []string
}

// check reports what e, part of the API item what, names of an internal
// package; f is the file e is in.
func (c *leakChecker) check(f *ast.File, what string, e ast.Expr) {
	switch e := e.(type) {
	case nil:
	case *ast.Ident:
		if !e.IsExported() {
			c.follow(e.Name)
		}
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			if p, ok := c.imports[f][x.Name]; ok {
				c.out = append(c.out, fmt.Sprintf("%s names %s (%s.%s) at %s", what, p, x.Name, e.Sel.Name, c.fset.Position(e.Pos())))
			}
		}
	case *ast.StarExpr:
		c.check(f, what, e.X)
	case *ast.ParenExpr:
		c.check(f, what, e.X)
	case *ast.Ellipsis:
		c.check(f, what, e.Elt)
	case *ast.ArrayType:
		c.check(f, what, e.Elt)
	case *ast.MapType:
		c.check(f, what, e.Key)
		c.check(f, what, e.Value)
	case *ast.ChanType:
		c.check(f, what, e.Value)
	case *ast.IndexExpr:
		c.check(f, what, e.X)
		c.check(f, what, e.Index)
	case *ast.IndexListExpr:
		c.check(f, what, e.X)
		for _, i := range e.Indices {
			c.check(f, what, i)
		}
	case *ast.BinaryExpr: // a constraint's union
		c.check(f, what, e.X)
		c.check(f, what, e.Y)
	case *ast.UnaryExpr: // ~T, or &T{} in a var's value
		c.check(f, what, e.X)
	case *ast.FuncType:
		c.fields(f, what, e.TypeParams, true)
		c.fields(f, what, e.Params, true)
		c.fields(f, what, e.Results, true)
	case *ast.StructType:
		c.fields(f, what, e.Fields, false)
	case *ast.InterfaceType:
		c.fields(f, what, e.Methods, false)
	case *ast.CompositeLit: // a var's value
		c.check(f, what, e.Type)
	case *ast.CallExpr: // a var's value: the function's result
		c.check(f, what, e.Fun)
	}
}

// fields checks a field list: every field when all (parameters), else
// the exported and the embedded ones.
func (c *leakChecker) fields(f *ast.File, what string, fl *ast.FieldList, all bool) {
	if fl == nil {
		return
	}
	for _, fd := range fl.List {
		if all || len(fd.Names) == 0 || slices.ContainsFunc(fd.Names, (*ast.Ident).IsExported) {
			c.check(f, what, fd.Type)
		}
	}
}

// follow checks an unexported type that an exported name reaches: its
// exported fields and methods are API as well.
func (c *leakChecker) follow(name string) {
	d, ok := c.types[name]
	if !ok || c.followed[name] {
		return
	}
	c.followed[name] = true
	c.checkType(d.file, d.node)
	for _, m := range c.methods[name] {
		if m.node.Name.IsExported() {
			c.check(m.file, "method "+name+"."+m.node.Name.Name, m.node.Type)
		}
	}
}

// checkType checks a type declaration: its type parameters and, per
// exported field or method, what it names.
func (c *leakChecker) checkType(f *ast.File, ts *ast.TypeSpec) {
	name := ts.Name.Name
	c.fields(f, "type "+name, ts.TypeParams, true)
	var list *ast.FieldList
	kind := "field"
	switch t := ts.Type.(type) {
	case *ast.StructType:
		list = t.Fields
	case *ast.InterfaceType:
		list, kind = t.Methods, "method"
	default:
		c.check(f, "type "+name, ts.Type)
		return
	}
	for _, fd := range list.List {
		if len(fd.Names) == 0 {
			c.check(f, kind+" "+name+"."+embeddedName(fd.Type), fd.Type)
		}
		for _, n := range fd.Names {
			if n.IsExported() {
				c.check(f, kind+" "+name+"."+n.Name, fd.Type)
			}
		}
	}
}

// recvName is a receiver's base type name: T of T, *T, T[P] or *T[P].
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// embeddedName names an embedded field: its type's name.
func embeddedName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return embeddedName(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.Ident:
		return x.Name
	case *ast.IndexExpr:
		return embeddedName(x.X)
	case *ast.IndexListExpr:
		return embeddedName(x.X)
	}
	return "?"
}
