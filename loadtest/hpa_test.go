package loadtest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"

	"github.com/kshard/kshard/internal/controlplane"
)

func TestDesiredReplicas(t *testing.T) {
	for _, tc := range []struct {
		current         int32
		average, target float64
		want            int32
	}{
		{3, 5000, 5000, 3},  // on target
		{3, 5400, 5000, 3},  // within the 10 % tolerance
		{3, 5600, 5000, 4},  // ceil(3 × 1.12)
		{3, 10000, 5000, 6}, // double
		{4, 1000, 5000, 1},  // ceil(4 × 0.2)
		{2, 0, 5000, 0},     // nothing held
	} {
		if got := desiredReplicas(tc.current, tc.average, tc.target); got != tc.want {
			t.Errorf("desiredReplicas(%d, %v, %v) = %d, want %d", tc.current, tc.average, tc.target, got, tc.want)
		}
	}
}

// The HPA of deploy/autoscaling: one pod up per 2 minutes, down only on the
// highest recommendation of 10 minutes, one pod per 5 minutes.
const testHPA = `
# a comment, and a document that is not an HPA first
apiVersion: v1
kind: ConfigMap
metadata: {name: x}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: kshard, namespace: kshard-system}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: StatefulSet, name: kshard}
  minReplicas: 3
  maxReplicas: 10
  metrics:
  - type: Pods
    pods:
      metric: {name: kshard_objects_held}
      target: {type: AverageValue, averageValue: "5000"}
  behavior:
    scaleUp:
      stabilizationWindowSeconds: 0
      selectPolicy: Max
      policies: [{type: Pods, value: 1, periodSeconds: 120}]
    scaleDown:
      stabilizationWindowSeconds: 600
      selectPolicy: Max
      policies: [{type: Pods, value: 1, periodSeconds: 300}]
`

func writeHPA(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hpa.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadHPA(t *testing.T) {
	spec, err := readHPA(writeHPA(t, testHPA))
	if err != nil {
		t.Fatal(err)
	}
	if spec.MinReplicas != 3 || spec.MaxReplicas != 10 || spec.Target != 5000 ||
		spec.Metric != "kshard_objects_held" || spec.ReplicaMetric != "kshard_shard_objects" {
		t.Errorf("spec %+v", spec)
	}
	if spec.Down.Window != 10*time.Minute || spec.Up.Window != 0 ||
		len(spec.Up.Policies) != 1 || spec.Up.Policies[0] != (hpaPolicy{Value: 1, Period: 2 * time.Minute}) {
		t.Errorf("behaviour %+v / %+v", spec.Up, spec.Down)
	}
	scaled := spec.scaled(0.1)
	if scaled.Down.Window != time.Minute || scaled.Down.Policies[0].Period != 30*time.Second || spec.Down.Window != 10*time.Minute {
		t.Errorf("scaled by 0.1: %+v; the original must not change: %v", scaled.Down, spec.Down.Window)
	}

	for name, text := range map[string]string{
		"no HPA":         "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
		"no Pods metric": "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: x}\nspec:\n  maxReplicas: 3\n  metrics: [{type: Resource, resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}}]\n",
		"bad YAML":       "kind: [",
	} {
		if _, err := readHPA(writeHPA(t, text)); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// TestReadShippedHPA reads the HPA the repository ships, which the autoscale
// scenario uses by default.
func TestReadShippedHPA(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := readHPA(filepath.Join(root, defaultHPAFile))
	if err != nil {
		t.Fatal(err)
	}
	if spec.ReplicaMetric != "kshard_shard_objects" {
		t.Errorf("the shipped HPA scales on %s (read from %s): the load tester knows how to compute only kshard_objects_held or a replica's own metric", spec.Metric, spec.ReplicaMetric)
	}
}

func TestAutoscalerStabilizationAndPolicies(t *testing.T) {
	spec, err := readHPA(writeHPA(t, testHPA))
	if err != nil {
		t.Fatal(err)
	}
	a := newAutoscaler(*spec)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

	// 30,000 objects over 3 replicas: the formula wants 6, the policy
	// allows one pod per 2 minutes.
	if got := a.decide(at(0), 3, 10000); got != 4 {
		t.Fatalf("first decision %d, want 4 (one pod per period)", got)
	}
	if got := a.decide(at(15), 4, 7500); got != 4 {
		t.Fatalf("15 s later %d, want 4 (the period is not over)", got)
	}
	if got := a.decide(at(121), 4, 7500); got != 5 {
		t.Fatalf("after the period %d, want 5", got)
	}
	// The load drops to 5,000 objects: the formula wants 1 (clamped to 3),
	// but the down window keeps the highest recommendation of 10 minutes.
	if got := a.decide(at(200), 5, 1000); got != 5 {
		t.Fatalf("right after the drop %d, want 5 (stabilization)", got)
	}
	if got := a.decide(at(400), 5, 1000); got != 5 {
		t.Fatalf("at 400 s %d, want 5: the 6 recommended at 121 s is within 10 minutes", got)
	}
	// 10 minutes after the last high recommendation (121 s) only low ones
	// remain: down by one pod per 5 minutes, never below min.
	if got := a.decide(at(722), 5, 1000); got != 4 {
		t.Fatalf("at 722 s %d, want 4", got)
	}
	if got := a.decide(at(800), 4, 1250); got != 4 {
		t.Fatalf("at 800 s %d, want 4 (one pod per 5 minutes)", got)
	}
	if got := a.decide(at(1023), 4, 1250); got != 3 {
		t.Fatalf("at 1023 s %d, want 3", got)
	}
	if got := a.decide(at(1400), 3, 10); got != 3 {
		t.Fatalf("at 1400 s %d, want 3 (minReplicas)", got)
	}
}

func TestAutoscalerDefaultBehaviour(t *testing.T) {
	h := &autoscalingv2.HorizontalPodAutoscaler{}
	h.Spec.MaxReplicas = 20
	h.Spec.Metrics = []autoscalingv2.MetricSpec{{Type: autoscalingv2.PodsMetricSourceType, Pods: &autoscalingv2.PodsMetricSource{}}}
	spec, err := hpaFrom(h)
	if err == nil {
		t.Fatalf("a Pods metric without an AverageValue target accepted: %+v", spec)
	}
	spec = &hpaSpec{MinReplicas: 1, MaxReplicas: 20, Target: 100}
	spec.Up = rulesFrom(nil, 0, []hpaPolicy{{Percent: true, Value: 100, Period: 15 * time.Second}, {Value: 4, Period: 15 * time.Second}})
	spec.Down = rulesFrom(nil, 300*time.Second, []hpaPolicy{{Percent: true, Value: 100, Period: 15 * time.Second}})
	a := newAutoscaler(*spec)
	// Defaults: up by max(100 %, 4 pods) per 15 s: from 2, at most 6.
	if got := a.decide(time.Now(), 2, 1000); got != 6 {
		t.Errorf("default scale-up from 2 wanting 20: %d, want 6", got)
	}
}
