package deploy_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	cmv1beta2 "k8s.io/metrics/pkg/apis/custom_metrics/v1beta2"
	custommetricsclient "k8s.io/metrics/pkg/client/custom_metrics"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/promtext"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// TestMetricsAdapterServesTheHPA runs the real kshard-metrics-adapter with
// nothing but deploy/metrics-adapter's ServiceAccount and RBAC, and the
// Deployment's flags with its metrics-cert component's, against a real
// replica (the base's ServiceAccount, secure metrics on a certificate for
// the ServiceMonitor's server name) that holds a ConfigBinding and whose
// Pod object points at it. The HPA controller's identity,
// kube-system/horizontal-pod-autoscaler, reads kshard_objects_held for the
// pod (what the replica's own kshard_shard_objects sum to) from the adapter
// directly, by selector and by name, and through the API server's
// aggregation layer (the shipped APIService) with the HPA controller's own
// custom metrics client; an unbound identity is refused; and no request of
// the adapter was forbidden.
func TestMetricsAdapterServesTheHPA(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c)
	var rbac []*unstructured.Unstructured
	built := buildInNamespace(t, "metrics-adapter", ns, "metrics-adapter/metrics-cert")
	for _, o := range built {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			rbac = append(rbac, o)
		}
	}
	apply(ctx, t, c, rbac)
	t.Cleanup(func() { remove(context.Background(), t, c, rbac) })

	// A replica holding one ConfigBinding.
	cc := startConfigCenter(ctx, t, configcenter.SeedOptions{Domains: 1, KeysPerDomain: 1, ValueBytes: 16})
	_, metrics := runReplica(ctx, t, ns, cc.Endpoint())
	app := uniqueName("app")
	createNamespace(ctx, t, c, app, targets)
	cb := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: "checkout"},
		Spec: configv1alpha1.ConfigBindingSpec{
			Domain: configcenter.SeedDomain(0), Keys: []configv1alpha1.ConfigKey{"key-0"},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "checkout-config"},
		},
	}
	if err := c.Create(ctx, cb); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, 2*time.Minute, "ConfigBinding Ready", func() error {
		var got configv1alpha1.ConfigBinding
		if err := c.Get(ctx, client.ObjectKeyFromObject(cb), &got); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, configbinding.ConditionReady) {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})

	// The replica's Pod, as the StatefulSet would make it, at the replica's
	// address: the adapter scrapes https://<pod IP>:<--scrape-port>/metrics.
	host, port, err := net.SplitHostPort(metrics.addr)
	if err != nil {
		t.Fatal(err)
	}
	// runReplica created it (its token is bound to it).
	var sts appsv1.StatefulSet
	fromUnstructured(t, byKind(buildInNamespace(t, "base", ns), "StatefulSet")[0], &sts)
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kshard-0"}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: host, PodIPs: []corev1.PodIP{{IP: host}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatalf("setting the pod's IP: %v", err)
	}

	// The adapter, as its ServiceAccount, with the shipped flags; the test
	// only points it at this namespace, the replica's port and files.
	token := serviceAccountToken(ctx, t, ns, "kshard-metrics-adapter")
	controlplane.Eventually(t, time.Minute, "RBAC in force for the adapter", func() error {
		tc := tokenClient(t, token)
		if err := tc.List(ctx, &corev1.PodList{}, client.InNamespace(ns)); err != nil {
			return err
		}
		return tc.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "extension-apiserver-authentication"}, &corev1.ConfigMap{})
	})
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, replicaCertificate(t, metrics), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := writeKubeconfig(t, token)
	addr := controlplane.FreeAddr(t)
	_, securePort, _ := net.SplitHostPort(addr)
	var args []string
	for _, o := range byKind(built, "Deployment") {
		args = deploymentArgs(t, o)
	}
	args = append(args,
		"--namespace="+ns, "--scrape-port="+port, "--scrape-ca-file="+caFile, "--scrape-token-file="+tokenFile,
		"--bind-address=127.0.0.1", "--secure-port="+securePort, "--scrape-period=1s", "--scrape-timeout=1s",
		"--lister-kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig)
	adapter := startProcess(t, buildCommand(t, "kshard-metrics-adapter"), args...)
	insecure := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		// The adapter's certificate is self-signed; the APIService says
		// insecureSkipTLSVerify as well.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // see above
	}}
	controlplane.Eventually(t, 2*time.Minute, "adapter ready (a scrape round completed)", func() error {
		code, body, err := get(insecure, "https://"+addr+"/readyz", "")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("/readyz: %d %s", code, tail(body, 500))
		}
		return nil
	})

	// What the replica says it holds, read as Prometheus would: its
	// kshard_shard_objects summed, at least the binding above (the replica
	// watches every namespace, so other tests' bindings count too).
	scraper := bindMetricsReader(ctx, t, c, ns)
	held := func() (string, error) {
		code, body, err := metrics.scrape(scraper)
		if err != nil {
			return "", err
		}
		if code != http.StatusOK {
			return "", fmt.Errorf("scraping the replica: %d %s", code, tail(body, 300))
		}
		fams, err := promtext.Parse(strings.NewReader(body))
		if err != nil {
			return "", err
		}
		n := promtext.Sum(fams["kshard_shard_objects"])
		if n < 1 {
			return "", fmt.Errorf("the replica holds %v objects, want the binding at least", n)
		}
		return fmt.Sprint(int64(n)), nil
	}

	// The HPA controller's queries, with its identity.
	createServiceAccount(ctx, t, c, "kube-system", "horizontal-pod-autoscaler")
	hpa := serviceAccountToken(ctx, t, "kube-system", "horizontal-pod-autoscaler")
	base := "https://" + addr + "/apis/custom.metrics.k8s.io/v1beta2/namespaces/" + ns + "/pods/"
	selector := url.Values{"labelSelector": {"app.kubernetes.io/name=kshard"}}.Encode()
	for what, u := range map[string]string{"by selector": base + "*/kshard_objects_held?" + selector, "by name": base + "kshard-0/kshard_objects_held"} {
		controlplane.Eventually(t, time.Minute, "kshard_objects_held "+what, func() error {
			code, body, err := get(insecure, u, hpa)
			if err != nil {
				return err
			}
			if code != http.StatusOK {
				return fmt.Errorf("%d %s", code, tail(body, 500))
			}
			var list cmv1beta2.MetricValueList
			if err := json.Unmarshal([]byte(body), &list); err != nil {
				return fmt.Errorf("%w: %s", err, tail(body, 500))
			}
			want, err := held()
			if err != nil {
				return err
			}
			if len(list.Items) != 1 || list.Items[0].DescribedObject.Name != "kshard-0" || list.Items[0].Value.String() != want {
				return fmt.Errorf("want kshard-0 holding %s objects, got %s", want, tail(body, 500))
			}
			return nil
		})
	}

	// Through the aggregation layer, as the HPA controller reads it: the
	// shipped APIService, its Service an ExternalName for the adapter's
	// loopback address (the test API server routes no Service IPs), and
	// the custom metrics client of the HPA controller, with its identity.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kshard-metrics-adapter"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(mustAtoi(t, securePort))}}},
	}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), svc) })
	apiService := byKind(built, "APIService")[0].DeepCopy()
	for field, v := range map[string]any{"namespace": ns, "name": svc.Name, "port": float64(mustAtoi(t, securePort))} {
		if err := unstructured.SetNestedField(apiService.Object, v, "spec", "service", field); err != nil {
			t.Fatal(err)
		}
	}
	apply(ctx, t, c, []*unstructured.Unstructured{apiService})
	t.Cleanup(func() { remove(context.Background(), t, c, []*unstructured.Unstructured{apiService}) })
	controlplane.Eventually(t, 2*time.Minute, "APIService Available", func() error {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(apiService.GroupVersionKind())
		if err := c.Get(ctx, client.ObjectKeyFromObject(apiService), got); err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, cond := range conds {
			if m := cond.(map[string]any); m["type"] == "Available" && m["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", conds)
	})
	hpaConfig := tokenConfig(hpa)
	disco, err := discovery.NewDiscoveryClientForConfig(hpaConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	metricsClient := custommetricsclient.NewForConfig(hpaConfig, mapper, custommetricsclient.NewAvailableAPIsGetter(disco))
	stsSelector, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, time.Minute, "kshard_objects_held through the aggregation layer", func() error {
		list, err := metricsClient.NamespacedMetrics(ns).GetForObjects(schema.GroupKind{Kind: "Pod"}, stsSelector, "kshard_objects_held", labels.Everything())
		if err != nil {
			return err
		}
		want, err := held()
		if err != nil {
			return err
		}
		if len(list.Items) != 1 || list.Items[0].DescribedObject.Name != "kshard-0" || list.Items[0].Value.String() != want {
			return fmt.Errorf("want kshard-0 holding %s objects, got %+v", want, list.Items)
		}
		return nil
	})

	createServiceAccount(ctx, t, c, ns, "nobody")
	code, body, err := get(insecure, base+"*/kshard_objects_held?"+selector, serviceAccountToken(ctx, t, ns, "nobody"))
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusForbidden {
		t.Errorf("an unbound ServiceAccount got %d, want 403: %s", code, tail(body, 300))
	}

	for _, line := range strings.Split(adapter.output(t), "\n") {
		if strings.Contains(strings.ToLower(line), "forbidden") {
			t.Errorf("a request of the adapter was forbidden: %s", line)
		}
	}
}

// deploymentArgs is a Deployment's first container's arguments.
func deploymentArgs(t *testing.T, o *unstructured.Unstructured) []string {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	var args []string
	for _, a := range containers[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	return args
}

// replicaCertificate reads the replica's serving certificate, verified as
// the ServiceMonitor verifies it, as PEM: self-signed, it is its own CA.
func replicaCertificate(t *testing.T, m metricsEndpoint) []byte {
	t.Helper()
	conn, err := tls.Dial("tcp", m.addr, m.tls)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: conn.ConnectionState().PeerCertificates[0].Raw})
}

func get(hc *http.Client, u, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// createServiceAccount creates a ServiceAccount unless it exists, and
// deletes it at the end if it created it.
func createServiceAccount(ctx context.Context, t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	err := c.Create(ctx, sa)
	switch {
	case apierrors.IsAlreadyExists(err):
	case err != nil:
		t.Fatal(err)
	default:
		t.Cleanup(func() { _ = c.Delete(context.Background(), sa) })
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
