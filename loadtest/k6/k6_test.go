// Package k6_test keeps the k6 scripts of loadtest/k6 honest without k6,
// which is AGPL-licensed and not installed here. It does not imitate k6:
// esbuild (and node, where it exists) parses the scripts as ES modules,
// goja evaluates their init contexts and pure functions with k6's modules
// stubbed, and the request bodies those functions build go to a real
// kube-apiserver with deploy/crd installed. What the scripts do at run
// time (requests, checks, metrics, scenarios) only k6 on a cluster shows.
package k6_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dop251/goja"
	"github.com/evanw/esbuild/pkg/api"
)

// k6Stubs stand in for the k6 modules the scripts may import while their
// init context runs; importing any other fails. Only the metric
// constructors run there; they record each custom metric's type, so that a
// threshold can be checked against the metric it names.
const k6Stubs = `
var __metrics = {};
function __metric(type) { return function (name, isTime) { __metrics[name] = { type: type, isTime: !!isTime }; }; }
function __unused() { throw new Error('k6 is stubbed: only the init context and pure functions run here'); }
var __k6 = {
  'k6': { check: __unused, sleep: __unused },
  'k6/http': {},
  'k6/execution': {},
  'k6/metrics': { Counter: __metric('Counter'), Gauge: __metric('Gauge'), Rate: __metric('Rate'), Trend: __metric('Trend') },
};
function require(name) {
  if (!Object.prototype.hasOwnProperty.call(__k6, name)) { throw new Error('no k6 stub for ' + name); }
  return __k6[name];
}
var module = { exports: {} }, exports = module.exports;
`

// scripts are the k6 entry points: every .js file of this folder.
func scripts(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.js")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("found %d k6 scripts (%v), want basic.js and chaos.js at least", len(files), files)
	}
	return files
}

// bundle has esbuild parse entry and every module it imports, k6's own
// modules left external, and returns the one file it makes. Any error or
// warning fails the test: k6 would refuse the script, or run something
// other than what it says.
func bundle(t *testing.T, entry string, format api.Format) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	res := api.Build(api.BuildOptions{
		AbsWorkingDir: wd, EntryPoints: []string{entry}, Bundle: true, Write: false,
		Format: format, Platform: api.PlatformNeutral, Target: api.ES2020,
		External: []string{"k6", "k6/*"}, LogLevel: api.LogLevelSilent,
	})
	if msgs := append(res.Errors, res.Warnings...); len(msgs) > 0 {
		formatted := api.FormatMessages(msgs, api.FormatMessagesOptions{Kind: api.ErrorMessage})
		t.Fatalf("esbuild rejects %s:\n%s", entry, strings.Join(formatted, "\n"))
	}
	return string(res.OutputFiles[0].Contents)
}

// module is a script or lib/configbinding.js evaluated in goja with k6
// stubbed: its exports, and the custom metrics its init context made.
type module struct {
	rt      *goja.Runtime
	exports *goja.Object
	metrics map[string]any // name -> {type, isTime}
}

// evaluate runs file's init context with __ENV set to env. It returns the
// exception the init context threw, so that tests can read how a bad
// setting is reported.
func evaluate(t *testing.T, file string, env map[string]string) (*module, error) {
	t.Helper()
	code := bundle(t, file, api.FormatCommonJS)
	rt := goja.New()
	if err := rt.Set("__ENV", env); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.RunString(k6Stubs); err != nil {
		t.Fatalf("the k6 stubs: %v", err)
	}
	if _, err := rt.RunScript(file, code); err != nil {
		return nil, fmt.Errorf("init context of %s: %w", file, err)
	}
	m := &module{rt: rt, exports: rt.Get("module").ToObject(rt).Get("exports").ToObject(rt)}
	m.metrics, _ = rt.Get("__metrics").Export().(map[string]any)
	return m, nil
}

func mustEvaluate(t *testing.T, file string, env map[string]string) *module {
	t.Helper()
	m, err := evaluate(t, file, env)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// call calls the exported function name, which must not touch k6.
func (m *module) call(t *testing.T, name string, args ...any) goja.Value {
	t.Helper()
	fn, ok := goja.AssertFunction(m.exports.Get(name))
	if !ok {
		t.Fatalf("%s is not an exported function", name)
	}
	vals := make([]goja.Value, len(args))
	for i, a := range args {
		vals[i] = m.rt.ToValue(a)
	}
	v, err := fn(goja.Undefined(), vals...)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// body is what the scripts send for the object that name builds from
// args: JSON.stringify of it.
func (m *module) body(t *testing.T, name string, args ...any) []byte {
	t.Helper()
	stringify, _ := goja.AssertFunction(m.rt.Get("JSON").ToObject(m.rt).Get("stringify"))
	s, err := stringify(goja.Undefined(), m.call(t, name, args...))
	if err != nil {
		t.Fatalf("JSON.stringify(%s(...)): %v", name, err)
	}
	return []byte(s.String())
}

// TestScriptsAreValidESModules parses each script and what it imports as
// k6 does, as ES modules; evaluate then checks that the only modules left
// are k6's.
func TestScriptsAreValidESModules(t *testing.T) {
	for _, script := range scripts(t) {
		bundle(t, script, api.FormatESModule)
	}
}

// TestScriptsPassNodeCheck is a second parser's opinion, where node exists.
// Plain `node --check file.js` reads a file with import statements without
// checking it, so each file is fed as a module on standard input.
func TestScriptsPassNodeCheck(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH; esbuild's parse stands alone")
	}
	libs, err := filepath.Glob(filepath.Join("lib", "*.js"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(scripts(t), libs...) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(node, "--input-type=module", "--check")
		cmd.Stdin = bytes.NewReader(src)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("node --check %s: %v\n%s", f, err, out)
		}
	}
}
