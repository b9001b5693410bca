package doccheck

import (
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// metricPrefix is what kshard's metric names begin with: the sharding and
// externalcache libraries name theirs prefix + "_..." with this default.
const metricPrefix = "kshard"

var (
	docMetric = regexp.MustCompile(`\b` + metricPrefix + `_[a-z0-9_]*[a-z0-9]`)
	// k6Metric is a custom metric of the k6 scripts: new Trend('name').
	k6Metric = regexp.MustCompile(`new (?:Trend|Counter|Rate|Gauge)\(\s*['"]([a-z0-9_]+)['"]`)
)

// TestDocsNameRealMetrics checks that every kshard_ metric the docs name
// (anywhere, prose included: the names are distinctive) is one that code of
// the repository defines. Defined means one of:
//
//   - the Name of a composite literal (prometheus.CounterOpts and its
//     kin), as "kshard_x" or prefix + "_x" (a library's configurable
//     prefix, kshard by default);
//   - prefix + "_x" passed anywhere (externalcache's gauge helper), where
//     the left operand's name says it is a prefix;
//   - a Default...Metric constant (the metric the custom metrics adapter
//     serves to the HPA);
//   - a k6 script's custom metric (loadtest/k6).
//
// A histogram's _bucket, _sum and _count series count as the histogram.
// Metrics of client-go, controller-runtime, the Go runtime and the API
// server are not checked: their code is not in this repository.
func TestDocsNameRealMetrics(t *testing.T) {
	s := repo(t)
	defined := definedMetrics(s)
	k6, err := filepath.Glob(filepath.Join(s.root, "loadtest", "k6", "lib", "*.js"))
	if err != nil {
		t.Fatal(err)
	}
	scripts, _ := filepath.Glob(filepath.Join(s.root, "loadtest", "k6", "*.js"))
	for _, js := range append(k6, scripts...) {
		b, err := os.ReadFile(js)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range k6Metric.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
	}
	if len(defined) < 20 {
		t.Fatalf("found only %d metric definitions: the test no longer reads them", len(defined))
	}
	var bad findings
	for _, d := range documents(t, s) {
		for i, l := range d.lines {
			for _, name := range docMetric.FindAllString(l, -1) {
				if defined[name] {
					continue
				}
				if base, ok := histogramSeries(name); ok && defined[base] {
					continue
				}
				bad.add("%s:%d: %s is not a metric that kshard defines", d.path, i+1, name)
			}
		}
	}
	bad.report(t, "metrics the docs name that no code defines")
}

func histogramSeries(name string) (string, bool) {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			return base, true
		}
	}
	return "", false
}

// definedMetrics returns the kshard_ metric names the Go sources define,
// by the rules of TestDocsNameRealMetrics.
func definedMetrics(s *sources) map[string]bool {
	out := map[string]bool{}
	name := func(e ast.Expr) {
		if v, ok := stringLit(e); ok && strings.HasPrefix(v, metricPrefix+"_") {
			out[v] = true
		}
		if v, ok := prefixed(e); ok {
			out[metricPrefix+v] = true
		}
	}
	for _, f := range s.files {
		if f.test {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok && k.Name == "Name" {
					name(n.Value)
				}
			case *ast.CallExpr:
				for _, a := range n.Args {
					if v, ok := prefixed(a); ok {
						out[metricPrefix+v] = true
					}
				}
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if strings.HasPrefix(id.Name, "Default") && strings.HasSuffix(id.Name, "Metric") && i < len(n.Values) {
						name(n.Values[i])
					}
				}
			}
			return true
		})
	}
	return out
}

// prefixed returns "_x" of prefix + "_x", where the left operand is named
// like a prefix (prefix, MetricsPrefix, o.MetricsPrefix).
func prefixed(e ast.Expr) (string, bool) {
	b, ok := e.(*ast.BinaryExpr)
	if !ok || b.Op != token.ADD {
		return "", false
	}
	var left string
	switch x := b.X.(type) {
	case *ast.Ident:
		left = x.Name
	case *ast.SelectorExpr:
		left = x.Sel.Name
	}
	v, ok := stringLit(b.Y)
	if !ok || !strings.HasPrefix(v, "_") || !strings.Contains(strings.ToLower(left), "prefix") {
		return "", false
	}
	return v, true
}
