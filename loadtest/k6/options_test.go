package k6_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dop251/goja"

	"github.com/kshard/kshard/internal/configcenter"
)

// slos are the thresholds README.md promises: on each metric, some
// expression must hold the SLO or a stricter one. k6 refuses a malformed
// threshold, or one on a metric nothing makes, when it starts; it cannot
// know that one is missing or too lax.
var slos = map[string]func(agg, op string, v float64) bool{
	"kshard_e2e_latency":             p99AtMost(5000),
	"http_req_duration{kind:mutate}": p99AtMost(1000),
	"http_req_duration{kind:read}":   p99AtMost(1000),
	"kshard_ready":                   bound("rate", 1, "==", "===", ">="),
	"dropped_iterations":             bound("count", 0, "==", "==="),
}

func p99AtMost(ms float64) func(string, string, float64) bool {
	return func(agg, op string, v float64) bool { return agg == "p(99)" && (op == "<" || op == "<=") && v <= ms }
}

// bound holds for agg compared with want by one of ops.
func bound(agg string, want float64, ops ...string) func(string, string, float64) bool {
	return func(a, op string, v float64) bool { return a == agg && v == want && slices.Contains(ops, op) }
}

var thresholdExpr = regexp.MustCompile(`^\s*([a-z]+(?:\(\d+(?:\.\d+)?\))?)\s*(<=|<|>=|>|===|==|!=)\s*(-?\d+(?:\.\d+)?)\s*$`)

// TestOptionsEnforceTheSLOs reads the options each script's init context
// builds with the defaults a user gets: the SLO thresholds, the metrics
// they are on, and that each scenario runs a function the script exports.
func TestOptionsEnforceTheSLOs(t *testing.T) {
	for _, script := range scripts(t) {
		t.Run(script, func(t *testing.T) {
			m := mustEvaluate(t, script, nil)
			opts, _ := m.exports.Get("options").Export().(map[string]any)
			ths, _ := opts["thresholds"].(map[string]any)
			for name, holds := range slos {
				list, _ := ths[name].([]any)
				if !slices.ContainsFunc(list, func(e any) bool {
					p := thresholdExpr.FindStringSubmatch(fmt.Sprint(e))
					if p == nil {
						return false
					}
					v, err := strconv.ParseFloat(p[3], 64)
					return err == nil && holds(p[1], p[2], v)
				}) {
					t.Errorf("no threshold on %s holds the SLO of README.md (have %v)", name, ths[name])
				}
			}
			// A Trend of times (ms), and a Rate: rate==1 on a Counter
			// would be per second.
			for name, want := range map[string]string{"kshard_e2e_latency": "Trend true", "kshard_ready": "Rate false"} {
				if mt, _ := m.metrics[name].(map[string]any); fmt.Sprint(mt["type"], " ", mt["isTime"]) != want {
					t.Errorf("metric %s is %v, want %s (type, isTime)", name, mt, want)
				}
			}
			// k6 refuses the rest of a bad scenario when it starts.
			scenarios, _ := opts["scenarios"].(map[string]any)
			for name, sc := range scenarios {
				fn, _ := sc.(map[string]any)["exec"].(string)
				if _, ok := goja.AssertFunction(m.exports.Get(fn)); !ok {
					t.Errorf("scenario %s runs %q, which the script does not export as a function", name, fn)
				}
			}
		})
	}
}

func TestBadSettingsAreRejectedByName(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OBJECTS": "many"}, "OBJECTS"},
		{map[string]string{"OBJECTS": "0"}, "OBJECTS"},
		{map[string]string{"CREATE_RATE": "2.5"}, "CREATE_RATE"},
		{map[string]string{"KEYS": "4", "KEYS_PER_DOMAIN": "4"}, "KEYS=4 must be below KEYS_PER_DOMAIN=4"},
		{map[string]string{"KEYS": "65", "KEYS_PER_DOMAIN": "100"}, "KEYS"}, // the CRD's maxItems is 64
		{map[string]string{"DURATION": "5 minutes"}, "DURATION"},
		{map[string]string{"UPDATES_PER_MIN": "-1"}, "UPDATES_PER_MIN"},
		{map[string]string{"K8S_API": "127.0.0.1:8001"}, "K8S_API"},
		{map[string]string{"NAMESPACE": "Load_Test"}, "NAMESPACE"},
		{map[string]string{"RUN_ID": strings.Repeat("r", 41)}, "RUN_ID"}, // names the run's objects and label
		{map[string]string{"CHAOS_GRACE_SECONDS": "soon"}, "CHAOS_GRACE_SECONDS"},
	} {
		for _, script := range scripts(t) {
			if _, err := evaluate(t, script, tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s with %v: want an init error that names %s, got %v", script, tc.env, tc.want, err)
			}
		}
	}
}

// seedSetting is how seed-etcd.sh sets what it puts into deploy/kind's etcd.
var seedSetting = regexp.MustCompile(`(?m)^(DOMAINS|KEYS_PER_DOMAIN)=\$\{[A-Z_]+:-(\d+)\}$`)

// TestDefaultsFitTheSeed compares the default settings with what
// seed-etcd.sh puts into the etcd of `make deploy` (deploy/kind): the
// bindings may name only domains and keys it holds, or they wait on
// KeyNotFound forever and the Ready threshold fails.
func TestDefaultsFitTheSeed(t *testing.T) {
	script, err := os.ReadFile("seed-etcd.sh")
	if err != nil {
		t.Fatal(err)
	}
	seeds := map[string]int64{}
	for _, m := range seedSetting.FindAllSubmatch(script, -1) {
		seeds[string(m[1])], _ = strconv.ParseInt(string(m[2]), 10, 64)
	}
	lib := mustEvaluate(t, "lib/configbinding.js", nil)
	s, _ := lib.call(t, "loadSettings").Export().(map[string]any)
	for setting, name := range map[string]string{"domains": "DOMAINS", "keysPerDomain": "KEYS_PER_DOMAIN"} {
		if n, _ := s[setting].(int64); n < 1 || n > seeds[name] {
			t.Errorf("default %s is %v; seed-etcd.sh puts %s=%d", setting, s[setting], name, seeds[name])
		}
	}
	for i := range 3 {
		if d, k := lib.call(t, "seedDomain", i).String(), lib.call(t, "seedKey", i).String(); d != configcenter.SeedDomain(i) || k != configcenter.SeedKey(i) {
			t.Errorf("the scripts name seed %d %s and %s; the config center seeds %s and %s", i, d, k, configcenter.SeedDomain(i), configcenter.SeedKey(i))
		}
	}
}
