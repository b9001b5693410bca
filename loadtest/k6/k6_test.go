// Package k6_test keeps the k6 scripts of loadtest/k6 working without k6,
// which cannot be installed here: esbuild parses them as ES modules, and
// goja (the engine k6 is built on) runs them against a fake Kubernetes API
// that serves only the ConfigBinding paths of api/v1alpha1 and accepts only
// the domains and keys the config center seeds. So `make test` fails on a
// syntax error, a missing SLO threshold, a scenario whose exec function does
// not exist, a wrong API path, or a binding that could never become Ready.
package k6_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/evanw/esbuild/pkg/api"
)

// builtinMetrics are k6's own metrics and their types.
var builtinMetrics = map[string]string{
	"checks": "Rate", "data_received": "Counter", "data_sent": "Counter", "dropped_iterations": "Counter",
	"iteration_duration": "Trend", "iterations": "Counter", "vus": "Gauge", "vus_max": "Gauge",
	"http_req_blocked": "Trend", "http_req_connecting": "Trend", "http_req_duration": "Trend",
	"http_req_failed": "Rate", "http_req_receiving": "Trend", "http_req_sending": "Trend",
	"http_req_tls_handshaking": "Trend", "http_req_waiting": "Trend", "http_reqs": "Counter",
}

// aggregations are the threshold aggregations k6 accepts per metric type.
var aggregations = map[string]*regexp.Regexp{
	"Trend":   regexp.MustCompile(`^(avg|min|max|med|p\(\d+(\.\d+)?\))$`),
	"Rate":    regexp.MustCompile(`^rate$`),
	"Counter": regexp.MustCompile(`^(count|rate)$`),
	"Gauge":   regexp.MustCompile(`^value$`),
}

var thresholdExpr = regexp.MustCompile(`^\s*([a-z]+(?:\(\d+(?:\.\d+)?\))?)\s*(<=|<|>=|>|===|==|!=)\s*(-?\d+(?:\.\d+)?)\s*$`)

// threshold is one parsed threshold expression, such as p(99)<=5000.
type threshold struct {
	Agg, Op string
	Value   float64
}

// slo is one SLO a script must enforce: some threshold of metric must hold
// it.
type slo struct {
	metric string
	holds  func(threshold) bool
	what   string
}

func p99AtMost(ms float64) func(threshold) bool {
	return func(th threshold) bool { return th.Agg == "p(99)" && (th.Op == "<" || th.Op == "<=") && th.Value <= ms }
}

var slos = []slo{
	{"kshard_e2e_latency", p99AtMost(5000), "p99 spec change -> Ready <= 5 s"},
	{"http_req_duration{kind:mutate}", p99AtMost(1000), "p99 mutating API call <= 1 s"},
	{"http_req_duration{kind:read}", p99AtMost(1000), "p99 read <= 1 s"},
	{"kshard_ready", func(th threshold) bool {
		return th.Agg == "rate" && th.Value == 1 && (th.Op == "==" || th.Op == "===" || th.Op == ">=")
	}, "every spec change Ready (rate 100%)"},
}

// executors are k6's executors that end by themselves, and the option that
// bounds each.
var executors = map[string]string{
	"shared-iterations": "iterations", "per-vu-iterations": "iterations",
	"constant-vus": "duration", "constant-arrival-rate": "duration",
	"ramping-vus": "stages", "ramping-arrival-rate": "stages",
}

// The settings of the runs against the fake API: small, fast, and with
// fewer domains than objects so that domains are shared.
const (
	testObjects       = 5
	testDomains       = 3
	testKeysPerDomain = 4
)

func testEnv(apiURL string, extra ...string) map[string]string {
	env := map[string]string{
		"K8S_API":          apiURL,
		"OBJECTS":          strconv.Itoa(testObjects),
		"DOMAINS":          strconv.Itoa(testDomains),
		"KEYS_PER_DOMAIN":  strconv.Itoa(testKeysPerDomain),
		"KEYS":             "2",
		"READY_TIMEOUT":    "10s",
		"POLL_INTERVAL":    "10ms",
		"TEARDOWN_TIMEOUT": "2s",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return env
}

func TestScriptsAreValidESModules(t *testing.T) {
	for _, script := range scripts(t) {
		t.Run(script, func(t *testing.T) {
			_, meta := bundle(t, script, api.FormatESModule)
			for input, in := range meta.Inputs {
				for _, imp := range in.Imports {
					if imp.External && !k6Modules[imp.Path] {
						t.Errorf("%s imports %q: not a k6 module the scripts may use (%v)", input, imp.Path, keys(k6Modules))
					}
				}
			}
			if len(meta.Outputs) != 1 {
				t.Fatalf("esbuild made %d outputs, want 1", len(meta.Outputs))
			}
			for _, out := range meta.Outputs {
				for _, want := range []string{"options", "setup", "teardown"} {
					if !slices.Contains(out.Exports, want) {
						t.Errorf("%s does not export %s (exports %v)", script, want, out.Exports)
					}
				}
			}
		})
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
	files := scripts(t)
	libs, err := filepath.Glob(filepath.Join("lib", "*.js"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, libs...) {
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

func TestOptionsEnforceTheSLOs(t *testing.T) {
	for _, script := range scripts(t) {
		t.Run(script, func(t *testing.T) {
			v := mustLoad(t, script, nil) // the defaults a user gets
			opts := v.options()
			ths, ok := opts["thresholds"].(map[string]any)
			if !ok || len(ths) == 0 {
				t.Fatalf("options.thresholds is missing")
			}
			parsed := map[string][]threshold{}
			for name, raw := range ths {
				metricName, _, _ := strings.Cut(name, "{")
				typ := builtinMetrics[metricName]
				if m, ok := v.metrics[metricName]; ok {
					typ = m.Type
				}
				if typ == "" {
					t.Errorf("threshold on %s: no such k6 metric, and the script makes none", name)
					continue
				}
				for _, expr := range thresholdStrings(t, name, raw) {
					m := thresholdExpr.FindStringSubmatch(expr)
					if m == nil {
						t.Errorf("threshold %s: %q is not a k6 threshold expression", name, expr)
						continue
					}
					if !aggregations[typ].MatchString(m[1]) {
						t.Errorf("threshold %s: %q aggregates a %s with %s", name, expr, typ, m[1])
					}
					val, _ := strconv.ParseFloat(m[3], 64)
					parsed[name] = append(parsed[name], threshold{Agg: m[1], Op: m[2], Value: val})
				}
			}
			for _, s := range slos {
				if !slices.ContainsFunc(parsed[s.metric], s.holds) {
					t.Errorf("no threshold on %s enforces %s (have %v)", s.metric, s.what, parsed[s.metric])
				}
			}
			if m := v.metrics["kshard_e2e_latency"]; m == nil || m.Type != "Trend" || !m.IsTime {
				t.Errorf("kshard_e2e_latency must be a time Trend (milliseconds), is %+v", m)
			}
			if m := v.metrics["kshard_ready"]; m == nil || m.Type != "Rate" {
				t.Errorf("kshard_ready must be a Rate, is %+v", m)
			}
			checkScenarios(t, v, opts)
		})
	}
}

// checkScenarios checks that every scenario runs an exported function, ends
// by itself, and has rates and VUs k6 accepts; and that every exported
// function is used.
func checkScenarios(t *testing.T, v *vu, opts map[string]any) {
	t.Helper()
	scenarios, ok := opts["scenarios"].(map[string]any)
	if !ok || len(scenarios) == 0 {
		t.Fatal("options.scenarios is missing")
	}
	used := map[string]bool{"setup": true, "teardown": true, "options": true}
	var longest time.Duration
	for name, raw := range scenarios {
		sc, ok := raw.(map[string]any)
		if !ok {
			t.Errorf("scenario %s is not an object", name)
			continue
		}
		fn, _ := sc["exec"].(string)
		if fn == "" {
			fn = "default"
		}
		if v.function(fn) == nil {
			t.Errorf("scenario %s runs %s, which the script does not export as a function", name, fn)
		}
		used[fn] = true
		executor, _ := sc["executor"].(string)
		bound, known := executors[executor]
		if !known {
			t.Errorf("scenario %s: executor %q is not a k6 executor that ends by itself", name, executor)
			continue
		}
		if sc[bound] == nil {
			t.Errorf("scenario %s (%s) has no %s, so it does not end", name, executor, bound)
		}
		end := scenarioDuration(t, name, sc, "startTime") + scenarioDuration(t, name, sc, "duration") + scenarioDuration(t, name, sc, "gracefulStop")
		longest = max(longest, end)
		if strings.HasSuffix(executor, "arrival-rate") {
			rate, _ := sc["rate"].(int64)
			pre, _ := sc["preAllocatedVUs"].(int64)
			maxVUs, _ := sc["maxVUs"].(int64)
			if executor == "constant-arrival-rate" && rate < 1 {
				t.Errorf("scenario %s: rate %v, want a positive integer", name, sc["rate"])
			}
			if pre < 1 || maxVUs < pre {
				t.Errorf("scenario %s: preAllocatedVUs %v and maxVUs %v, want 1 <= preAllocatedVUs <= maxVUs", name, sc["preAllocatedVUs"], sc["maxVUs"])
			}
			scenarioDuration(t, name, sc, "timeUnit")
		}
	}
	if longest <= 0 || longest > 30*time.Minute {
		t.Errorf("with default settings the run lasts up to %v; want a bounded default under 30m", longest)
	}
	for _, name := range v.exports.Keys() {
		if v.function(name) != nil && !used[name] {
			t.Errorf("%s is exported but no scenario runs it", name)
		}
	}
}

func scenarioDuration(t *testing.T, scenario string, sc map[string]any, key string) time.Duration {
	t.Helper()
	raw, ok := sc[key]
	if !ok {
		return 0
	}
	s, _ := raw.(string)
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		t.Errorf("scenario %s: %s %v is not a k6 duration", scenario, key, raw)
	}
	return d
}

// thresholdStrings returns a threshold's expressions, written as strings or
// as {threshold: ...} objects.
func thresholdStrings(t *testing.T, name string, raw any) []string {
	t.Helper()
	list, ok := raw.([]any)
	if !ok {
		t.Errorf("threshold %s: want a list, got %T", name, raw)
		return nil
	}
	var out []string
	for _, e := range list {
		switch e := e.(type) {
		case string:
			out = append(out, e)
		case map[string]any:
			s, _ := e["threshold"].(string)
			out = append(out, s)
		default:
			t.Errorf("threshold %s: entry %v is neither a string nor an object", name, e)
		}
	}
	return out
}

// run drives a script the way k6 would, in one VU: setup, the scenarios in
// the order they start, each for iterations iterations, then teardown.
func run(t *testing.T, v *vu, iterations int) {
	t.Helper()
	data, err := v.call("setup", nil)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	scenarios := v.options()["scenarios"].(map[string]any)
	names := keys(scenarios)
	start := func(n string) time.Duration {
		return scenarioDuration(t, n, scenarios[n].(map[string]any), "startTime")
	}
	sort.SliceStable(names, func(i, j int) bool { return start(names[i]) < start(names[j]) })
	for _, name := range names {
		fn, _ := scenarios[name].(map[string]any)["exec"].(string)
		if err := v.iterate(name, fn, iterations, data); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.call("teardown", data); err != nil {
		t.Fatalf("teardown: %v", err)
	}
}

func TestWorkloadAgainstTheAPI(t *testing.T) {
	// In a namespace of its own, which setup creates and teardown deletes;
	// and in one that exists, which teardown keeps, deleting only the run's
	// objects. The second also kills pods without a grace period.
	variants := []struct {
		name, namespace string
		created         bool
		grace           string
	}{
		{"new namespace", "kshard-loadtest", true, ""},
		{"existing namespace", "default", false, "0"},
	}
	for _, script := range scripts(t) {
		for _, vr := range variants {
			t.Run(script+"/"+vr.name, func(t *testing.T) {
				testWorkload(t, script, vr.namespace, vr.created, vr.grace)
			})
		}
	}
}

// testWorkload runs script's setup, its create, update and (if it has one)
// chaos scenarios, and teardown against the fake API, and checks what each
// step left behind.
func testWorkload(t *testing.T, script, namespace string, createsNamespace bool, grace string) {
	fake := newFakeAPI(t, testDomains, testKeysPerDomain)
	env := testEnv(fake.server.URL, "NAMESPACE", namespace)
	wantGrace := "default"
	if grace != "" {
		env["CHAOS_GRACE_SECONDS"] = grace
		wantGrace = grace
	}
	v := mustLoad(t, script, env)
	// One more iteration than objects: the create scenario must skip the
	// extra one, and the update scenario must come round to object 0 again.
	iterations := testObjects + 1

	data, err := v.call("setup", nil)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	scenarios := v.options()["scenarios"].(map[string]any)
	_, killsPods := scenarios["chaos"]
	for _, name := range []string{"create", "update", "chaos"} {
		sc, ok := scenarios[name].(map[string]any)
		if !ok {
			if name != "chaos" {
				t.Fatalf("%s has no %s scenario", script, name)
			}
			continue
		}
		if err := v.iterate(name, sc["exec"].(string), iterations, data); err != nil {
			t.Fatal(err)
		}
		if name != "create" {
			continue
		}
		st := fake.snapshot()
		if st.created != testObjects || len(st.objects) != testObjects {
			t.Fatalf("created %d ConfigBindings (%d held), want %d", st.created, len(st.objects), testObjects)
		}
		if !st.namespaces[namespace] {
			t.Errorf("namespace %s does not exist after setup", namespace)
		}
		domains := map[string]bool{}
		for _, o := range st.objects {
			domains[o.Spec.Domain] = true
		}
		if len(domains) != testDomains {
			t.Errorf("%d objects use %d domains (%v), want all %d", testObjects, len(domains), keys(domains), testDomains)
		}
	}

	st := fake.snapshot()
	changes := st.created + st.updates
	if st.updates != iterations {
		t.Errorf("the update scenario changed %d specs in %d iterations", st.updates, iterations)
	}
	// The status lags each change by a read or more, showing the previous
	// generation Ready: a script that stops polling early never reads the
	// new generation Ready.
	if st.readySeen != changes {
		t.Errorf("the script read %d of %d spec changes Ready: it stops polling before the new generation is Ready", st.readySeen, changes)
	}
	latency := v.samples("kshard_e2e_latency")
	ready := v.samples("kshard_ready")
	if len(latency) != changes || len(ready) != changes {
		t.Errorf("%d spec changes, but %d latency and %d ready samples", changes, len(latency), len(ready))
	}
	ops := map[string]int{}
	for _, s := range latency {
		ops[s.Tags["op"]]++
		if s.Value < 0 {
			t.Errorf("negative latency %v", s.Value)
		}
	}
	if ops["create"] != st.created || ops["update"] != st.updates {
		t.Errorf("latency samples by op %v, want create=%d update=%d", ops, st.created, st.updates)
	}
	for _, s := range ready {
		if s.Value != 1 {
			t.Errorf("a spec change was recorded not Ready: %+v", s)
		}
	}
	for _, r := range v.requests {
		want := "mutate"
		if r.Method == "GET" {
			want = "read"
		}
		if r.Tags["kind"] != want || r.Tags["name"] == "" {
			t.Errorf("%s %s has tags %v, want kind=%s and a name: the SLO thresholds select on them", r.Method, r.URL, r.Tags, want)
		}
	}
	if killsPods {
		deletions := v.samples("kshard_pod_deletions")
		if len(st.pods) != iterations || len(deletions) != iterations {
			t.Errorf("chaos ran %d times, deleted %d pods (%v) and counted %d", iterations, len(st.pods), st.pods, len(deletions))
		}
		for _, p := range st.pods {
			if !strings.HasSuffix(p, " grace="+wantGrace) {
				t.Errorf("deleted pod %s, want grace=%s", p, wantGrace)
			}
		}
	} else if len(st.pods) > 0 {
		t.Errorf("%s deleted pods %v", script, st.pods)
	}

	if _, err := v.call("teardown", data); err != nil {
		t.Fatalf("teardown: %v", err)
	}
	st = fake.snapshot()
	if len(st.objects) != 0 {
		t.Errorf("teardown left %d ConfigBindings", len(st.objects))
	}
	if st.namespaces[namespace] == createsNamespace {
		t.Errorf("after teardown namespace %s exists: %v; it should exist only if setup did not create it", namespace, st.namespaces[namespace])
	}
	if failed := v.failedChecks(); len(failed) > 0 {
		t.Errorf("checks failed: %v", failed)
	}
}

func TestSpecChangesThatNeverBecomeReadyFailTheReadyRate(t *testing.T) {
	fake := newFakeAPI(t, testDomains, testKeysPerDomain)
	fake.readyAfterGets = -1
	v := mustLoad(t, "basic.js", testEnv(fake.server.URL, "OBJECTS", "2", "READY_TIMEOUT", "200ms"))
	run(t, v, 2)
	ready := v.samples("kshard_ready")
	if len(ready) != 4 {
		t.Fatalf("%d ready samples for 4 spec changes", len(ready))
	}
	for _, s := range ready {
		if s.Value != 0 {
			t.Errorf("a spec change that never became Ready was recorded Ready: %+v", s)
		}
	}
	if n := len(v.samples("kshard_e2e_latency")); n != 0 {
		t.Errorf("%d latency samples for spec changes that never became Ready", n)
	}
}

// The config center seeds testDomains domains here, but the script is told
// of more: the bindings to the others are refused (by the fake, standing in
// for a binding that would wait on KeyNotFound forever) and count as not
// Ready, so the names the scripts use are checked.
func TestBindingsToUnseededNamesFailTheReadyRate(t *testing.T) {
	fake := newFakeAPI(t, testDomains, testKeysPerDomain)
	v := mustLoad(t, "basic.js", testEnv(fake.server.URL, "DOMAINS", strconv.Itoa(testDomains+2)))
	run(t, v, testObjects)
	notReady := 0
	for _, s := range v.samples("kshard_ready") {
		if s.Value == 0 {
			notReady++
		}
	}
	// Objects 3 and 4 bind domain-3 and domain-4: their creates fail, and so
	// do their updates.
	if notReady != 4 {
		t.Errorf("%d spec changes recorded not Ready, want 4 (the creates and updates of the 2 unseeded domains)", notReady)
	}
	if failed := v.failedChecks(); len(failed) == 0 {
		t.Errorf("no check failed")
	}
}

// TestDefaultsFitTheKindDeployment runs each script with no settings but the
// API's URL against the cluster `make deploy` makes: the default domains and
// keys must be ones its config center seeds, and chaos.js must find its
// StatefulSet.
func TestDefaultsFitTheKindDeployment(t *testing.T) {
	kc := deployedKind(t)
	objects := kc.seedDomains + 1 // every default domain at least once
	for _, script := range scripts(t) {
		t.Run(script, func(t *testing.T) {
			fake := newFakeAPI(t, kc.seedDomains, kc.keysPerDomain)
			fake.readyAfterGets = 1
			v := mustLoad(t, script, map[string]string{"K8S_API": fake.server.URL, "OBJECTS": strconv.Itoa(objects)})
			run(t, v, objects)
			ready := v.samples("kshard_ready")
			if len(ready) != 2*objects {
				t.Errorf("%d ready samples for %d spec changes", len(ready), 2*objects)
			}
			for _, s := range ready {
				if s.Value != 1 {
					t.Fatalf("with default settings a spec change never became Ready: %+v", s)
				}
			}
			if failed := v.failedChecks(); len(failed) > 0 {
				t.Errorf("checks failed: %v", failed)
			}
		})
	}
}

func TestBadSettingsAreRejectedByName(t *testing.T) {
	cases := []struct {
		env  []string
		want string
	}{
		{[]string{"OBJECTS", "many"}, "OBJECTS"},
		{[]string{"OBJECTS", "0"}, "OBJECTS"},
		{[]string{"CREATE_RATE", "2.5"}, "CREATE_RATE"},
		{[]string{"KEYS", "4", "KEYS_PER_DOMAIN", "4"}, "KEYS=4 must be below KEYS_PER_DOMAIN=4"},
		{[]string{"KEYS", "65"}, "KEYS"},
		{[]string{"DURATION", "5 minutes"}, "DURATION"},
		{[]string{"UPDATES_PER_MIN", "-1"}, "UPDATES_PER_MIN"},
		{[]string{"K8S_API", "127.0.0.1:8001"}, "K8S_API"},
		{[]string{"NAMESPACE", "Load_Test"}, "NAMESPACE"},
		{[]string{"CHAOS_GRACE_SECONDS", "soon"}, "CHAOS_GRACE_SECONDS"},
	}
	for _, script := range scripts(t) {
		for _, tc := range cases {
			t.Run(script+"/"+strings.Join(tc.env, "="), func(t *testing.T) {
				_, err := load(t, script, testEnv("http://127.0.0.1:1", tc.env...))
				if err == nil {
					t.Fatalf("%v accepted", tc.env)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error does not name %s: %v", tc.want, err)
				}
			})
		}
	}
}

func TestSetupExplainsWhatIsMissing(t *testing.T) {
	t.Run("no CRD", func(t *testing.T) {
		fake := newFakeAPI(t, testDomains, testKeysPerDomain)
		fake.serveCRD = false
		v := mustLoad(t, "basic.js", testEnv(fake.server.URL))
		_, err := v.call("setup", nil)
		if err == nil || !strings.Contains(err.Error(), "deploy/crd") {
			t.Fatalf("setup against a cluster without the CRD: %v", err)
		}
	})
	t.Run("no StatefulSet", func(t *testing.T) {
		fake := newFakeAPI(t, testDomains, testKeysPerDomain)
		fake.replicas = -1
		v := mustLoad(t, "chaos.js", testEnv(fake.server.URL))
		_, err := v.call("setup", nil)
		if err == nil || !strings.Contains(err.Error(), "StatefulSet kshard-system/kshard") {
			t.Fatalf("chaos setup without the kshard StatefulSet: %v", err)
		}
	})
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
