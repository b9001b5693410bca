package doccheck

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const architecture = "docs/architecture.md"

var (
	identifier = regexp.MustCompile(`^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?$`)
	goPath     = regexp.MustCompile(`^[a-z][\w.-]*(?:/[\w.-]+)*$`)
	// otherFile are the extensions of the files besides Go's that the map
	// names (a manifest, a script, a page), which must exist too.
	otherFile = map[string]bool{".yaml": true, ".yml": true, ".md": true, ".sh": true, ".json": true}
)

// TestArchitectureMapMatchesCode holds docs/architecture.md's map of the
// code to the code. In every table row, the code spans are read left to
// right: a Go file (`sharding/shard.go`) or a package folder
// (`sharding/ring`) becomes the row's current place, and must exist (as
// must any other file it names: `deploy/base/shard-fence.yaml`); a Go
// name after it (`ShardOf`, `labeler.reconcile`, `Values.Get`: a top-level
// name, or a type's method, field or interface method) must be declared in
// that file, or in that package. A name qualified by a package
// (`sharding.Replica`) is TestDocsNameRealGoNames's to check, and a name
// before any place is not attributed. Besides, the page must name every Go
// file of sharding/ (its table of files by concept), and its table of
// packages must list every package of the main module with exactly the
// main module's packages it imports.
func TestArchitectureMapMatchesCode(t *testing.T) {
	s := repo(t)
	d, err := readDocument(s, architecture)
	if err != nil {
		t.Fatal(err)
	}
	var bad findings
	named := map[string]bool{}
	for i, l := range d.lines {
		if !strings.HasPrefix(strings.TrimSpace(l), "|") {
			continue
		}
		var file *goFile
		var pkg *goPackage
		for _, loc := range spans.FindAllStringIndex(l, -1) {
			tok := strings.Trim(l[loc[0]:loc[1]], "`")
			switch {
			case strings.HasSuffix(tok, ".go"):
				named[tok] = true
				file, pkg = s.files[tok], nil
				if file == nil || file.test {
					bad.add("%s:%d: %s is not a Go file of the repository", architecture, i+1, tok)
				}
			case goPath.MatchString(tok) && strings.Contains(tok, "/") || s.packages[tok] != nil:
				file, pkg = nil, s.packages[tok]
				if otherFile[path.Ext(tok)] {
					if _, err := os.Stat(filepath.Join(s.root, filepath.FromSlash(tok))); err != nil {
						bad.add("%s:%d: %s is not a file of the repository", architecture, i+1, tok)
					}
				}
				if pkg != nil && !pkg.hasCode() {
					pkg = nil
				}
			case identifier.MatchString(tok):
				if first, _, ok := strings.Cut(tok, "."); ok && len(s.packagesNamed(first)) > 0 {
					continue // pkg.Name: TestDocsNameRealGoNames
				}
				switch {
				case file != nil && !file.declares(tok):
					bad.add("%s:%d: %s is not declared in %s", architecture, i+1, tok, file.path)
				case pkg != nil && !pkg.declares(tok):
					bad.add("%s:%d: %s is not declared in package %s", architecture, i+1, tok, pkg.dir)
				}
			}
		}
	}
	for path, f := range s.files {
		if pathDir(path) == "sharding" && !f.test && !named[path] {
			bad.add("%s does not name %s: its table of sharding/'s files by concept should", architecture, path)
		}
	}
	checkImportTable(s, d, &bad)
	bad.report(t, "places where docs/architecture.md's map differs from the code")
}

// checkImportTable compares the rows of the table under "## Packages and
// their imports" (package | what it is for | what it imports) with the
// main module's packages.
func checkImportTable(s *sources, d *document, bad *findings) {
	section := false
	listed := map[string]bool{}
	for i, l := range d.lines {
		if strings.HasPrefix(l, "## ") {
			section = strings.HasPrefix(l, "## Packages and their imports")
			continue
		}
		if !section || !strings.HasPrefix(l, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
		if len(cells) != 3 {
			continue
		}
		pkgDir := strings.Trim(strings.TrimSpace(cells[0]), "`")
		p := s.packages[pkgDir]
		if p == nil || !strings.HasPrefix(strings.TrimSpace(cells[0]), "`") {
			continue // the header
		}
		listed[pkgDir] = true
		if p.module != "." || !p.hasCode() {
			bad.add("%s:%d: %s is not a package of the main module", architecture, i+1, pkgDir)
			continue
		}
		var claimed []string
		for _, loc := range spans.FindAllStringIndex(cells[2], -1) {
			claimed = append(claimed, strings.Trim(cells[2][loc[0]:loc[1]], "`"))
		}
		slices.Sort(claimed)
		if got := p.imports(); !slices.Equal(claimed, got) {
			bad.add("%s:%d: %s imports %v of the main module, the table says %v", architecture, i+1, pkgDir, got, claimed)
		}
	}
	for dir, p := range s.packages {
		if p.module == "." && p.hasCode() && !listed[dir] {
			bad.add("%s: the table of packages does not list %s", architecture, dir)
		}
	}
}
