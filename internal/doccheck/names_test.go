package doccheck

import (
	"regexp"
	"testing"
)

var (
	// qualified is pkg.Name or pkg.Type.Member, not preceded by a name
	// character, a dot or a slash (a path, a longer selector).
	qualified = regexp.MustCompile(`(?:^|[^\w./-])([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.(\w+))?`)
	// typeMember is Type.Member, both exported.
	typeMember = regexp.MustCompile(`(?:^|[^\w./-])([A-Z]\w*)\.([A-Z]\w*)\b`)
)

// TestDocsNameRealGoNames checks the Go names the docs cite in code spans
// and code blocks:
//
//   - pkg.Name, where pkg is the name of a package of this repository
//     (sharding, externalcache, ring, configbinding, ...): the package
//     declares Name (tests included, for an Example), and pkg.Type.Member
//     has the member. Other packages' names (client.Object,
//     controller.TypedOptions) are not checked.
//   - Type.Member, both exported (Options.WarmLeave, Cache.Fetch): some
//     type of that name in the repository has the member. A type name no
//     package declares (ConfigMap.Data) is not checked.
func TestDocsNameRealGoNames(t *testing.T) {
	s := repo(t)
	var bad findings
	for _, d := range documents(t, s) {
		for _, sn := range d.snippets {
			for _, m := range qualified.FindAllStringSubmatch(sn.text, -1) {
				pkgs := s.packagesNamed(m[1])
				if len(pkgs) == 0 {
					continue
				}
				name := m[2]
				if m[3] != "" {
					name += "." + m[3]
				}
				found := false
				for _, p := range pkgs {
					found = found || p.declares(name)
				}
				if !found {
					bad.add("%s: %s.%s is not declared in package %s (%s)", sn, m[1], name, m[1], pkgs[0].dir)
				}
			}
			for _, m := range typeMember.FindAllStringSubmatch(sn.text, -1) {
				if has, known := s.typeHasMember(m[1], m[2]); known && !has {
					bad.add("%s: no type %s in the repository has a member %s", sn, m[1], m[2])
				}
			}
		}
	}
	bad.report(t, "Go names the docs cite that the code does not have")
}
