package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	kindv1alpha4 "sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/yaml"
)

// TestManifestsApply applies every folder of deploy/ to the real API server
// with server-side apply, as `kubectl apply --server-side -k` does, and
// reads every object back: the ServiceMonitor, PrometheusRule and
// ScaledObject against the real CRDs of their projects. The folders go into
// a namespace of their own (an overlay with `namespace:`), so the test never
// touches a kshard-system of an existing cluster.
func TestManifestsApply(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := uniqueName("kshard-apply")
	createNamespace(ctx, t, c, ns, nil)
	var applied []*unstructured.Unstructured
	t.Cleanup(func() { remove(context.Background(), t, c, applied) })
	for _, folder := range folders {
		t.Run(folder, func(t *testing.T) {
			objs := buildInNamespace(t, folder, ns)
			if len(objs) == 0 {
				t.Fatalf("%s builds to nothing", folder)
			}
			for _, o := range byKind(objs, "Service") {
				// deploy/node fixes its etcd's cluster IP in the node's
				// Service range (TestNodeConfigEtcd), outside this API
				// server's.
				unstructured.RemoveNestedField(o.Object, "spec", "clusterIP")
			}
			apply(ctx, t, c, objs)
			applied = append(applied, objs...)
		})
	}
}

// TestKubectlKustomize builds each folder with kubectl, when it is
// installed, and checks that it yields the same objects as the in-process
// build (kubectl embeds its own kustomize version).
func TestKubectlKustomize(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not on PATH; the in-process kustomize build of TestManifestsApply still ran")
	}
	for _, folder := range folders {
		t.Run(folder, func(t *testing.T) {
			out, err := exec.Command(kubectl, "kustomize", filepath.Join(deployDir(t), folder)).Output()
			if err != nil {
				var exit *exec.ExitError
				if errors.As(err, &exit) {
					t.Fatalf("kubectl kustomize %s: %v\n%s", folder, err, exit.Stderr)
				}
				t.Fatal(err)
			}
			built := build(t, folder)
			clusterScoped := map[string]bool{}
			for _, o := range built {
				if o.GetNamespace() == "" {
					clusterScoped[o.GetKind()] = true
				}
			}
			kubectlBuilt := decodeAll(t, out)
			for _, o := range kubectlBuilt {
				// kubectl's kustomize (v5.5.0 in kubectl 1.32) does not know
				// that ValidatingAdmissionPolicies are cluster-scoped and
				// gives them the kustomization's namespace, which the API
				// server drops.
				if clusterScoped[o.GetKind()] {
					o.SetNamespace("")
				}
			}
			got := identities(t, kubectlBuilt)
			want := identities(t, built)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("kubectl kustomize %s built %v, the in-process build %v", folder, got, want)
			}
		})
	}
}

func decodeAll(t testing.TB, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if m != nil {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

func identities(t testing.TB, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var ids []string
	for _, o := range objs {
		ids = append(ids, o.GetAPIVersion()+" "+describe(o))
	}
	sort.Strings(ids)
	return ids
}

// TestKindCluster decodes the kind cluster configuration strictly with
// kind's own types (an unknown or misspelt field fails, as `kind create
// cluster` fails), and checks that the kind overlay runs the image that
// `make image` builds and `make kind-load` loads, never pulled, and reaches
// the config center it deploys.
func TestKindCluster(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(deployDir(t), "kind", "cluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cluster kindv1alpha4.Cluster
	dec := yamlv3.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&cluster); err != nil {
		t.Fatalf("kind/cluster.yaml: %v", err)
	}
	if cluster.APIVersion != "kind.x-k8s.io/v1alpha4" || cluster.Kind != "Cluster" {
		t.Fatalf("kind/cluster.yaml is %s %s, want kind.x-k8s.io/v1alpha4 Cluster", cluster.APIVersion, cluster.Kind)
	}
	roles := map[kindv1alpha4.NodeRole]int{}
	for _, n := range cluster.Nodes {
		roles[n.Role]++
	}
	if roles[kindv1alpha4.ControlPlaneRole] != 1 || roles[kindv1alpha4.WorkerRole] < 1 {
		t.Errorf("kind/cluster.yaml nodes %v: want one control plane and workers", roles)
	}

	makefile, err := os.ReadFile(filepath.Join(deployDir(t), "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	image := makeVariable(t, makefile, "IMAGE")
	if name := makeVariable(t, makefile, "KIND_CLUSTER"); name != cluster.Name {
		t.Errorf("Makefile KIND_CLUSTER=%s, kind/cluster.yaml names %s", name, cluster.Name)
	}

	objs := build(t, "kind")
	var sts, etcd appsv1.StatefulSet
	fromUnstructured(t, byName(t, objs, "StatefulSet", "kshard"), &sts)
	if r := sts.Spec.Replicas; r == nil || *r != 3 {
		t.Errorf("kind overlay replicas %v, want 3", r)
	}
	for _, c := range sts.Spec.Template.Spec.Containers {
		if c.Image != image || c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("container %s runs %s (pull %s), want %s (IfNotPresent): the image make kind-load loads", c.Name, c.Image, c.ImagePullPolicy, image)
		}
	}
	// The replicas reach the overlay's own etcd by its Service's name, over
	// TLS with the client certificate of the Secret hack/etcdcert writes,
	// which names that Service.
	fromUnstructured(t, byName(t, objs, "StatefulSet", "config-etcd"), &etcd)
	var svc corev1.Service
	fromUnstructured(t, byName(t, objs, "Service", "config-etcd"), &svc)
	checkEtcdClient(t, sts, etcd, fmt.Sprintf("https://%s.%s.svc:%d", svc.Name, svc.Namespace, portOf(svc)))
}

// checkEtcdClient: the replicas point at the etcd at servers with the CA
// and client certificate of the Secret the etcd trusts, and the etcd demands
// a client certificate.
func checkEtcdClient(t *testing.T, replicas, etcd appsv1.StatefulSet, servers string) {
	t.Helper()
	c := replicas.Spec.Template.Spec.Containers[0]
	var got string
	for _, e := range c.Env {
		if e.Name == "ETCD_SERVERS" {
			got = e.Value
		}
	}
	if got != servers {
		t.Errorf("ETCD_SERVERS=%q, want the overlay's etcd %q", got, servers)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	secrets := map[string]string{}
	for _, v := range replicas.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret.SecretName
		}
	}
	var dir string
	for vol, secret := range secrets {
		if secret == "kshard-etcd-client" {
			dir = mounts[vol]
		}
	}
	if dir == "" {
		t.Fatalf("the replicas do not mount Secret kshard-etcd-client (volumes %v, mounts %v)", secrets, mounts)
	}
	for _, want := range []string{"--etcd-cafile=" + dir + "/ca.crt", "--etcd-certfile=" + dir + "/tls.crt", "--etcd-keyfile=" + dir + "/tls.key"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("replica args %v lack %s", c.Args, want)
		}
	}
	if args := etcd.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--client-cert-auth") {
		t.Errorf("the etcd's args %v lack --client-cert-auth: it would serve any client", args)
	}
}

func portOf(svc corev1.Service) int32 {
	if len(svc.Spec.Ports) == 0 {
		return 0
	}
	return svc.Spec.Ports[0].Port
}

func makeVariable(t testing.TB, makefile []byte, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + ` \?= (\S+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatalf("Makefile sets no %s", name)
	}
	return string(m[1])
}

func fromUnstructured(t testing.TB, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s: %v", describe(u), err)
	}
}

// TestCRDFolderComplete checks that deploy/crd/kustomization.yaml lists
// every CRD that `make manifests` generated there, so the base installs
// them all.
func TestCRDFolderComplete(t *testing.T) {
	dir := filepath.Join(deployDir(t), "crd")
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		if name != "kustomization.yaml" && !slices.Contains(k.Resources, name) {
			t.Errorf("deploy/crd/%s is not listed in deploy/crd/kustomization.yaml", name)
		}
	}
}

// TestAutoscalingAlternativesAgree keeps the prometheus-adapter HPA and the
// KEDA ScaledObject the same autoscaler: same target, bounds, per-replica
// threshold, scaling behaviour, and the same metric.
func TestAutoscalingAlternativesAgree(t *testing.T) {
	var hpa autoscalingv2.HorizontalPodAutoscaler
	objs := build(t, "autoscaling")
	fromUnstructured(t, byKind(objs, "HorizontalPodAutoscaler")[0], &hpa)
	so := byKind(build(t, "autoscaling/keda"), "ScaledObject")[0]

	base := build(t, "base")
	sts := byKind(base, "StatefulSet")[0]
	if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "StatefulSet" || ref.Name != sts.GetName() {
		t.Errorf("the HPA scales %s %s, not the base's StatefulSet %s", ref.Kind, ref.Name, sts.GetName())
	}
	if ref, _, _ := unstructured.NestedString(so.Object, "spec", "scaleTargetRef", "name"); ref != sts.GetName() {
		t.Errorf("the ScaledObject scales %s, not the base's StatefulSet %s", ref, sts.GetName())
	}
	if hpa.Spec.Behavior == nil || hpa.Spec.Behavior.ScaleDown == nil || hpa.Spec.Behavior.ScaleDown.StabilizationWindowSeconds == nil ||
		*hpa.Spec.Behavior.ScaleDown.StabilizationWindowSeconds < 300 {
		t.Errorf("the HPA needs a scale-down stabilization window of minutes, so that a restart or a handover does not scale down: %+v", hpa.Spec.Behavior)
	}

	kedaBehavior, _, _ := unstructured.NestedMap(so.Object, "spec", "advanced", "horizontalPodAutoscalerConfig", "behavior")
	hpaBehavior, err := runtime.DefaultUnstructuredConverter.ToUnstructured(hpa.Spec.Behavior)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalize(t, kedaBehavior), normalize(t, hpaBehavior)) {
		t.Errorf("scaling behaviour differs:\n  HPA  %v\n  KEDA %v", hpaBehavior, kedaBehavior)
	}
	minReplicas, _, _ := unstructured.NestedFieldNoCopy(so.Object, "spec", "minReplicaCount")
	maxReplicas, _, _ := unstructured.NestedFieldNoCopy(so.Object, "spec", "maxReplicaCount")
	if hpa.Spec.MinReplicas == nil || float64(*hpa.Spec.MinReplicas) != minReplicas || float64(hpa.Spec.MaxReplicas) != maxReplicas {
		t.Errorf("replica bounds differ: HPA %d..%d, KEDA %v..%v", ptr.Deref(hpa.Spec.MinReplicas, 0), hpa.Spec.MaxReplicas, minReplicas, maxReplicas)
	}

	metric := hpa.Spec.Metrics[0]
	if metric.Type != autoscalingv2.PodsMetricSourceType || metric.Pods.Target.Type != autoscalingv2.AverageValueMetricType {
		t.Fatalf("the HPA's metric is %s/%s, want a Pods metric with an average value", metric.Type, metric.Pods.Target.Type)
	}
	triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	trigger := triggers[0].(map[string]any)
	meta := trigger["metadata"].(map[string]any)
	threshold, err := resource.ParseQuantity(fmt.Sprint(meta["threshold"]))
	if err != nil || threshold.Cmp(*metric.Pods.Target.AverageValue) != 0 || trigger["metricType"] != "AverageValue" {
		t.Errorf("per-replica threshold differs: HPA %s, KEDA %v (%v)", metric.Pods.Target.AverageValue, threshold, trigger["metricType"])
	}

	// prometheus-adapter serves the HPA's metric from the series KEDA sums.
	var adapter corev1.ConfigMap
	fromUnstructured(t, byKind(objs, "ConfigMap")[0], &adapter)
	var rules struct {
		Rules []struct {
			SeriesQuery  string `json:"seriesQuery"`
			MetricsQuery string `json:"metricsQuery"`
			Resources    struct {
				Overrides map[string]struct {
					Resource string `json:"resource"`
				} `json:"overrides"`
			} `json:"resources"`
			Name struct {
				Matches string `json:"matches"`
				As      string `json:"as"`
			} `json:"name"`
		} `json:"rules"`
	}
	if err := yaml.UnmarshalStrict([]byte(adapter.Data["config.yaml"]), &rules); err != nil {
		t.Fatalf("prometheus-adapter rules: %v", err)
	}
	r := rules.Rules[0]
	series := regexp.MustCompile(`^[a-z_]+`).FindString(r.SeriesQuery)
	if r.Name.As != metric.Pods.Metric.Name || !regexp.MustCompile(r.Name.Matches).MatchString(series) {
		t.Errorf("prometheus-adapter serves %s from %s, the HPA asks for %s", r.Name.As, series, metric.Pods.Metric.Name)
	}
	if r.Resources.Overrides["pod"].Resource != "pod" || r.Resources.Overrides["namespace"].Resource != "namespace" || !strings.Contains(r.MetricsQuery, "<<.GroupBy>>") {
		t.Errorf("prometheus-adapter rule must map namespace and pod and group by them: %+v", r)
	}
	if q, _ := meta["query"].(string); !strings.Contains(q, series+"{") {
		t.Errorf("KEDA queries %q, not the adapter's series %s", q, series)
	}

	// Without Prometheus: the same HPA, without the prometheus-adapter rule,
	// and kshard-metrics-adapter serving its metric from the same series.
	withAdapter := build(t, "autoscaling-adapter")
	var hpa2 autoscalingv2.HorizontalPodAutoscaler
	fromUnstructured(t, byKind(withAdapter, "HorizontalPodAutoscaler")[0], &hpa2)
	if !reflect.DeepEqual(hpa2, hpa) {
		t.Errorf("autoscaling-adapter's HPA differs from autoscaling's:\n  %+v\n  %+v", hpa2.Spec, hpa.Spec)
	}
	if cms := byKind(withAdapter, "ConfigMap"); len(cms) != 0 {
		t.Errorf("autoscaling-adapter keeps the prometheus-adapter rule %s", describe(cms[0]))
	}
	args := adapterArgs(t, withAdapter)
	if args["--metric"] != metric.Pods.Metric.Name || args["--source-metric"] != series {
		t.Errorf("kshard-metrics-adapter serves %s from %s; the HPA asks for %s, prometheus-adapter sums %s",
			args["--metric"], args["--source-metric"], metric.Pods.Metric.Name, series)
	}
	var replicas appsv1.StatefulSet
	fromUnstructured(t, sts, &replicas)
	sel, err := metav1.LabelSelectorAsSelector(replicas.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	podSel, err := labels.Parse(args["--pod-selector"])
	if err != nil || !podSel.Matches(labels.Set(replicas.Spec.Template.Labels)) || sel.String() != podSel.String() {
		t.Errorf("kshard-metrics-adapter --pod-selector=%s, the StatefulSet selects %s", args["--pod-selector"], sel)
	}
	if want := containerPort(replicas.Spec.Template.Spec.Containers[0], "https"); args["--scrape-port"] != fmt.Sprint(want) {
		t.Errorf("kshard-metrics-adapter --scrape-port=%s, the replicas serve metrics on %d", args["--scrape-port"], want)
	}
}

func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// adapterArgs reads the kshard-metrics-adapter container's --flag=value
// arguments (the last of a repeated flag wins, as for the binary).
func adapterArgs(t *testing.T, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	for _, o := range byKind(objs, "Deployment") {
		if o.GetName() != "kshard-metrics-adapter" {
			continue
		}
		var dep appsv1.Deployment
		fromUnstructured(t, o, &dep)
		c := dep.Spec.Template.Spec.Containers[0]
		if len(c.Command) != 1 || c.Command[0] != "/kshard-metrics-adapter" {
			t.Errorf("the adapter's container runs %v", c.Command)
		}
		args := map[string]string{}
		for _, a := range c.Args {
			k, v, _ := strings.Cut(a, "=")
			args[k] = v
		}
		return args
	}
	t.Fatal("no kshard-metrics-adapter Deployment")
	return nil
}

// TestDashboard checks that the Grafana dashboard is valid JSON in a
// ConfigMap the Grafana sidecar loads, with the panels the runbook refers to.
func TestDashboard(t *testing.T) {
	var dashboards []*unstructured.Unstructured
	for _, cm := range byKind(build(t, "monitoring"), "ConfigMap") {
		if cm.GetLabels()["grafana_dashboard"] == "1" {
			dashboards = append(dashboards, cm)
		}
	}
	if len(dashboards) != 1 {
		t.Fatalf("want one ConfigMap labelled grafana_dashboard=1, got %d", len(dashboards))
	}
	data, _, _ := unstructured.NestedStringMap(dashboards[0].Object, "data")
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(data["kshard-dashboard.json"]), &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	titles := map[string]string{}
	for _, p := range dash.Panels {
		var exprs []string
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
		}
		titles[p.Title] = strings.Join(exprs, " ")
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
	}
	for title, metric := range map[string]string{
		"Shards owned per replica": "kshard_shards_owned",
		"Unowned shards":           "kshard_unowned_shards",
		"Objects per replica":      "kshard_shard_objects",
		"Reconcile rate":           "controller_runtime_reconcile_total",
		"Reconcile latency":        "controller_runtime_reconcile_time_seconds_bucket",
		"Cache hit ratio":          "kshard_externalcache_requests_total",
		"External calls by code":   "kshard_external_calls_total",
	} {
		if !strings.Contains(titles[title], metric) {
			t.Errorf("dashboard panel %q should chart %s; it queries %q", title, metric, titles[title])
		}
	}
}

// TestMemoryLimitReachesReplica: the base's kshard container has a memory
// limit and hands it to the replica (MEMORY_LIMIT from the downward API,
// read by --memory-limit), which sizes the Go soft limit and the external
// cache from it.
func TestMemoryLimitReachesReplica(t *testing.T) {
	sts := byKind(build(t, "base"), "StatefulSet")
	if len(sts) != 1 {
		t.Fatalf("%d StatefulSets in the base", len(sts))
	}
	containers, _, _ := unstructured.NestedSlice(sts[0].Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	limit, _, _ := unstructured.NestedString(c, "resources", "limits", "memory")
	if limit == "" {
		t.Fatal("the kshard container has no memory limit")
	}
	env, _, _ := unstructured.NestedSlice(c, "env")
	for _, e := range env {
		m := e.(map[string]any)
		if m["name"] != "MEMORY_LIMIT" {
			continue
		}
		res, _, _ := unstructured.NestedString(m, "valueFrom", "resourceFieldRef", "resource")
		container, _, _ := unstructured.NestedString(m, "valueFrom", "resourceFieldRef", "containerName")
		if res != "limits.memory" || container != c["name"] {
			t.Fatalf("MEMORY_LIMIT comes from %s of container %s, want limits.memory of %s", res, container, c["name"])
		}
		return
	}
	t.Fatal("the kshard container has no MEMORY_LIMIT")
}
