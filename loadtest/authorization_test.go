package loadtest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/controlplane"
)

// TestAuthorizationScenario runs the authorization scenario small: the
// authorized fleet's replicas ask a real SpiceDB, the load tester revokes
// and gives back grants and sees every change in its ConfigMap, and the
// figures of SpiceDB's calls come from SpiceDB's own counters: reconciles
// do not call it (the decisions come from the cache: a call per reconcile
// would make the ratio at least 1), and a relationship
// change costs a bulk re-check of what the replicas hold. The cache fleet
// has none of these figures. The run starts a control plane of its own, as
// a user's run does: the package's is TestSmoke's, which refuses another
// run's leftover objects (a control plane with no garbage collector or
// namespace controller cannot remove them).
func TestAuthorizationScenario(t *testing.T) {
	controlplane.Require(t, cp)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{
		Scenario: "authorization", Objects: 200, Domains: 20, Replicas: 2, Duration: 10 * time.Second,
		UpdateRate: 0.05, CalibrateFor: -1,
		Out: filepath.Join(dir, "results"), WorkDir: filepath.Join(dir, "work"),
		Command: "go test -run TestAuthorizationScenario ./loadtest/", Progress: testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if !c.Passed {
			t.Errorf("check failed: %s: %s", c.Name, c.Detail)
		}
	}
	if len(rep.Fleets) != 2 {
		t.Fatalf("%d fleets, want cache and authorized", len(rep.Fleets))
	}
	authorizedRows := 0
	for _, x := range rep.Fleets[0].Figures {
		if strings.Contains(x.Name, "grant") || strings.Contains(x.Name, "SpiceDB") {
			authorizedRows++
			if x.NoData != notApplicable+"no authorization" {
				t.Errorf("the cache fleet's figure %q: %v %q, want n/a", x.Name, x.Value, x.NoData)
			}
		}
	}
	if authorizedRows == 0 {
		t.Error("the report has no authorization figure")
	}
	value := map[string]float64{}
	for _, x := range rep.Fleets[1].Figures {
		if x.NoData == "" {
			value[x.Name] = x.Value
		}
	}
	for name, want := range map[string]func(float64) bool{
		"grant changes made (revoked and given back, one at a time)":                func(v float64) bool { return v >= 2 },
		"grant changes not shown in their ConfigMap within a minute":                func(v float64) bool { return v == 0 },
		"grant revoked → value gone from the ConfigMap p99":                         func(v float64) bool { return v > 0 },
		"grant given → value in the ConfigMap p99":                                  func(v float64) bool { return v > 0 },
		"SpiceDB check calls per reconcile (SpiceDB's count)":                       func(v float64) bool { return v < 1 },
		"SpiceDB bulk check calls per relationship change (SpiceDB's counts)":       func(v float64) bool { return v >= 1 },
		"namespace-domain pairs checked per relationship change (SpiceDB's counts)": func(v float64) bool { return v >= 1 },
	} {
		if v, ok := value[name]; !ok || !want(v) {
			t.Errorf("authorized figure %q = %v (read %v)", name, v, ok)
		}
	}
	t.Logf("authorized: %v", value)
}
