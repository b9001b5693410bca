// Package deploy_test proves that deploy/ is something users can apply as
// is: every kustomize folder builds and is accepted by a real kube-apiserver
// through server-side apply, the base's RBAC is enough for the real kshard
// binary and no more, and its pods pass the restricted pod security profile.
package deploy_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
)

var cp *controlplane.ControlPlane

// apiAudit is the control plane's own audit log (internal/audit's Policy):
// the writes the API server committed and refused.
var apiAudit string

// TestMain starts one control plane with kshard's CRDs and the third-party
// CRDs the monitoring and autoscaling folders use. It enables the
// OwnerReferencesPermissionEnforcement admission plugin, as hardened clusters
// do: kshard's ConfigMaps set blockOwnerDeletion, which that plugin guards.
// Its API server writes an audit log of the writes to shard resources and
// Leases, which the fencing tests check (internal/audit). Its aggregation
// layer has a front proxy, as a real cluster's has, so that
// an aggregated API server (kshard-metrics-adapter) can be reached through
// it.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(logr.Discard())
	root, err := controlplane.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "kshard-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	frontProxy, err := frontProxyArgs(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	args := map[string][]string{"enable-admission-plugins": {"OwnerReferencesPermissionEnforcement"}}
	maps.Copy(args, frontProxy)
	apiAudit = filepath.Join(dir, "audit.log")
	return controlplane.RunTestsWith(m, &cp, controlplane.Options{
		CRDDirs:       []string{filepath.Join(root, "deploy", "crd"), filepath.Join(root, "deploy", "testdata", "crds")},
		APIServerArgs: args,
		AuditLogPath:  apiAudit,
	})
}

// frontProxyArgs writes a front-proxy CA and the aggregator's client
// certificate into dir, and returns the kube-apiserver flags that use them
// (kubeadm's): the aggregator proxies requests to aggregated API servers
// with that certificate and the caller's identity in X-Remote-* headers,
// which those servers trust through the CA, read from kube-system's
// extension-apiserver-authentication ConfigMap.
func frontProxyArgs(dir string) (map[string][]string, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "front-proxy-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	clientDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "front-proxy-client"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	files := map[string]*pem.Block{
		"front-proxy-ca.crt":     {Type: "CERTIFICATE", Bytes: caDER},
		"front-proxy-client.crt": {Type: "CERTIFICATE", Bytes: clientDER},
		"front-proxy-client.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	}
	for name, block := range files {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, err
		}
	}
	return map[string][]string{
		"requestheader-client-ca-file":       {filepath.Join(dir, "front-proxy-ca.crt")},
		"requestheader-allowed-names":        {"front-proxy-client"},
		"requestheader-username-headers":     {"X-Remote-User"},
		"requestheader-group-headers":        {"X-Remote-Group"},
		"requestheader-extra-headers-prefix": {"X-Remote-Extra-"},
		"proxy-client-cert-file":             {filepath.Join(dir, "front-proxy-client.crt")},
		"proxy-client-key-file":              {filepath.Join(dir, "front-proxy-client.key")},
	}, nil
}

// fieldOwner is the field manager of everything the tests apply.
const fieldOwner = "kshard-deploy-test"

// folders are the kustomize folders users apply, in an order in which each
// one's namespace exists before it is applied.
var folders = []string{"crd", "base", "configcenter", "config-etcd", "kind", "node", "node-prometheus", "monitoring", "autoscaling", "autoscaling/keda",
	"metrics-adapter", "autoscaling-adapter"}

func deployDir(t testing.TB) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy")
}

func adminClient(t testing.TB) client.Client {
	t.Helper()
	controlplane.Require(t, cp)
	c, err := client.New(cp.Config, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// build runs what `kubectl kustomize` runs on a folder of deploy/.
func build(t testing.TB, folder string) []*unstructured.Unstructured {
	t.Helper()
	return buildIn(t, filesys.MakeFsOnDisk(), filepath.Join(deployDir(t), folder))
}

func buildIn(t testing.TB, fsys filesys.FileSystem, dir string) []*unstructured.Unstructured {
	t.Helper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range resources.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatalf("kustomize build %s: %s: %v", dir, r.CurId(), err)
		}
		out = append(out, &unstructured.Unstructured{Object: normalize(t, m).(map[string]any)})
	}
	return out
}

// buildInNamespace builds a folder, with optional components (folders of
// deploy/ too), into a namespace of its own, as a user's overlay with
// `namespace:` would: so tests never share kshard-system. The cluster-scoped
// RBAC objects get the namespace as a name suffix, so that tests do not share
// those either.
func buildInNamespace(t testing.TB, folder, namespace string, components ...string) []*unstructured.Unstructured {
	t.Helper()
	return buildWithFiles(t, nil, folder, namespace, components...)
}

// buildWithFiles is buildInNamespace with extra files (paths relative to
// deploy/) added to the tree first: what a generator writes before a build.
func buildWithFiles(t testing.TB, extra map[string][]byte, folder, namespace string, components ...string) []*unstructured.Unstructured {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	src := deployDir(t)
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		return mem.WriteFile(filepath.Join("/deploy", rel), b)
	})
	if err != nil {
		t.Fatalf("copying deploy/: %v", err)
	}
	for rel, b := range extra {
		if err := mem.WriteFile(filepath.Join("/deploy", rel), b); err != nil {
			t.Fatal(err)
		}
	}
	overlay := "/deploy/test-overlay"
	kustomization := fmt.Sprintf("resources:\n- ../%s\nnamespace: %s\n", folder, namespace)
	if len(components) > 0 {
		kustomization += "components:\n"
		for _, c := range components {
			kustomization += "- ../" + c + "\n"
		}
	}
	if err := mem.WriteFile(overlay+"/kustomization.yaml", []byte(kustomization)); err != nil {
		t.Fatal(err)
	}
	objs := buildIn(t, mem, overlay)
	ownClusterRoles := map[string]bool{}
	for _, o := range byKind(objs, "ClusterRole") {
		ownClusterRoles[o.GetName()] = true
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole":
			o.SetName(o.GetName() + "-" + namespace)
		case "ClusterRoleBinding":
			o.SetName(o.GetName() + "-" + namespace)
			// A binding to a ClusterRole of the cluster's own
			// (system:auth-delegator) keeps its reference.
			ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
			if !ownClusterRoles[ref] {
				break
			}
			if err := unstructured.SetNestedField(o.Object, ref+"-"+namespace, "roleRef", "name"); err != nil {
				t.Fatal(err)
			}
		case "RoleBinding":
			// `namespace:` moves the metrics adapter's binding to
			// kube-system's Role too: the test moves it back, as a user's
			// overlay must, under a name of its own.
			if ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name"); ref == "extension-apiserver-authentication-reader" {
				o.SetNamespace("kube-system")
				o.SetName(o.GetName() + "-" + namespace)
			}
		case "ValidatingAdmissionPolicy":
			// Kustomize does not rewrite the namespace in the CEL
			// expressions (the ServiceAccount's, the shard table's): the
			// test does, as a user renaming it must.
			o.SetName(o.GetName() + "-" + namespace)
			conds, _, _ := unstructured.NestedSlice(o.Object, "spec", "matchConditions")
			for _, c := range conds {
				m := c.(map[string]any)
				m["expression"] = strings.ReplaceAll(m["expression"].(string), "kshard-system", namespace)
			}
			if err := unstructured.SetNestedSlice(o.Object, conds, "spec", "matchConditions"); err != nil {
				t.Fatal(err)
			}
		case "PriorityLevelConfiguration":
			o.SetNamespace("")
			o.SetName(o.GetName() + "-" + namespace)
		case "FlowSchema":
			// Kustomize rewrites no subject of a FlowSchema: the test
			// does, as a user renaming the namespace must.
			o.SetNamespace("")
			o.SetName(o.GetName() + "-" + namespace)
			ref, _, _ := unstructured.NestedString(o.Object, "spec", "priorityLevelConfiguration", "name")
			if err := unstructured.SetNestedField(o.Object, ref+"-"+namespace, "spec", "priorityLevelConfiguration", "name"); err != nil {
				t.Fatal(err)
			}
			rules, _, _ := unstructured.NestedSlice(o.Object, "spec", "rules")
			for _, r := range rules {
				for _, sub := range r.(map[string]any)["subjects"].([]any) {
					if sa, ok := sub.(map[string]any)["serviceAccount"].(map[string]any); ok {
						sa["namespace"] = namespace
					}
				}
			}
			if err := unstructured.SetNestedSlice(o.Object, rules, "spec", "rules"); err != nil {
				t.Fatal(err)
			}
		case "MutatingAdmissionPolicy":
			// Kustomize v0.21 does not know this kind is cluster-scoped and
			// gives it the namespace, which the API server drops.
			o.SetNamespace("")
			o.SetName(o.GetName() + "-" + namespace)
		case "MutatingAdmissionPolicyBinding":
			o.SetNamespace("")
			o.SetName(o.GetName() + "-" + namespace)
			ref, _, _ := unstructured.NestedString(o.Object, "spec", "policyName")
			if err := unstructured.SetNestedField(o.Object, ref+"-"+namespace, "spec", "policyName"); err != nil {
				t.Fatal(err)
			}
			if err := unstructured.SetNestedField(o.Object, namespace, "spec", "paramRef", "namespace"); err != nil {
				t.Fatal(err)
			}
		case "ValidatingAdmissionPolicyBinding":
			o.SetName(o.GetName() + "-" + namespace)
			ref, _, _ := unstructured.NestedString(o.Object, "spec", "policyName")
			if err := unstructured.SetNestedField(o.Object, ref+"-"+namespace, "spec", "policyName"); err != nil {
				t.Fatal(err)
			}
			// Nor the namespace of the params (the shard Leases).
			if _, ok, _ := unstructured.NestedString(o.Object, "spec", "paramRef", "namespace"); ok {
				if err := unstructured.SetNestedField(o.Object, namespace, "spec", "paramRef", "namespace"); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return objs
}

// normalize turns a decoded document into plain JSON values, so that what
// kustomize built and what the API server returns compare field by field.
func normalize(t testing.TB, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// byKind returns the objects of a kind.
func byKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// byName returns the object of a kind and name, failing the test without
// one.
func byName(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range byKind(objs, kind) {
		if o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s in the build", kind, name)
	return nil
}

// applyOrder puts namespaces and CRDs first, as kubectl apply does.
func applyOrder(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	rank := func(o *unstructured.Unstructured) int {
		switch o.GetKind() {
		case "Namespace":
			return 0
		case "CustomResourceDefinition":
			return 1
		}
		return 2
	}
	out := append([]*unstructured.Unstructured(nil), objs...)
	sort.SliceStable(out, func(i, j int) bool { return rank(out[i]) < rank(out[j]) })
	return out
}

// apply server-side applies objects for real (no dry run) and checks that
// the API server kept every field the manifest sets: a field that a schema
// prunes, or a value that defaulting overrides, fails the test.
func apply(ctx context.Context, t testing.TB, c client.Client, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range applyOrder(objs) {
		want := o.DeepCopy()
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
			t.Fatalf("server-side apply of %s: %v", describe(o), err)
		}
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(o.GroupVersionKind())
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), live); err != nil {
			t.Fatalf("reading back %s: %v", describe(o), err)
		}
		if diff := missingFields(want.Object, normalize(t, live.Object), ""); diff != "" {
			t.Errorf("%s: the API server did not keep what the manifest says: %s", describe(o), diff)
		}
	}
}

// missingFields reports the first field of want that got is missing or has
// another value. Lists must keep their order and length.
func missingFields(want, got any, path string) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: want an object, got %v", path, got)
		}
		for k, v := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Sprintf("%s.%s: missing (want %v)", path, k, v)
			}
			if d := missingFields(v, gv, path+"."+k); d != "" {
				return d
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s: want %v, got %v", path, w, got)
		}
		for i := range w {
			if d := missingFields(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(want, got) && !sameQuantity(want, got) {
			return fmt.Sprintf("%s: want %v, got %v", path, want, got)
		}
		return ""
	}
}

// sameQuantity accepts the API server's canonical form of a quantity
// ("5000" is kept as "5k").
func sameQuantity(want, got any) bool {
	w, ok1 := want.(string)
	g, ok2 := got.(string)
	if !ok1 || !ok2 {
		return false
	}
	wq, err1 := resource.ParseQuantity(w)
	gq, err2 := resource.ParseQuantity(g)
	return err1 == nil && err2 == nil && wq.Cmp(gq) == 0
}

// remove deletes objects, except CRDs that the control plane shares between
// tests. Namespaces are deleted too; without a namespace controller they
// stay Terminating, which no later test minds: each uses its own.
func remove(ctx context.Context, t testing.TB, c client.Client, objs []*unstructured.Unstructured) {
	t.Helper()
	ordered := applyOrder(objs)
	for i := len(ordered) - 1; i >= 0; i-- {
		o := ordered[i]
		if o.GetKind() == "CustomResourceDefinition" {
			continue
		}
		if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting %s: %v", describe(o), err)
		}
	}
}

func describe(o *unstructured.Unstructured) string {
	if ns := o.GetNamespace(); ns != "" {
		return fmt.Sprintf("%s %s/%s", o.GetKind(), ns, o.GetName())
	}
	return fmt.Sprintf("%s %s", o.GetKind(), o.GetName())
}

// uniqueName is a DNS label that no other test uses.
func uniqueName(prefix string) string {
	return prefix + "-" + utilrand.String(6)
}

// createNamespace creates a namespace with labels and deletes it at the end.
func createNamespace(ctx context.Context, t testing.TB, c client.Client, name string, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ns) })
}
