package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/kshard/kshard/internal/controlplane"
)

// prometheusTool is the path of a tool that `make prometheus-tools` builds
// from the pinned Prometheus module (hack/prometheus): the Makefile exports
// it in env; a bare go test finds it in the repository's bin/.
func prometheusTool(t testing.TB, env, name string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		root, err := controlplane.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(root, "bin", name)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s: %v; `make prometheus-tools` builds it (make test does)", name, err)
	}
	return path
}

// rulesFile writes the groups of the shipped PrometheusRule as the rule file
// Prometheus loads, in a new directory with a copy of the rule tests.
func rulesFile(t *testing.T, edit func(string) string) (dir string) {
	t.Helper()
	rules := byKind(build(t, "monitoring"), "PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules in deploy/monitoring, want 1", len(rules))
	}
	groups, _, _ := unstructured.NestedSlice(rules[0].Object, "spec", "groups")
	out, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kshard-rules.yaml"), []byte(edit(string(out))), 0o600); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(deployDir(t), "monitoring", "prometheusrule_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheusrule_test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// promtool runs promtool in dir and returns its output and whether it
// succeeded.
func promtool(t *testing.T, dir string, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(prometheusTool(t, "PROMTOOL", "promtool"), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if _, exited := err.(*exec.ExitError); err != nil && !exited {
		t.Fatalf("promtool %v: %v", args, err)
	}
	return string(out), err == nil
}

// TestAlertRules evaluates the shipped alerts the way the Prometheus
// ecosystem tests rules: `promtool check rules`, then `promtool test rules`
// with deploy/monitoring/prometheusrule_test.yaml, in which every alert
// fires on its synthetic series, with its labels and annotations, and stays
// silent on a healthy fleet. An alert without a test of either kind fails
// it, and so does a rule whose metric is misspelt (planted).
func TestAlertRules(t *testing.T) {
	dir := rulesFile(t, func(s string) string { return s })
	if out, ok := promtool(t, dir, "check", "rules", "kshard-rules.yaml"); !ok {
		t.Fatalf("promtool check rules:\n%s", out)
	}
	if out, ok := promtool(t, dir, "test", "rules", "prometheusrule_test.yaml"); !ok {
		t.Fatalf("promtool test rules:\n%s", out)
	}

	// Every alert has a case that fires and one that stays silent.
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	readYAML(t, filepath.Join(dir, "kshard-rules.yaml"), &rules)
	readYAML(t, filepath.Join(dir, "prometheusrule_test.yaml"), &tests)
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !fires[r.Alert] {
				t.Errorf("no rule test in which %s fires", r.Alert)
			}
			if !silent[r.Alert] {
				t.Errorf("no rule test in which %s stays silent", r.Alert)
			}
		}
	}
	if alerts < 9 {
		t.Fatalf("read %d alerts from the PrometheusRule, want at least 9", alerts)
	}

	// The tests can fail: with the unowned-shards alert reading a metric
	// that does not exist, promtool says that it did not fire.
	planted := rulesFile(t, func(s string) string {
		return strings.Replace(s, "kshard_unowned_shards{", "kshard_unowned_shard{", 1)
	})
	out, ok := promtool(t, planted, "test", "rules", "prometheusrule_test.yaml")
	if ok || !strings.Contains(out, "KshardUnownedShards") {
		t.Fatalf("promtool test rules passed a rule with a misspelt metric:\n%s", out)
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// query is one PromQL expression that kshard ships, and where.
type query struct{ where, expr string }

// grafanaVariables are the dashboard's variables, as Grafana substitutes
// them before it sends a query.
var grafanaVariables = strings.NewReplacer("$namespace", "kshard-system", "$__rate_interval", "1m")

// shippedQueries collects the PromQL of the alerts, the dashboard (panels
// and variables), the KEDA trigger and the prometheus-adapter rule, as
// Prometheus receives it.
func shippedQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	monitoring := build(t, "monitoring")
	for _, r := range byKind(monitoring, "PrometheusRule") {
		groups, _, _ := unstructured.NestedSlice(r.Object, "spec", "groups")
		for _, g := range groups {
			rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
			for _, rule := range rules {
				m := rule.(map[string]any)
				qs = append(qs, query{"alert " + fmt.Sprint(m["alert"]), fmt.Sprint(m["expr"])})
			}
		}
	}
	for _, cm := range byKind(monitoring, "ConfigMap") {
		data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
		var dash struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
			Templating struct {
				List []struct {
					Name       string `json:"name"`
					Definition string `json:"definition"`
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal([]byte(data["kshard-dashboard.json"]), &dash); err != nil {
			t.Fatalf("dashboard JSON: %v", err)
		}
		for _, p := range dash.Panels {
			for _, target := range p.Targets {
				qs = append(qs, query{"dashboard panel " + p.Title, grafanaVariables.Replace(target.Expr)})
			}
		}
		// label_values(selector, label) is Grafana's; its selector is PromQL.
		labelValues := regexp.MustCompile(`^label_values\((.*), *[a-z_]+\)$`)
		for _, v := range dash.Templating.List {
			if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
				qs = append(qs, query{"dashboard variable " + v.Name, m[1]})
			}
		}
	}
	for _, so := range byKind(build(t, "autoscaling/keda"), "ScaledObject") {
		triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
		for _, tr := range triggers {
			q, _, _ := unstructured.NestedString(tr.(map[string]any), "metadata", "query")
			qs = append(qs, query{"KEDA trigger", q})
		}
	}
	for _, cm := range byKind(build(t, "autoscaling"), "ConfigMap") {
		var rules struct {
			Rules []struct {
				SeriesQuery  string `json:"seriesQuery"`
				MetricsQuery string `json:"metricsQuery"`
			} `json:"rules"`
		}
		data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
		if err := yaml.Unmarshal([]byte(data["config.yaml"]), &rules); err != nil {
			t.Fatalf("prometheus-adapter rules: %v", err)
		}
		for _, r := range rules.Rules {
			qs = append(qs, query{"prometheus-adapter seriesQuery", r.SeriesQuery})
			// The adapter fills the template per request: the series, the
			// matchers of the pods asked for, the labels to group by.
			series := regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*`).FindString(r.SeriesQuery)
			fill := strings.NewReplacer("<<.Series>>", series, "<<.LabelMatchers>>", `namespace="kshard-system",pod=~"kshard-0|kshard-1"`,
				"<<.GroupBy>>", "pod")
			qs = append(qs, query{"prometheus-adapter metricsQuery", fill.Replace(r.MetricsQuery)})
		}
	}
	return qs
}

// selected is what promql-selectors says of one expression.
type selected struct {
	Expr    string   `json:"expr"`
	Metrics []string `json:"metrics"`
	Error   string   `json:"error"`
}

// selectors parses expressions with Prometheus's own parser
// (hack/prometheus/cmd/promql-selectors).
func selectors(t testing.TB, exprs []string) []selected {
	t.Helper()
	in, err := json.Marshal(exprs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(prometheusTool(t, "PROMQL_SELECTORS", "promql-selectors"))
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("promql-selectors: %v: %s", err, stderr.String())
	}
	var res []selected
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(exprs) {
		t.Fatalf("promql-selectors answered %d results for %d expressions (%v): %s", len(res), len(exprs), err, out)
	}
	return res
}

// notKshards are the metrics the shipped queries read from other exporters,
// and which.
var notKshards = map[string]string{
	"up":                                        "Prometheus, per scrape target",
	"container_memory_working_set_bytes":        "cAdvisor, in the kubelet",
	"kube_pod_container_resource_limits":        "kube-state-metrics",
	"apiserver_request_duration_seconds_bucket": "kube-apiserver",
}

// TestShippedQueriesParse: every PromQL expression of the alerts, the
// dashboard and the autoscalers parses (Prometheus's own parser), names the
// metric of each selector, and reads either a metric of the exporters in
// notKshards or one that TestReplicaRBACAndSecureMetrics then finds on a
// live replica's /metrics. A query that does not parse, planted, fails.
func TestShippedQueriesParse(t *testing.T) {
	qs := shippedQueries(t)
	exprs := make([]string, len(qs))
	for i, q := range qs {
		exprs[i] = q.expr
	}
	for i, r := range selectors(t, exprs) {
		if r.Error != "" {
			t.Errorf("%s does not parse as PromQL: %s\n  %s", qs[i].where, r.Error, qs[i].expr)
		}
		if len(r.Metrics) == 0 && r.Error == "" {
			t.Errorf("%s selects no metric: %s", qs[i].where, qs[i].expr)
		}
	}
	if len(qs) < 30 {
		t.Fatalf("found %d shipped queries, want the alerts', the dashboard's and the autoscalers' (over 30)", len(qs))
	}
	planted := selectors(t, []string{`sum by (pod) (rate(kshard_shard_handovers_total[$__rate_interval])`})
	if planted[0].Error == "" {
		t.Fatalf("an unbalanced query parsed: %+v", planted[0])
	}
}

// referencedMetrics lists the metrics that the alerts, the dashboard and the
// autoscalers query, read by Prometheus's parser, that a kshard replica must
// export: every one not in notKshards, and the series kshard-metrics-adapter
// reads.
func referencedMetrics(t *testing.T) []string {
	t.Helper()
	qs := shippedQueries(t)
	exprs := make([]string, len(qs))
	for i, q := range qs {
		exprs[i] = q.expr
	}
	names := map[string]bool{}
	for _, r := range selectors(t, exprs) {
		for _, m := range r.Metrics {
			if _, other := notKshards[m]; !other {
				names[m] = true
			}
		}
	}
	names[adapterArgs(t, build(t, "metrics-adapter"))["--source-metric"]] = true
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	if len(out) < 15 || !names["kshard_unowned_shards"] {
		t.Fatalf("read %d metric names from the shipped queries, want the alerts', the dashboard's and the autoscalers' (%v)", len(out), out)
	}
	return out
}
