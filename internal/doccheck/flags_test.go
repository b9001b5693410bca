package doccheck

import (
	"flag"
	"go/ast"
	"go/token"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// otherTools are the flags that the docs name in passing (a span that
// starts with the flag) but that belong to another tool, with the tool.
// A tool of this repository is named by its folder, and its flag must
// exist there; others (a node's daemons) are taken on trust.
var otherTools = map[string]string{
	"scenario":            "loadtest/cmd/loadtest",
	"faults":              "loadtest/cmd/loadtest",
	"no-fencing":          "loadtest/cmd/loadtest",
	"node-faults":         "loadtest/cmd/loadtest",
	"apiserver-audit-log": "loadtest/cmd/loadtest",
	"profile":             "loadtest/cmd/loadtest",
	"replica-args":        "loadtest/cmd/loadtest",
	"seed-domains":        "cmd/configcenter",
	"keys-per-domain":     "cmd/configcenter",
	"root-dir":            "the kubelet",
}

// otherToolSections are the documents (by path) and sections (path#heading)
// about another tool of the repository, with the tool: the flags they cite
// are that tool's (some come from the libraries it builds on), not
// kshard's, and are not checked.
var otherToolSections = map[string]string{
	"loadtest/README.md": "loadtest/cmd/loadtest",
	"deploy/README.md#Without Prometheus: kshard-metrics-adapter": "cmd/kshard-metrics-adapter",
}

// TestDocsNameRealFlags checks that every flag the docs give kshard exists
// on the command they give it to. Which flags are kshard's, by the words
// of a code span or of a command in a code block:
//
//   - a snippet whose first word is a flag names flags in passing
//     (`--cache-ttl`, `--config-center etcd`): each is kshard's, on any
//     subcommand, unless otherTools says whose it is;
//   - otherwise each command of it (split at &&, ||, ; and |) is read: the
//     flags after a command word naming kshard (kshard, bin/kshard,
//     go run ./cmd/kshard) and its subcommand are that subcommand's, or the
//     root's; a command of any other tool (make, go, kubectl, etcdctl, the
//     load tester, ...) is not checked;
//   - anywhere, the value of --replica-args= is kshard controller's flags:
//     the load tester passes it to every replica.
//
// Prose outside code spans is not read: a flag is cited in backticks. Nor
// are the sections otherToolSections names.
func TestDocsNameRealFlags(t *testing.T) {
	s := repo(t)
	kshard := kshardFlags(t, s)
	all := map[string]bool{}
	for _, set := range kshard {
		for f := range set {
			all[f] = true
		}
	}
	var bad findings
	for section, tool := range otherToolSections {
		if s.packages[tool] == nil {
			bad.add("otherToolSections gives %s to %s, which is not a folder of Go code", section, tool)
		}
	}
	for flagName, tool := range otherTools {
		if all[flagName] {
			bad.add("otherTools lists --%s as %s's, but it is kshard's: drop it from the list", flagName, tool)
		}
		if p := s.packages[tool]; p != nil && !flagsOf(p)[""][flagName] {
			bad.add("otherTools lists --%s as %s's, which has no such flag", flagName, tool)
		}
	}
	sections := map[string]bool{}
	for _, d := range documents(t, s) {
		for _, sn := range d.snippets {
			if otherToolSections[sn.doc] != "" || otherToolSections[sn.doc+"#"+sn.heading] != "" {
				sections[sn.doc] = true
				sections[sn.doc+"#"+sn.heading] = true
				continue
			}
			for _, c := range kshardCitations(sn.text, kshard) {
				set, where := all, "kshard"
				if c.sub != nil {
					set, where = kshard[*c.sub], "kshard "+*c.sub
				}
				if c.sub == nil && otherTools[c.flag] != "" {
					continue
				}
				if !set[c.flag] {
					bad.add("%s: --%s is not a flag of %s", sn, c.flag, strings.TrimSpace(where))
				}
			}
		}
	}
	for section := range otherToolSections {
		if !sections[section] {
			bad.add("otherToolSections names %s, which has no code span: a section renamed?", section)
		}
	}
	bad.report(t, "flags the docs give kshard that it does not have")
}

// citation is one flag a snippet gives kshard; sub is the subcommand
// ("" for the root), nil when the flag is named in passing.
type citation struct {
	flag string
	sub  *string
}

var (
	flagWord = regexp.MustCompile(`^<?--([a-z0-9][a-z0-9-]*)`)
	commands = regexp.MustCompile(`&&|\|\||;|\|`)
)

// kshardCitations returns the flags a snippet gives kshard, by the rule of
// TestDocsNameRealFlags.
func kshardCitations(text string, kshard map[string]map[string]bool) []citation {
	var out []citation
	controller := "controller"
	for _, w := range strings.Fields(text) {
		if v, ok := strings.CutPrefix(strings.Trim(w, `"'`), "--replica-args="); ok {
			for _, rw := range strings.Fields(v) {
				if m := flagWord.FindStringSubmatch(rw); m != nil {
					out = append(out, citation{m[1], &controller})
				}
			}
		}
	}
	words := strings.Fields(text)
	if len(words) > 0 && flagWord.MatchString(words[0]) {
		for _, w := range words {
			if m := flagWord.FindStringSubmatch(w); m != nil {
				out = append(out, citation{flag: m[1]})
			}
		}
		return out
	}
	for _, cmd := range commands.Split(text, -1) {
		words := strings.Fields(cmd)
		// Leading environment assignments and wrappers are not the command.
		for len(words) > 0 && (strings.Contains(words[0], "=") || words[0] == "sudo" || words[0] == "time" || words[0] == "exec") {
			words = words[1:]
		}
		if len(words) > 2 && words[0] == "go" && words[1] == "run" {
			words = words[2:]
			for len(words) > 0 && strings.HasPrefix(words[0], "-") {
				words = words[1:]
			}
		}
		if len(words) == 0 || (words[0] != "kshard" && !strings.HasSuffix(words[0], "/kshard")) {
			continue
		}
		sub := ""
		if len(words) > 1 {
			if _, ok := kshard[words[1]]; ok && words[1] != "" {
				sub = words[1]
			}
		}
		for _, w := range words[1:] {
			if strings.HasPrefix(w, "--replica-args=") {
				continue
			}
			if m := flagWord.FindStringSubmatch(w); m != nil {
				out = append(out, citation{m[1], &sub})
			}
		}
	}
	return out
}

// kshardFlags returns the flags of kshard's commands by subcommand ("" is
// the root), as cmd/kshard defines them: each subcommand's own, its
// parent's persistent ones (the root's zap logging flags, bound by zap's
// BindFlags, which the test calls as the root does), and cobra's --help.
func kshardFlags(t *testing.T, s *sources) map[string]map[string]bool {
	t.Helper()
	p := s.packages["cmd/kshard"]
	if p == nil {
		t.Fatal("no cmd/kshard")
	}
	sets := flagsOf(p)
	root := sets[""]
	if root == nil {
		t.Fatal(`cmd/kshard: no command with Use "kshard"`)
	}
	if usesBindFlags(p) {
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		(&zap.Options{}).BindFlags(fs)
		fs.VisitAll(func(f *flag.Flag) { root[f.Name] = true })
	}
	for name, set := range sets {
		set["help"] = true
		if name != "" {
			for f := range root {
				set[f] = true
			}
		}
	}
	if len(sets) < 2 {
		t.Fatalf("cmd/kshard: found %d commands; the test no longer reads their definitions", len(sets))
	}
	return sets
}

// flagsOf returns the flags a package's non-test files define, by the
// cobra command whose Use is in the same function (the root's, "kshard",
// and a package without cobra's, under ""). A flag is a call of a flag
// set's definer: XxxVar(&v, "name", ...), XxxVarP(&v, "name", "n", ...),
// Xxx("name", ...) or XxxP("name", "n", ...).
func flagsOf(p *goPackage) map[string]map[string]bool {
	sets := map[string]map[string]bool{}
	for _, f := range p.files {
		if f.test {
			continue
		}
		for _, d := range f.ast.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			use, isCommand, names := "", false, []string{}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.KeyValueExpr:
					if k, ok := n.Key.(*ast.Ident); ok && k.Name == "Use" {
						if v, ok := stringLit(n.Value); ok {
							use, isCommand = strings.Fields(v + " ")[0], true
						}
					}
				case *ast.CallExpr:
					if name, ok := definedFlag(n); ok {
						names = append(names, name)
					}
				}
				return true
			})
			if use == "kshard" {
				use = ""
			}
			if !isCommand && len(names) == 0 {
				continue
			}
			if sets[use] == nil {
				sets[use] = map[string]bool{}
			}
			for _, n := range names {
				sets[use][n] = true
			}
		}
	}
	return sets
}

var definer = regexp.MustCompile(`^(String|Bool|Int|Int8|Int16|Int32|Int64|Uint|Uint8|Uint16|Uint32|Uint64|Float32|Float64|Duration|StringSlice|StringArray|StringToString|IntSlice|Func|BoolFunc|Text|IP|IPNet|Count)(Var)?(P)?$`)

// definedFlag returns the name a flag-defining call gives its flag.
func definedFlag(call *ast.CallExpr) (string, bool) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	m := definer.FindStringSubmatch(sel.Sel.Name)
	if m == nil {
		return "", false
	}
	i := 0 // Xxx(name, ...), Func(name, ...)
	if m[2] == "Var" {
		i = 1 // XxxVar(&v, name, ...)
	}
	if i >= len(call.Args) {
		return "", false
	}
	return stringLit(call.Args[i])
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(lit.Value)
	return v, err == nil
}

// usesBindFlags reports whether the package binds a library's Go flags
// with BindFlags (cmd/kshard's root: zap's).
func usesBindFlags(p *goPackage) bool {
	found := false
	for _, f := range p.files {
		if f.test {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "BindFlags" {
				found = true
			}
			return !found
		})
	}
	return found
}
