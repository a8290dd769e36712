package apisize

import (
	"cmp"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// api is the size of one package.
type api struct {
	exported, deprecated, lines int
}

// fn is one function's length.
type fn struct {
	name  string
	lines int
}

// deprecated reports whether a doc comment marks its declaration deprecated.
func deprecated(docs ...*ast.CommentGroup) bool {
	for _, d := range docs {
		if d != nil && strings.Contains(d.Text(), "Deprecated:") {
			return true
		}
	}
	return false
}

// measure adds one parsed file to a (unless it is a test) and appends its
// functions to fns, named with the package path pkg.
func measure(fset *token.FileSet, f *ast.File, test bool, pkg string, a *api, fns []fn) []fn {
	count := func(name string, docs ...*ast.CommentGroup) {
		if test || !ast.IsExported(name) {
			return
		}
		a.exported++
		if deprecated(docs...) {
			a.deprecated++
		}
	}
	if !test {
		a.lines += fset.Position(f.End()).Line
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			name := d.Name.Name
			if d.Recv != nil {
				recv := d.Recv.List[0].Type
				if s, ok := recv.(*ast.StarExpr); ok {
					recv = s.X
				}
				if g, ok := recv.(*ast.IndexExpr); ok {
					recv = g.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					if ast.IsExported(id.Name) {
						count(name, d.Doc)
					}
					name = id.Name + "." + name
				}
			} else {
				count(name, d.Doc)
			}
			n := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1
			fns = append(fns, fn{pkg + "." + name, n})
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					count(s.Name.Name, d.Doc, s.Doc)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						count(n.Name, d.Doc, s.Doc)
					}
				}
			}
		}
	}
	return fns
}

// walk measures every package under root (nested modules included; testdata,
// hidden and node_modules directories skipped), by path relative to root.
func walk(root string) (map[string]*api, []fn, error) {
	apis := map[string]*api{}
	var fns []fn
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" && strings.HasSuffix(name, "_test.go") {
			return nil
		}
		dir, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(dir)
		if apis[pkg] == nil {
			apis[pkg] = &api{}
		}
		fns = measure(fset, f, strings.HasSuffix(name, "_test.go"), pkg, apis[pkg], fns)
		return nil
	})
	slices.SortStableFunc(fns, func(a, b fn) int { return cmp.Or(cmp.Compare(b.lines, a.lines), cmp.Compare(a.name, b.name)) })
	return apis, fns, err
}

// TestMeasure is the negative control: a known source gives known counts.
func TestMeasure(t *testing.T) {
	root := t.TempDir()
	src := `package p

// A is counted.
type A struct{ F int }

// M is counted: an exported method of an exported type.
func (A) M() {}

// m is not.
func (A) m() {}

type b struct{}

// N is not: b is unexported.
func (b) N() {}

const (
	C1 = 1
	c2 = 2
)

// Deprecated: use A.
type Old = A

var V, w = 1, 2

func F() {
	_ = 1
}
`
	if err := os.MkdirAll(filepath.Join(root, "p"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "p", "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	apis, fns, err := walk(root)
	if err != nil {
		t.Fatal(err)
	}
	got := apis["p"]
	if got == nil || got.exported != 6 || got.deprecated != 1 || got.lines != strings.Count(src, "\n") {
		t.Errorf("p: %+v, want 6 exported (A, A.M, C1, Old, V, F), 1 deprecated, %d lines", got, strings.Count(src, "\n"))
	}
	if len(fns) == 0 || fns[0] != (fn{"p.F", 3}) {
		t.Errorf("longest function %v, want p.F of 3 lines", fns)
	}
}

// TestFigures prints, for every package with exported identifiers, their
// count, the count without deprecated ones, and that per thousand lines; then
// the ten longest functions of the tree.
func TestFigures(t *testing.T) {
	apis, fns, err := walk("../..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := make([]string, 0, len(apis))
	for p, a := range apis {
		if a.exported > 0 && !strings.HasPrefix(p, "examples/") {
			pkgs = append(pkgs, p)
		}
	}
	slices.Sort(pkgs)
	for _, p := range pkgs {
		a := apis[p]
		cur := a.exported - a.deprecated
		fmt.Printf("figure: exported/%s %d\n", p, a.exported)
		fmt.Printf("figure: exported-current/%s %d\n", p, cur)
		fmt.Printf("figure: exported-current-per-kloc/%s %.0f\n", p, float64(cur)*1000/float64(a.lines))
	}
	for i, f := range fns[:min(10, len(fns))] {
		fmt.Printf("figure: longest-func/%d/%s %d\n", i+1, f.name, f.lines)
	}
}
