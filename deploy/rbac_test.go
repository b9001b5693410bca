package deploy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding/lease"
)

// installBase applies the base's ServiceAccount, RBAC and StatefulSet, with
// optional components, into a namespace of their own (the Namespace object of
// the base, renamed) and returns the namespace. The StatefulSet creates no
// pods here (there is no controller manager), but a stopping replica reads it.
func installBase(ctx context.Context, t testing.TB, c client.Client, components ...string) string {
	t.Helper()
	ns := uniqueName("kshard-rbac")
	var objs []*unstructured.Unstructured
	for _, o := range buildInNamespace(t, "base", ns, components...) {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "StatefulSet",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
			"FlowSchema", "PriorityLevelConfiguration", "Lease":
			objs = append(objs, o)
		}
	}
	apply(ctx, t, c, objs)
	t.Cleanup(func() { remove(context.Background(), t, c, objs) })
	return ns
}

// holdLease makes l's spec the Lease's, creating it if missing: the shard
// Leases ship with deploy/base (held by nobody), the others do not.
func holdLease(ctx context.Context, t testing.TB, c client.Client, l *coordinationv1.Lease) {
	t.Helper()
	err := c.Create(ctx, l.DeepCopy())
	if apierrors.IsAlreadyExists(err) {
		live := &coordinationv1.Lease{}
		if err = c.Get(ctx, client.ObjectKeyFromObject(l), live); err == nil {
			live.Labels, live.Spec = l.Labels, l.Spec
			err = c.Update(ctx, live)
		}
	}
	if err != nil {
		t.Fatalf("holding Lease %s/%s: %v", l.Namespace, l.Name, err)
	}
}

// serviceAccountToken gets a token for a ServiceAccount from the
// TokenRequest API, as the kubelet does for a pod.
func serviceAccountToken(ctx context.Context, t *testing.T, namespace, name string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// tokenConfig is a client configuration that authenticates with a bearer
// token only: no client certificate, no impersonation.
func tokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            cp.Config.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.Config.CAData},
	}
}

func tokenClient(t testing.TB, token string) client.Client {
	t.Helper()
	c, err := client.New(tokenConfig(token), client.Options{Scheme: replica.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeKubeconfig(t *testing.T, token string) string {
	t.Helper()
	return writeKubeconfigFor(t, cp.Config.Host, token)
}

// writeKubeconfigFor writes a kubeconfig for the API server at server
// (https://host:port, or host:port) with the control plane's CA.
func writeKubeconfigFor(t *testing.T, server, token string) string {
	t.Helper()
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cp.Config.CAData}
	cfg.AuthInfos["kshard"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kshard"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "kshard"}
	cfg.CurrentContext = "kshard"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// builds are the commands the package's tests run, built once per test
// binary into bin/test/children/deploy (childproc.Build says why a folder
// that stays).
var builds struct {
	mu   sync.Mutex
	bins map[string]string
}

// buildCommand builds cmd/<name> of this checkout, once per test binary.
func buildCommand(t *testing.T, name string) string {
	t.Helper()
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if bin, ok := builds.bins[name]; ok {
		return bin
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins, err := childproc.Build(context.Background(), root, filepath.Join(root, "bin", "test", "children", "deploy"), name)
	if err != nil {
		t.Fatal(err)
	}
	if builds.bins == nil {
		builds.bins = map[string]string{}
	}
	builds.bins[name] = bins[0]
	return bins[0]
}

// process is a child process whose output goes to a file.
type process struct {
	cmd  *exec.Cmd
	log  string
	done chan error
}

func startProcess(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	p := &process{log: filepath.Join(t.TempDir(), "process.log"), done: make(chan error, 1)}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait(); f.Close() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("log of %s (tail):\n%s", filepath.Base(bin), tail(p.output(t), 4000))
		}
	})
	return p
}

func (p *process) output(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// stop sends SIGTERM and waits for a clean exit.
func (p *process) stop(t *testing.T, within time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("after SIGTERM: %v", err)
		}
	case <-time.After(within):
		t.Fatalf("still running %s after SIGTERM", within)
	}
}

// metricsEndpoint is a replica's secure metrics, and the TLS a scraper
// configured as the shipped ServiceMonitor uses: the CA of the metrics
// certificate Secret and the ServiceMonitor's server name.
type metricsEndpoint struct {
	addr string
	tls  *tls.Config
}

// scrape GETs the secure metrics with a bearer token ("" for none),
// verifying the server. The client offers HTTP/2; the replica must answer
// in HTTP/1.1.
func (m metricsEndpoint) scrape(token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, "https://"+m.addr+"/metrics", nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: m.tls}}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 1 {
		return 0, "", fmt.Errorf("metrics served over %s: HTTP/2 must be off unless --enable-http2", resp.Proto)
	}
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// serviceMonitorTLS reads the shipped ServiceMonitor's TLS settings: the
// server name it verifies and the Secret whose ca.crt it trusts. It fails
// the test on insecureSkipVerify.
func serviceMonitorTLS(t *testing.T) (serverName, secret string) {
	t.Helper()
	mons := byKind(build(t, "monitoring"), "ServiceMonitor")
	if len(mons) != 1 {
		t.Fatalf("%d ServiceMonitors in deploy/monitoring", len(mons))
	}
	endpoints, _, _ := unstructured.NestedSlice(mons[0].Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor has %d endpoints", len(endpoints))
	}
	ep := endpoints[0].(map[string]any)
	if skip, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify"); skip {
		t.Fatal("the ServiceMonitor skips TLS verification")
	}
	serverName, _, _ = unstructured.NestedString(ep, "tlsConfig", "serverName")
	secret, _, _ = unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "name")
	if key, _, _ := unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "key"); serverName == "" || secret == "" || key != "ca.crt" {
		t.Fatalf("ServiceMonitor tlsConfig %v: want a serverName and the ca.crt of a Secret", ep["tlsConfig"])
	}
	return serverName, secret
}

// metricsCert writes a serving certificate for the ServiceMonitor's server
// name into a directory, as the deploy/metrics-cert component mounts one,
// and returns the directory and the TLS a scraper verifies it with.
func metricsCert(t *testing.T) (string, *tls.Config) {
	t.Helper()
	serverName, secret := serviceMonitorTLS(t)
	parts := strings.Split(serverName, ".")
	if len(parts) < 3 || parts[2] != "svc" {
		t.Fatalf("ServiceMonitor serverName %q is not <service>.<namespace>.svc", serverName)
	}
	files := generateCert(t, "-service", parts[0], "-namespace", parts[1], "-secret", secret)
	var s corev1.Secret
	if err := yaml.Unmarshal(files["secret.yaml"], &s); err != nil {
		t.Fatalf("reading the generated Secret: %v", err)
	}
	dir := t.TempDir()
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(dir, f), s.Data[f], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.Data["tls.crt"]) {
		t.Fatal("no certificate in the generated Secret")
	}
	return dir, &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12}
}

// startConfigCenter starts an etcd of the test's own as the config center,
// seeded with seed.
func startConfigCenter(ctx context.Context, t *testing.T, seed configcenter.SeedOptions) *configetcd.Server {
	t.Helper()
	cc, err := configetcd.Start(ctx, configetcd.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ec, err := cc.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	if _, err := configetcd.Seed(ctx, ec, etcdsource.DefaultPrefix, seed); err != nil {
		t.Fatal(err)
	}
	return cc
}

// runReplica starts the real kshard binary as replica kshard-0 of the
// StatefulSet in ns, authenticated only with a token of the base's
// ServiceAccount bound to its pod (podToken), serving secure metrics, and
// waits until /readyz says it runs its shards. It returns the process and
// the metrics address.
func runReplica(ctx context.Context, t *testing.T, ns, etcdServers string, extraArgs ...string) (*process, metricsEndpoint) {
	t.Helper()
	return runReplicaAs(ctx, t, ns, "kshard-0", cp.Config.Host, etcdServers, extraArgs...)
}

// runReplicaAs is runReplica for replica id, reaching the API server at
// server (a proxy's address, say).
func runReplicaAs(ctx context.Context, t *testing.T, ns, id, server, etcdServers string, extraArgs ...string) (*process, metricsEndpoint) {
	t.Helper()
	token := podToken(ctx, t, ns, id)
	// RBAC reaches the authorizer through informers: wait until it is in force.
	controlplane.Eventually(t, time.Minute, "RBAC in force for the ServiceAccount", func() error {
		return tokenClient(t, token).List(ctx, &configv1alpha1.ConfigBindingList{}, client.Limit(1))
	})
	metricsAddr, healthAddr := controlplane.FreeAddr(t), controlplane.FreeAddr(t)
	certDir, metricsTLS := metricsCert(t)
	args := append([]string{"controller",
		"--kubeconfig", writeKubeconfigFor(t, server, token),
		"--replica-id", id, "--statefulset", "kshard", "--lease-namespace", ns,
		"--etcd-servers", etcdServers,
		"--metrics-secure", "--metrics-cert-dir", certDir, "--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr}, extraArgs...)
	p := startProcess(t, buildCommand(t, "kshard"), args...)
	controlplane.Eventually(t, 2*time.Minute, "replica "+id+" ready", func() error {
		resp, err := http.Get("http://" + healthAddr + "/readyz")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("/readyz: %d %s", resp.StatusCode, b)
		}
		return nil
	})
	return p, metricsEndpoint{addr: metricsAddr, tls: metricsTLS}
}

// podToken creates the pod a StatefulSet in ns would run as replica id
// (from its template; nothing runs it here, there is no kubelet) and returns
// a token of its ServiceAccount bound to that pod, as the kubelet mounts
// one: the API server then names the pod in the token's user extras
// (authentication.kubernetes.io/pod-name), which the shard-writes policy
// checks against the shard Leases' holders.
func podToken(ctx context.Context, t testing.TB, ns, id string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	sts, err := cs.AppsV1().StatefulSets(ns).Get(ctx, "kshard", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id, Labels: sts.Spec.Template.Labels},
		Spec:       sts.Spec.Template.Spec,
	}
	pod, err = cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", ns, id, err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Pods(ns).Delete(context.Background(), id, metav1.DeleteOptions{}) })
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token bound to pod %s/%s: %v", ns, id, err)
	}
	return tr.Status.Token
}

// bindMetricsReader creates a ServiceAccount bound to the base's
// kshard-metrics-reader ClusterRole (as renamed by installBase) and returns
// a token of it: what Prometheus scrapes with.
func bindMetricsReader(ctx context.Context, t *testing.T, c client.Client, ns string) string {
	t.Helper()
	if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prometheus"}}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kshard-metrics-reader-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kshard-metrics-reader-" + ns},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "prometheus"}},
	}
	if err := c.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), binding) })
	return serviceAccountToken(ctx, t, ns, "prometheus")
}

// TestRBACSufficient runs the real kshard binary authenticated only as the
// base's ServiceAccount (a TokenRequest token in a kubeconfig), with secure
// metrics: it becomes ready, labels and reconciles a ConfigBinding to Ready,
// serves metrics to an identity bound to kshard-metrics-reader and refuses
// others, leaves the ring on a scale-down, and no request it made in its
// whole life was forbidden.
func TestRBACSufficient(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c)
	cc := startConfigCenter(ctx, t, configcenter.SeedOptions{Domains: 2, KeysPerDomain: 2, ValueBytes: 16})
	kshard, metrics := runReplica(ctx, t, ns, cc.Endpoint())

	app := uniqueName("app")
	createNamespace(ctx, t, c, app, targets)
	cb := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: "checkout"},
		Spec: configv1alpha1.ConfigBindingSpec{
			Domain: "domain-1",
			Keys:   []configv1alpha1.ConfigKey{"key-0", "key-1"},
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
		cond := meta.FindStatusCondition(got.Status.Conditions, configbinding.ConditionReady)
		if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != configbinding.ReasonSynced {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: app, Name: "checkout-config"}, &cm); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"key-0", "key-1"} {
		if want := configcenter.SeedValue("domain-1", key, 16); cm.Data[key] != want {
			t.Errorf("ConfigMap %s = %q, config center has %q", key, cm.Data[key], want)
		}
	}

	// A binding in a namespace that has not opted in says why its
	// ConfigMap is not written, and heals once the namespace opts in.
	closed := uniqueName("closed")
	createNamespace(ctx, t, c, closed, nil)
	refused := cb.DeepCopy()
	refused.ObjectMeta = metav1.ObjectMeta{Namespace: closed, Name: "checkout"}
	if err := c.Create(ctx, refused); err != nil {
		t.Fatal(err)
	}
	readyReason := func(want string) func() error {
		return func() error {
			var got configv1alpha1.ConfigBinding
			if err := c.Get(ctx, client.ObjectKeyFromObject(refused), &got); err != nil {
				return err
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, configbinding.ConditionReady)
			if cond == nil || cond.Reason != want || cond.ObservedGeneration != got.Generation {
				return fmt.Errorf("status %+v", got.Status)
			}
			if want == configbinding.ReasonTargetForbidden && !strings.Contains(cond.Message, "kshard.dev/targets=enabled") {
				return fmt.Errorf("the condition does not say how to opt in: %s", cond.Message)
			}
			return nil
		}
	}
	controlplane.Eventually(t, 2*time.Minute, "binding in a closed namespace says TargetForbidden", readyReason(configbinding.ReasonTargetForbidden))
	ns2 := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: closed}}
	if err := c.Patch(ctx, ns2, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"kshard.dev/targets":"enabled"}}}`))); err != nil {
		t.Fatal(err)
	}
	if err := c.Patch(ctx, refused, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"keys":["key-0"]}}`))); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, 2*time.Minute, "the binding heals once its namespace opts in", readyReason(configbinding.ReasonSynced))

	// Secure metrics: a scraper bound to kshard-metrics-reader reads them;
	// an authenticated identity without the binding and an anonymous caller
	// do not.
	scraper := bindMetricsReader(ctx, t, c, ns)
	if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nobody"}}); err != nil {
		t.Fatal(err)
	}
	nobody := serviceAccountToken(ctx, t, ns, "nobody")
	want := referencedMetrics(t)
	controlplane.Eventually(t, time.Minute, "metrics served to the bound scraper, with every metric the alerts, dashboard and autoscalers use", func() error {
		code, body, err := metrics.scrape(scraper)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("scraper got %d: %s", code, tail(body, 300))
		}
		var missing []string
		for _, name := range want {
			if !strings.Contains(body, "\n"+name+"{") && !strings.Contains(body, "\n"+name+" ") {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("not exported: %v", missing)
		}
		return nil
	})
	for who, tok := range map[string]string{"an unbound ServiceAccount": nobody, "an anonymous caller": ""} {
		code, body, err := metrics.scrape(tok)
		if err != nil {
			t.Fatal(err)
		}
		if code != http.StatusForbidden && code != http.StatusUnauthorized {
			t.Errorf("%s got %d from /metrics, want 401 or 403: %s", who, code, tail(body, 200))
		}
	}

	// Scale the StatefulSet to zero, then stop the replica: it reads the
	// StatefulSet, sees a scale-down, hands its shards over and leaves the
	// ring, deleting its member Lease.
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kshard"}}
	if err := c.Patch(ctx, sts, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`))); err != nil {
		t.Fatal(err)
	}
	kshard.stop(t, 2*time.Minute)
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		if l.Name == lease.MemberName("kshard", "kshard-0") {
			t.Errorf("the replica left the ring but its member Lease %s is still there", l.Name)
		}
		if h := lease.HolderReplica(ptr.Deref(l.Spec.HolderIdentity, "")); strings.HasPrefix(l.Name, "kshard-shard-") && h != "" {
			t.Errorf("shard Lease %s is still held by %q after the replica left", l.Name, h)
		}
	}
	for _, line := range strings.Split(kshard.output(t), "\n") {
		if strings.Contains(strings.ToLower(line), "forbidden") && !strings.Contains(line, closed) {
			t.Errorf("a request of the replica was forbidden: %s", line)
		}
	}
}

// targets is the label by which a namespace lets kshard write ConfigMaps
// (deploy/base/configmap-policy.yaml).
var targets = map[string]string{"kshard.dev/targets": "enabled"}

// TestRBACNotExcessive acts as the base's ServiceAccount (its own token) and
// checks what it must not do: read Secrets, list Pods cluster-wide, write
// Leases outside its namespace, delete what it only applies, or write any
// ConfigMap but its own targets in namespaces that opted in (the admission
// policy). Two allowed
// calls first show that the token works, so the denials mean something.
func TestRBACNotExcessive(t *testing.T) {
	ctx := context.Background()
	admin := adminClient(t)
	ns := installBase(ctx, t, admin)
	other := uniqueName("other")
	createNamespace(ctx, t, admin, other, nil)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"}, StringData: map[string]string{"k": "v"}}
	foreignLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "kshard-shard-0"}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "someones-config"}}
	for _, o := range []client.Object{secret, foreignLease, cm} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	sa := tokenClient(t, serviceAccountToken(ctx, t, ns, "kshard"))

	controlplane.Eventually(t, time.Minute, "the ServiceAccount may write Leases in its namespace", func() error {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: uniqueName("probe")}}
		return sa.Create(ctx, l)
	})
	if err := sa.List(ctx, &configv1alpha1.ConfigBindingList{}); err != nil {
		t.Fatalf("the ServiceAccount may list ConfigBindings in every namespace: %v", err)
	}

	// ConfigMap writes: only kshard's own, in namespaces that opted in
	// (the admission policy; RBAC alone allows them everywhere). Dry runs:
	// admission decides them as it would the real writes.
	open := uniqueName("open")
	createNamespace(ctx, t, admin, open, targets)
	someones := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: open, Name: "someones-config"}, Data: map[string]string{"k": "v"}}
	if err := admin.Create(ctx, someones); err != nil {
		t.Fatal(err)
	}
	managed := func(namespace string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "kshard-target",
			Labels: map[string]string{"app.kubernetes.io/managed-by": "kshard"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: configv1alpha1.GroupVersion.String(), Kind: "ConfigBinding",
				Name: "b", UID: "00000000-0000-0000-0000-000000000001", Controller: ptr.To(true)}}}}
	}
	controlplane.Eventually(t, time.Minute, "the admission policies in force: a ConfigMap in kube-system, and one in no shard, refused", func() error {
		if err := sa.Create(ctx, managed("kube-system"), client.DryRunAll); !apierrors.IsForbidden(err) {
			return fmt.Errorf("in kube-system: got %v, want Forbidden", err)
		}
		if err := sa.Create(ctx, managed(open), client.DryRunAll); !apierrors.IsForbidden(err) {
			return fmt.Errorf("in no shard: got %v, want Forbidden", err)
		}
		return nil
	})
	kubeSystem := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: uniqueName("kshard-probe")}}
	if err := admin.Create(ctx, kubeSystem); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), kubeSystem) })
	takeover := someones.DeepCopy()
	takeover.Labels = managed(open).Labels
	takeover.OwnerReferences = managed(open).OwnerReferences

	lease := func() *coordinationv1.Lease { return foreignLease.DeepCopy() }
	for what, call := range map[string]func() error{
		"get a Secret in its own namespace": func() error { return sa.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.Secret{}) },
		"list Secrets in its own namespace": func() error { return sa.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)) },
		"list Secrets cluster-wide":         func() error { return sa.List(ctx, &corev1.SecretList{}) },
		"list Pods cluster-wide":            func() error { return sa.List(ctx, &corev1.PodList{}) },
		"create a Lease outside its namespace": func() error {
			return sa.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "x"}})
		},
		"update a Lease outside its namespace": func() error { return sa.Update(ctx, lease()) },
		"delete a Lease outside its namespace": func() error { return sa.Delete(ctx, lease()) },
		"list Leases cluster-wide":             func() error { return sa.List(ctx, &coordinationv1.LeaseList{}) },
		"delete a ConfigMap":                   func() error { return sa.Delete(ctx, cm.DeepCopy()) },
		"change a ConfigMap in kube-system": func() error {
			return sa.Patch(ctx, kubeSystem.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"data":{"x":"y"}}`)), client.DryRunAll)
		},
		"create a kshard-looking ConfigMap where the namespace did not opt in": func() error {
			return sa.Create(ctx, managed(other), client.DryRunAll)
		},
		// A token that is not bound to a pod holds no shard's Lease
		// (TestFenceHasNoSideDoor tries a pod's).
		"create its target in a namespace that opted in, with no shard": func() error {
			return sa.Create(ctx, managed(open), client.DryRunAll)
		},
		"create its target in a namespace that opted in, in a shard": func() error {
			cm := managed(open)
			cm.Labels["kshard.dev/shard"] = "3"
			err := sa.Create(ctx, cm, client.DryRunAll)
			if apierrors.IsInvalid(err) && strings.Contains(err.Error(), "parameterNotFoundAction") {
				return apierrors.NewForbidden(corev1.Resource("configmaps"), cm.Name, err) // shard 3's Lease is missing: closed
			}
			return err
		},
		"create a ConfigMap not marked as kshard's": func() error {
			return sa.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: open, Name: "plain"}}, client.DryRunAll)
		},
		"take over someone's ConfigMap by marking it": func() error { return sa.Update(ctx, takeover, client.DryRunAll) },
		"change someone's ConfigMap": func() error {
			return sa.Patch(ctx, someones.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"data":{"k":"w"}}`)), client.DryRunAll)
		},
		"delete a ConfigBinding": func() error { return sa.DeleteAllOf(ctx, &configv1alpha1.ConfigBinding{}, client.InNamespace(other)) },
		"read a StatefulSet other than its own": func() error {
			return sa.Get(ctx, client.ObjectKey{Namespace: ns, Name: "other"}, &appsv1.StatefulSet{})
		},
		"list every StatefulSet of its namespace": func() error {
			return sa.List(ctx, &appsv1.StatefulSetList{}, client.InNamespace(ns))
		},
		"create RBAC (escalate) in its namespace": func() error {
			return sa.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "x"}})
		},
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("the ServiceAccount may %s: got %v, want Forbidden", what, err)
		}
	}
}

// TestRBACStatic reads every Role and ClusterRole of every folder: no
// wildcard anywhere, nothing about Secrets, Leases only through the
// namespaced Role, and the Role's StatefulSet is the one the replicas name.
func TestRBACStatic(t *testing.T) {
	for _, folder := range folders {
		for _, o := range build(t, folder) {
			if o.GetKind() != "Role" && o.GetKind() != "ClusterRole" {
				continue
			}
			var role rbacv1.ClusterRole // a Role's rules have the same shape
			fromUnstructured(t, o, &role)
			for i, r := range role.Rules {
				for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames, r.NonResourceURLs} {
					for _, v := range list {
						if strings.Contains(v, "*") {
							t.Errorf("%s: %s rule %d uses a wildcard: %+v", folder, describe(o), i, r)
						}
					}
				}
				for _, res := range r.Resources {
					if res == "secrets" || strings.HasPrefix(res, "secrets/") {
						t.Errorf("%s: %s rule %d grants Secrets: %+v", folder, describe(o), i, r)
					}
					if res == "leases" && o.GetKind() == "ClusterRole" {
						t.Errorf("%s: %s rule %d grants Leases in every namespace: %+v", folder, describe(o), i, r)
					}
				}
			}
		}
	}

	objs := build(t, "base")
	sts := byKind(objs, "StatefulSet")[0]
	var args []string
	containers, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "containers")
	for _, a := range containers[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	if !slices.Contains(args, "--statefulset="+sts.GetName()) {
		t.Errorf("the replicas' --statefulset does not name their StatefulSet %s: %v", sts.GetName(), args)
	}
	var role rbacv1.Role
	fromUnstructured(t, byKind(objs, "Role")[0], &role)
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "statefulsets") && !slices.Equal(r.ResourceNames, []string{sts.GetName()}) {
			t.Errorf("the Role reads StatefulSets %v, want only %s", r.ResourceNames, sts.GetName())
		}
	}
}
