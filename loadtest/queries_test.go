package loadtest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/controlplane"
)

// TestQueriesParse: every query of the report, its variables filled in,
// parses with Prometheus's own parser (promql-selectors), selects a metric,
// and has no variable left.
func TestQueriesParse(t *testing.T) {
	qs, err := loadQueries()
	if err != nil {
		t.Fatal(err)
	}
	all := slices.Concat(qs.Rows, qs.Replicas, qs.Events, qs.Windows, qs.Idle)
	// The figures the load tester's own code reads by name are in the files.
	names := map[string]bool{}
	for _, q := range all {
		if names[q.Name] {
			t.Errorf("two queries are named %q", q.Name)
		}
		names[q.Name] = true
	}
	for _, name := range []string{figHeapPeak, figHeapEnd, figHeapEndSum, figLiveHeapPeak, figLiveHeapEnd, figLiveHeapEndSum,
		figStartSyncs, figStartWalked, figEventWrites, colRSSPeak,
		winSent, winReady, winP99, winQueue, winReplicaCores, winAPICores, winThrottled, winShares, idleCores, idleLeaseWrites, idleCPUPerWrite} {
		if !names[name] {
			t.Errorf("the code reads figure %q, which no query names", name)
		}
	}
	at := time.Unix(1_800_000_000, 0)
	w := queryWindow{fleet: "fleet-1", step: time.Second, memoryLimit: 512 << 20, ceiling: 400, spans: map[string]span{}}
	for _, name := range spanNames {
		w.spans[name] = span{from: at, to: at.Add(time.Minute), objects: 1000}
	}
	var exprs []string
	for _, q := range all {
		e, _, ok := w.expand(q)
		if !ok {
			t.Fatalf("%q: not expanded", q.Name)
		}
		if strings.Contains(e, "$") {
			t.Errorf("%q keeps a variable: %s", q.Name, e)
		}
		exprs = append(exprs, e)
	}
	// And the queries the settle reads a fleet's state with.
	f := &fleet{id: "fleet-1"}
	for _, sel := range []string{f.selector("workqueue_depth", `name="configbinding"`), f.selector(metricFetches, "")} {
		all = append(all, query{Name: "live " + sel})
		exprs = append(exprs, liveQuery(sel, 2*time.Second))
	}
	for i, r := range promqlSelectors(t, exprs) {
		switch {
		case r.Error != "":
			t.Errorf("%q does not parse: %s\n%s", all[i].Name, r.Error, exprs[i])
		case len(r.Metrics) == 0:
			t.Errorf("%q selects no metric: %s", all[i].Name, exprs[i])
		}
	}
}

// TestExpandDelta: $delta(X) counts what X added between the span's edges,
// 0 for series that did not exist yet, and nested parentheses stay whole.
func TestExpandDelta(t *testing.T) {
	got := expandDelta(`$delta(sum by (a) (x{b="(c"}))/2`, "1", "2")
	want := `((sum(sum by (a) (x{b="(c"}) @ 2) or vector(0)) - (sum(sum by (a) (x{b="(c"}) @ 1) or vector(0)))/2`
	if got != want {
		t.Errorf("expandDelta = %s\nwant %s", got, want)
	}
}

// selected is what promql-selectors says of one expression.
type selected struct {
	Metrics []string `json:"metrics"`
	Error   string   `json:"error"`
}

// promqlSelectors runs hack/prometheus's promql-selectors on exprs.
func promqlSelectors(t *testing.T, exprs []string) []selected {
	t.Helper()
	path := os.Getenv("PROMQL_SELECTORS")
	if path == "" {
		root, err := controlplane.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(root, "bin", "promql-selectors")
	}
	in, err := json.Marshal(exprs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("promql-selectors (`make prometheus-tools` builds it): %v", err)
	}
	var res []selected
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(exprs) {
		t.Fatalf("promql-selectors answered %d results for %d expressions (%v)", len(res), len(exprs), err)
	}
	return res
}

// TestScenariosLoad: every scenario file reads, its defaults name Options
// fields, its steps exist, and the scenarios that run on a StatefulSet's
// pods are the ones the pod target allows.
func TestScenariosLoad(t *testing.T) {
	m, err := loadScenarios()
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	for name, sc := range m {
		if sc.Pods {
			pods = append(pods, name)
		}
	}
	slices.Sort(pods)
	if !slices.Equal(pods, []string{"basic", "chaos"}) {
		t.Errorf("scenarios on pods: %v, want basic and chaos", pods)
	}
	bad := &scenario{Doc: "x", Steps: []string{"start", "dance"}}
	if err := bad.check(); err == nil || !strings.Contains(err.Error(), `step "dance"`) {
		t.Errorf("an unknown step: %v", err)
	}
	bad = &scenario{Doc: "x", Steps: []string{"start"}, Defaults: map[string]any{"Objectz": 1}}
	if err := bad.check(); err == nil || !strings.Contains(err.Error(), "Objectz") {
		t.Errorf("an unknown default: %v", err)
	}
}
