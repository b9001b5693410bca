package doccheck

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// modulePath is the main module's import path, trimmed from imports so that
// the docs can name packages by their folders.
const modulePath = "github.com/kshard/kshard"

// goFile is one parsed Go file of the repository.
type goFile struct {
	path string // relative to the repository root, slash-separated
	test bool
	ast  *ast.File
	// decls are the file's top-level names: funcs, types, vars, consts.
	decls map[string]bool
	// members are, by type name, the methods declared in this file with
	// that receiver, and the fields and interface methods of the types
	// declared in it.
	members map[string]map[string]bool
}

// goPackage is one folder of Go files.
type goPackage struct {
	dir    string // relative to the repository root
	name   string // the package clause of its non-test files
	module string // the folder of the go.mod it belongs to ("." for the main module)
	files  []*goFile
}

// sources is every Go file of the repository, parsed once.
type sources struct {
	root     string
	packages map[string]*goPackage // by dir
	files    map[string]*goFile    // by path
}

var (
	sourcesOnce sync.Once
	parsed      *sources
	parseErr    error
)

// repo returns the parsed repository; the tests fail at once when it cannot
// be read.
func repo(t *testing.T) *sources {
	t.Helper()
	sourcesOnce.Do(func() { parsed, parseErr = parseRepository() })
	if parseErr != nil {
		t.Fatal(parseErr)
	}
	return parsed
}

// repoRoot is the folder of the main module's go.mod, above the test's.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the repository: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module "+modulePath+"\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the test's folder", modulePath)
		}
		dir = parent
	}
}

// skippedDirs are never Go sources of kshard: the shared built tools (a
// symlink, not followed anyway), fixtures, and the JavaScript tree.
var skippedDirs = map[string]bool{"bin": true, ".git": true, "testdata": true, "node_modules": true}

func parseRepository() (*sources, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	s := &sources{root: root, packages: map[string]*goPackage{}, files: map[string]*goFile{}}
	modules := map[string]bool{".": true}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if skippedDirs[d.Name()] {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				modules[rel] = true
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parsing %s: %w", rel, err)
		}
		gf := &goFile{path: rel, test: strings.HasSuffix(rel, "_test.go"), ast: f,
			decls: map[string]bool{}, members: map[string]map[string]bool{}}
		gf.index()
		s.files[rel] = gf
		dir := pathDir(rel)
		p := s.packages[dir]
		if p == nil {
			p = &goPackage{dir: dir}
			s.packages[dir] = p
		}
		p.files = append(p.files, gf)
		if !gf.test {
			p.name = f.Name.Name
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the Go sources: %w", err)
	}
	for dir, p := range s.packages {
		for m := dir; ; m = pathDir(m) {
			if modules[m] {
				p.module = m
				break
			}
		}
	}
	return s, nil
}

// pathDir is path.Dir with "." for a file at the root.
func pathDir(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return "."
}

// index records the file's top-level names and the members of its types.
func (f *goFile) index() {
	add := func(typ, name string) {
		if f.members[typ] == nil {
			f.members[typ] = map[string]bool{}
		}
		f.members[typ][name] = true
	}
	for _, d := range f.ast.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				f.decls[d.Name.Name] = true
				continue
			}
			if typ := receiverType(d.Recv.List[0].Type); typ != "" {
				add(typ, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, sp := range d.Specs {
				switch sp := sp.(type) {
				case *ast.TypeSpec:
					f.decls[sp.Name.Name] = true
					var fields *ast.FieldList
					switch t := sp.Type.(type) {
					case *ast.StructType:
						fields = t.Fields
					case *ast.InterfaceType:
						fields = t.Methods
					}
					if fields == nil {
						add(sp.Name.Name, "") // a type with no members still has an entry
						continue
					}
					for _, fld := range fields.List {
						for _, n := range fld.Names {
							add(sp.Name.Name, n.Name)
						}
						if len(fld.Names) == 0 { // embedded: its name is a member
							if typ := receiverType(fld.Type); typ != "" {
								add(sp.Name.Name, typ)
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						f.decls[n.Name] = true
					}
				}
			}
		}
	}
}

// receiverType is the type name of a receiver or an embedded field: T, *T,
// T[P], pkg.T.
func receiverType(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.StarExpr:
		return receiverType(e.X)
	case *ast.IndexExpr:
		return receiverType(e.X)
	case *ast.IndexListExpr:
		return receiverType(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	}
	return ""
}

// declares reports whether the file declares name: a top-level name, or
// Type.Member for a method of Type declared here or a field or interface
// method of a type declared here.
func (f *goFile) declares(name string) bool {
	typ, member, ok := strings.Cut(name, ".")
	if !ok {
		return f.decls[name]
	}
	return f.members[typ][member]
}

// packagesNamed returns the folders whose package clause is name (package
// main excluded: nothing cites a command's names as main.X).
func (s *sources) packagesNamed(name string) []*goPackage {
	var out []*goPackage
	for _, p := range s.packages {
		if p.name == name && name != "main" {
			out = append(out, p)
		}
	}
	return out
}

// declares reports whether the package declares name (as goFile.declares)
// in any of its files, tests included: an Example is cited by its name.
func (p *goPackage) declares(name string) bool {
	return slices.ContainsFunc(p.files, func(f *goFile) bool { return f.declares(name) })
}

// typeHasMember reports whether some type named typ, in any package,
// declares member (a method, a field or an interface method); known is
// false when no package declares a type of that name at all.
func (s *sources) typeHasMember(typ, member string) (has, known bool) {
	for _, f := range s.files {
		if f.test {
			continue
		}
		if f.decls[typ] {
			known = true
		}
		if f.members[typ][member] {
			has = true
		}
	}
	return has, known
}

// imports returns the main module's packages that a package's non-test
// files import, by folder.
func (p *goPackage) imports() []string {
	set := map[string]bool{}
	for _, f := range p.files {
		if f.test {
			continue
		}
		for _, im := range f.ast.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if rest, ok := strings.CutPrefix(path, modulePath+"/"); ok {
				set[rest] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// hasCode reports whether the package has a non-test file.
func (p *goPackage) hasCode() bool {
	return slices.ContainsFunc(p.files, func(f *goFile) bool { return !f.test })
}

// readLines reads a repository file's lines.
func (s *sources) readLines(rel string) ([]string, error) {
	f, err := os.Open(filepath.Join(s.root, filepath.FromSlash(rel)))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", rel, err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", rel, err)
	}
	return lines, nil
}
