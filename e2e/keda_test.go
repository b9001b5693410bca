package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
)

// KEDA on the node (e2e/keda) and the shipped ScaledObject (e2e/scaledobject).
const (
	kedaNamespace = "keda"
	// kedaHPA is the HPA KEDA makes for ScaledObject kshard.
	kedaHPA = "keda-hpa-" + statefulSet
	// shippedPrometheus is the trigger's serverAddress as shipped: the
	// Service kube-prometheus names, which the DNS-less node cannot resolve.
	shippedPrometheus = "http://prometheus-k8s.monitoring.svc:9090"
)

// testKEDA: the HPA that KEDA makes for deploy/autoscaling/keda's
// ScaledObject scales the StatefulSet on the trigger's query, which KEDA's
// operator sends to the node's Prometheus (e2e/scaledobject's threshold and
// windows): 3 → 5 on the 1,000 objects the hpa step left, back to 3 once
// 500 remain. The value KEDA serves through the external metrics API must be
// what Prometheus answers to the same query, and the objects there.
func testKEDA(t *testing.T, s *suite, rec *recorder) {
	ctx := stepContext(t, 20*time.Minute)
	start := time.Now()
	s.run(ctx, t, "apply", "--server-side", "--force-conflicts", "-k", filepath.Join(s.repo, "e2e", "keda"))
	for _, d := range []string{"keda-operator", "keda-metrics-apiserver"} {
		s.run(ctx, t, "-n", kedaNamespace, "rollout", "status", "deployment/"+d, "--timeout=5m")
	}
	s.run(ctx, t, "wait", "apiservice/v1beta1.external.metrics.k8s.io", "--for=condition=Available", "--timeout=5m")
	t.Logf("KEDA running, its external metrics API available, %s after the apply", time.Since(start).Round(time.Second))

	manifest := s.scaledObject(ctx, t)
	t.Cleanup(func() {
		// The StatefulSet is the suite's again: KEDA deletes its HPA with
		// the ScaledObject.
		ctx := context.Background()
		if _, err := s.runErr(ctx, "delete", "-f", manifest, "--ignore-not-found", "--wait=true", "--timeout=5m"); err != nil {
			t.Errorf("deleting the ScaledObject: %v", err)
		}
		err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := s.cs.AutoscalingV2().HorizontalPodAutoscalers(systemNamespace).Get(ctx, kedaHPA, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Errorf("KEDA's HPA %s still there after its ScaledObject went: %v", kedaHPA, err)
		}
	})
	applied := time.Now()
	s.run(ctx, t, "apply", "--server-side", "-f", manifest)
	s.run(ctx, t, "-n", systemNamespace, "wait", "scaledobject/"+statefulSet, "--for=condition=Ready", "--timeout=5m")

	// The value as the HPA controller asks KEDA for it, and as Prometheus
	// answers the trigger's query: every object, once.
	const want = objects / 2
	query := s.kedaQuery(t)
	var served, answered int64
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if served, err = s.externalMetric(ctx); err != nil {
			return false, nil
		}
		answered = -1
		if got, err := s.promQuery(ctx, query); err == nil && len(got) == 1 {
			answered, _ = strconv.ParseInt(fmt.Sprint(got[0].Value[1]), 10, 64)
		}
		return served == want && answered == want, nil
	})
	if err != nil {
		t.Fatalf("external metrics API serves %d, Prometheus answers %d, want %d objects: %v; %s", served, answered, want, err, s.hpaStatus(ctx, kedaHPA))
	}
	t.Logf("KEDA serves the trigger's value %d (Prometheus answers the same), %s after the ScaledObject was applied", served, time.Since(applied).Round(time.Second))
	s.autoscale(ctx, t, rec, kedaHPA, 1, applied, "the ScaledObject was applied")
}

// scaledObject writes e2e/scaledobject's ScaledObject with the trigger
// pointed at the node's Prometheus by ClusterIP, and returns its path.
func (s *suite) scaledObject(ctx context.Context, t *testing.T) string {
	t.Helper()
	svc, err := s.cs.CoreV1().Services(monitoringNamespace).Get(ctx, prometheusService, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the node's Prometheus Service: %v", err)
	}
	rendered := s.run(ctx, t, "kustomize", filepath.Join(s.repo, "e2e", "scaledobject"))
	if !strings.Contains(rendered, shippedPrometheus) {
		t.Fatalf("e2e/scaledobject does not address %s:\n%s", shippedPrometheus, rendered)
	}
	rendered = strings.ReplaceAll(rendered, shippedPrometheus, fmt.Sprintf("http://%s:9090", svc.Spec.ClusterIP))
	path := filepath.Join(t.TempDir(), "scaledobject.yaml")
	if err := os.WriteFile(path, []byte(rendered), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// kedaQuery is the trigger's query of the shipped ScaledObject.
func (s *suite) kedaQuery(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.repo, "deploy", "autoscaling", "keda", "scaledobject.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if q, ok := strings.CutPrefix(strings.TrimSpace(line), "query: "); ok {
			return q
		}
	}
	t.Fatal("deploy/autoscaling/keda/scaledobject.yaml has no query")
	return ""
}

// externalMetric reads the value of KEDA's HPA's external metric through the
// external metrics API, as the HPA controller does.
func (s *suite) externalMetric(ctx context.Context) (int64, error) {
	hpa, err := s.cs.AutoscalingV2().HorizontalPodAutoscalers(systemNamespace).Get(ctx, kedaHPA, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if len(hpa.Spec.Metrics) != 1 || hpa.Spec.Metrics[0].Type != autoscalingv2.ExternalMetricSourceType {
		return 0, fmt.Errorf("HPA %s: metrics %v, want one external metric", kedaHPA, hpa.Spec.Metrics)
	}
	m := hpa.Spec.Metrics[0].External.Metric
	sel, err := metav1.LabelSelectorAsSelector(m.Selector)
	if err != nil {
		return 0, err
	}
	if m.Selector == nil {
		sel = labels.Everything()
	}
	raw, err := s.cs.Discovery().RESTClient().Get().
		AbsPath("/apis/external.metrics.k8s.io/v1beta1/namespaces", systemNamespace, m.Name).
		Param("labelSelector", sel.String()).DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	var list struct {
		Items []struct {
			Value resource.Quantity `json:"value"`
		} `json:"items"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return 0, fmt.Errorf("decoding the external metrics API's answer: %w", err)
	}
	if len(list.Items) != 1 {
		return 0, fmt.Errorf("external metric %s: %d values, want 1", m.Name, len(list.Items))
	}
	return list.Items[0].Value.Value(), nil
}
