package k6_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dop251/goja"
	"github.com/evanw/esbuild/pkg/api"
)

// k6Modules are the k6 modules the scripts may import: the ones this
// harness implements, all of them real k6 modules.
var k6Modules = map[string]bool{"k6": true, "k6/http": true, "k6/metrics": true, "k6/execution": true}

// bundle has esbuild parse entry and every module it imports, k6's own
// modules left external, and returns the single-file output and the
// metafile. Any error or warning fails the test.
func bundle(t *testing.T, entry string, format api.Format) (string, metafile) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	res := api.Build(api.BuildOptions{
		AbsWorkingDir: wd,
		EntryPoints:   []string{entry},
		Bundle:        true,
		Write:         false,
		Format:        format,
		Platform:      api.PlatformNeutral,
		Target:        api.ES2020,
		External:      []string{"k6", "k6/*"},
		Metafile:      true,
		LogLevel:      api.LogLevelSilent,
	})
	if msgs := append(res.Errors, res.Warnings...); len(msgs) > 0 {
		formatted := api.FormatMessages(msgs, api.FormatMessagesOptions{Kind: api.ErrorMessage})
		t.Fatalf("esbuild rejects %s:\n%s", entry, strings.Join(formatted, "\n"))
	}
	if len(res.OutputFiles) != 1 {
		t.Fatalf("esbuild made %d output files for %s, want 1", len(res.OutputFiles), entry)
	}
	var meta metafile
	if err := json.Unmarshal([]byte(res.Metafile), &meta); err != nil {
		t.Fatalf("reading esbuild's metafile for %s: %v", entry, err)
	}
	return string(res.OutputFiles[0].Contents), meta
}

// metafile is the part of esbuild's metafile the checks read.
type metafile struct {
	Inputs map[string]struct {
		Imports []struct {
			Path     string `json:"path"`
			External bool   `json:"external"`
		} `json:"imports"`
	} `json:"inputs"`
	Outputs map[string]struct {
		Exports []string `json:"exports"`
	} `json:"outputs"`
}

// sample is one value added to a custom metric.
type sample struct {
	Value float64
	Tags  map[string]string
}

// metric is a custom metric a script made in its init context.
type metric struct {
	Type    string // Trend, Rate, Counter or Gauge
	IsTime  bool
	Samples []sample
}

// request is one HTTP request a script made, with its k6 tags.
type request struct {
	Method, URL string
	Status      int
	Tags        map[string]string
}

// vu runs one bundled k6 script in goja, the JavaScript engine k6 itself
// grew from, with the k6 modules the scripts use implemented over real
// HTTP, and records what the script did: its metrics, requests and checks.
type vu struct {
	t       *testing.T
	rt      *goja.Runtime
	exports *goja.Object
	exec    *goja.Object
	client  *http.Client

	mu       sync.Mutex
	metrics  map[string]*metric
	requests []request
	checks   map[string][2]int // name -> [passes, fails]
	logs     []string
}

// load bundles script, sets __ENV to env and runs the init context. It
// returns the init context's error (a thrown exception) instead of failing,
// so that tests can check how bad settings are reported.
func load(t *testing.T, script string, env map[string]string) (*vu, error) {
	t.Helper()
	code, _ := bundle(t, script, api.FormatCommonJS)
	v := &vu{
		t:       t,
		rt:      goja.New(),
		client:  &http.Client{Timeout: 10 * time.Second},
		metrics: map[string]*metric{},
		checks:  map[string][2]int{},
	}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	envObj := v.rt.NewObject()
	for k, val := range env {
		must(envObj.Set(k, val))
	}
	must(v.rt.Set("__ENV", envObj))
	must(v.rt.Set("console", v.console()))
	modules := map[string]*goja.Object{
		"k6":           v.k6Module(),
		"k6/http":      v.httpModule(),
		"k6/metrics":   v.metricsModule(),
		"k6/execution": v.execModule(),
	}
	must(v.rt.Set("require", func(name string) *goja.Object {
		m, ok := modules[name]
		if !ok {
			panic(v.rt.NewTypeError(fmt.Sprintf("k6 has no module %q", name)))
		}
		return m
	}))
	module := v.rt.NewObject()
	must(module.Set("exports", v.rt.NewObject()))
	must(v.rt.Set("module", module))
	must(v.rt.Set("exports", module.Get("exports")))
	if _, err := v.rt.RunScript(script, code); err != nil {
		return nil, err
	}
	v.exports = module.Get("exports").ToObject(v.rt)
	return v, nil
}

// mustLoad is load for scripts whose settings are valid.
func mustLoad(t *testing.T, script string, env map[string]string) *vu {
	t.Helper()
	v, err := load(t, script, env)
	if err != nil {
		t.Fatalf("init context of %s: %v", script, err)
	}
	return v
}

// function returns the exported function name, or nil.
func (v *vu) function(name string) goja.Callable {
	fn, ok := goja.AssertFunction(v.exports.Get(name))
	if !ok {
		return nil
	}
	return fn
}

// call runs an exported function the way k6 runs setup, an exec function or
// teardown: data goes through JSON, as k6 copies setup's result to each VU.
func (v *vu) call(name string, data any) (any, error) {
	fn := v.function(name)
	if fn == nil {
		return nil, fmt.Errorf("%s is not an exported function", name)
	}
	arg := goja.Undefined()
	if data != nil {
		b, err := json.Marshal(data)
		if err != nil {
			return nil, fmt.Errorf("setup data is not JSON: %w", err)
		}
		parse, _ := goja.AssertFunction(v.rt.Get("JSON").ToObject(v.rt).Get("parse"))
		if arg, err = parse(goja.Undefined(), v.rt.ToValue(string(b))); err != nil {
			return nil, err
		}
	}
	res, err := fn(goja.Undefined(), arg)
	if err != nil {
		return nil, err
	}
	return res.Export(), nil
}

// iterate runs the exec function of one scenario n times, numbering the
// iterations like k6's exec.scenario.iterationInTest.
func (v *vu) iterate(scenario, fn string, n int, data any) error {
	sc := v.exec.Get("scenario").ToObject(v.rt)
	for i := range n {
		if err := sc.Set("name", scenario); err != nil {
			return err
		}
		if err := sc.Set("iterationInTest", i); err != nil {
			return err
		}
		if _, err := v.call(fn, data); err != nil {
			return fmt.Errorf("%s iteration %d: %w", scenario, i, err)
		}
	}
	return nil
}

// options returns the script's exported options as plain Go values.
func (v *vu) options() map[string]any {
	o, ok := v.exports.Get("options").Export().(map[string]any)
	if !ok {
		v.t.Fatal("the script exports no options object")
	}
	return o
}

func (v *vu) console() *goja.Object {
	c := v.rt.NewObject()
	logf := func(level string) func(goja.FunctionCall) goja.Value {
		return func(call goja.FunctionCall) goja.Value {
			parts := make([]string, len(call.Arguments))
			for i, a := range call.Arguments {
				parts[i] = a.String()
			}
			line := level + ": " + strings.Join(parts, " ")
			v.mu.Lock()
			v.logs = append(v.logs, line)
			v.mu.Unlock()
			v.t.Log(line)
			return goja.Undefined()
		}
	}
	for _, level := range []string{"log", "info", "warn", "error", "debug"} {
		_ = c.Set(level, logf(level))
	}
	return c
}

func (v *vu) k6Module() *goja.Object {
	m := v.rt.NewObject()
	_ = m.Set("sleep", func(seconds float64) {
		time.Sleep(time.Duration(seconds * float64(time.Second)))
	})
	_ = m.Set("check", func(val goja.Value, sets *goja.Object, _ goja.Value) bool {
		all := true
		for _, name := range sets.Keys() {
			fn, ok := goja.AssertFunction(sets.Get(name))
			if !ok {
				panic(v.rt.NewTypeError("check " + name + " is not a function"))
			}
			res, err := fn(goja.Undefined(), val)
			if err != nil {
				panic(err)
			}
			v.mu.Lock()
			c := v.checks[name]
			if res.ToBoolean() {
				c[0]++
			} else {
				c[1]++
				all = false
			}
			v.checks[name] = c
			v.mu.Unlock()
		}
		return all
	})
	_ = m.Set("fail", func(msg string) { panic(v.rt.NewGoError(fmt.Errorf("fail: %s", msg))) })
	return m
}

// expectedStatuses is what http.expectedStatuses returns: the script only
// hands it back to k6 as a responseCallback.
type expectedStatuses struct{ codes []int }

func (v *vu) httpModule() *goja.Object {
	m := v.rt.NewObject()
	withBody := func(method string) func(string, goja.Value, goja.Value) *goja.Object {
		return func(url string, body, params goja.Value) *goja.Object {
			return v.do(method, url, body, params)
		}
	}
	_ = m.Set("get", func(url string, params goja.Value) *goja.Object {
		return v.do(http.MethodGet, url, goja.Undefined(), params)
	})
	_ = m.Set("post", withBody(http.MethodPost))
	_ = m.Set("put", withBody(http.MethodPut))
	_ = m.Set("patch", withBody(http.MethodPatch))
	_ = m.Set("del", withBody(http.MethodDelete))
	_ = m.Set("expectedStatuses", func(codes ...int) *expectedStatuses { return &expectedStatuses{codes} })
	return m
}

// do sends one request for the script and returns a k6-like Response.
func (v *vu) do(method, url string, body, params goja.Value) *goja.Object {
	var reader io.Reader
	if body != nil && !goja.IsUndefined(body) && !goja.IsNull(body) {
		s, ok := body.Export().(string)
		if !ok {
			panic(v.rt.NewTypeError(fmt.Sprintf("%s %s: the body must be a string (JSON.stringify it), got %T", method, url, body.Export())))
		}
		reader = strings.NewReader(s)
	}
	req, err := http.NewRequest(method, url, reader)
	if err != nil {
		panic(v.rt.NewGoError(err))
	}
	tags := map[string]string{}
	if params != nil && !goja.IsUndefined(params) && !goja.IsNull(params) {
		p := params.ToObject(v.rt)
		if h := p.Get("headers"); h != nil && !goja.IsUndefined(h) {
			ho := h.ToObject(v.rt)
			for _, k := range ho.Keys() {
				req.Header.Set(k, ho.Get(k).String())
			}
		}
		if tg := p.Get("tags"); tg != nil && !goja.IsUndefined(tg) {
			to := tg.ToObject(v.rt)
			for _, k := range to.Keys() {
				tags[k] = to.Get(k).String()
			}
		}
		if cb := p.Get("responseCallback"); cb != nil && !goja.IsUndefined(cb) {
			if _, ok := cb.Export().(*expectedStatuses); !ok {
				panic(v.rt.NewTypeError("responseCallback must come from http.expectedStatuses"))
			}
		}
	}
	res := v.rt.NewObject()
	resp, err := v.client.Do(req)
	status, text := 0, ""
	if err != nil {
		_ = res.Set("error", err.Error())
	} else {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr != nil {
			_ = res.Set("error", rerr.Error())
		}
		status, text = resp.StatusCode, string(b)
	}
	_ = res.Set("status", status)
	_ = res.Set("body", text)
	_ = res.Set("json", func() goja.Value {
		parse, _ := goja.AssertFunction(v.rt.Get("JSON").ToObject(v.rt).Get("parse"))
		out, err := parse(goja.Undefined(), v.rt.ToValue(text))
		if err != nil {
			panic(err)
		}
		return out
	})
	v.mu.Lock()
	v.requests = append(v.requests, request{Method: method, URL: url, Status: status, Tags: tags})
	v.mu.Unlock()
	return res
}

func (v *vu) metricsModule() *goja.Object {
	m := v.rt.NewObject()
	for _, typ := range []string{"Trend", "Rate", "Counter", "Gauge"} {
		_ = m.Set(typ, func(call goja.ConstructorCall) *goja.Object {
			name := call.Argument(0).String()
			isTime := call.Argument(1).ToBoolean()
			v.mu.Lock()
			if old, ok := v.metrics[name]; ok && (old.Type != typ || old.IsTime != isTime) {
				v.mu.Unlock()
				panic(v.rt.NewTypeError(fmt.Sprintf("metric %s made as a %s and as a %s", name, old.Type, typ)))
			}
			if _, ok := v.metrics[name]; !ok {
				v.metrics[name] = &metric{Type: typ, IsTime: isTime}
			}
			v.mu.Unlock()
			_ = call.This.Set("add", func(value goja.Value, tags goja.Value) {
				s := sample{Value: value.ToFloat(), Tags: map[string]string{}}
				if typ == "Rate" {
					s.Value = 0
					if value.ToBoolean() {
						s.Value = 1
					}
				}
				if tags != nil && !goja.IsUndefined(tags) {
					to := tags.ToObject(v.rt)
					for _, k := range to.Keys() {
						s.Tags[k] = to.Get(k).String()
					}
				}
				v.mu.Lock()
				v.metrics[name].Samples = append(v.metrics[name].Samples, s)
				v.mu.Unlock()
			})
			return nil
		})
	}
	return m
}

func (v *vu) execModule() *goja.Object {
	m := v.rt.NewObject()
	sc := v.rt.NewObject()
	_ = sc.Set("name", "")
	_ = sc.Set("iterationInTest", 0)
	_ = m.Set("scenario", sc)
	vuObj := v.rt.NewObject()
	_ = vuObj.Set("idInTest", 1)
	_ = m.Set("vu", vuObj)
	v.exec = m
	return m
}

// samples returns the samples of a custom metric, and fails when the script
// never made it.
func (v *vu) samples(name string) []sample {
	v.t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	m, ok := v.metrics[name]
	if !ok {
		v.t.Fatalf("the script has no metric %s", name)
	}
	return append([]sample(nil), m.Samples...)
}

// failedChecks lists the checks that failed at least once.
func (v *vu) failedChecks() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for name, c := range v.checks {
		if c[1] > 0 {
			out = append(out, fmt.Sprintf("%s (%d of %d)", name, c[1], c[0]+c[1]))
		}
	}
	sort.Strings(out)
	return out
}

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
