package deploy_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/reconcile/externaldomain"
)

// TestComponentsApply applies the base with the optional components (the
// admission webhook with cert-manager, the mirror strategy), and the kind
// overlay with the webhook on a certificate from hack/webhookcert, to the
// real API server (cert-manager's own CRDs installed), and checks what each
// component adds to the StatefulSet.
func TestComponentsApply(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	for _, tc := range []struct {
		name       string
		folder     string
		components []string
		generate   bool
		wantArgs   []string
		wantKinds  []string
	}{
		{name: "webhook-cert-manager", folder: "base", components: []string{"webhook", "webhook/cert-manager"},
			wantArgs: []string{"--webhook-port=9443", "--webhook-cert-dir=/certs"}, wantKinds: []string{"ValidatingWebhookConfiguration", "Certificate", "Issuer"}},
		{name: "metrics-cert", folder: "base", components: []string{"metrics-cert"},
			wantArgs: []string{"--metrics-cert-dir=/metrics-certs"}, wantKinds: []string{"Certificate", "Issuer"}},
		{name: "mirror", folder: "base", components: []string{"mirror"},
			wantArgs: []string{"--external-source=mirror"}, wantKinds: []string{"ClusterRole"}},
		{name: "kind-webhook", folder: "kind-webhook", generate: true,
			wantArgs: []string{"--webhook-port=9443"}, wantKinds: []string{"ValidatingWebhookConfiguration", "Secret"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := uniqueName("kshard-comp")
			var extra map[string][]byte
			if tc.generate {
				extra = generateWebhookCert(t)
			}
			objs := buildWithFiles(t, extra, tc.folder, ns, tc.components...)
			for _, o := range objs {
				if o.GetKind() == "ValidatingWebhookConfiguration" {
					// Cluster scoped, like the RBAC: one per test namespace.
					o.SetName(o.GetName() + "-" + ns)
				}
			}
			for _, k := range tc.wantKinds {
				if len(byKind(objs, k)) == 0 {
					t.Errorf("no %s in the build", k)
				}
			}
			sts := byName(t, objs, "StatefulSet", "kshard")
			args, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "containers")
			container := args[0].(map[string]any)
			var got []string
			for _, a := range container["args"].([]any) {
				got = append(got, a.(string))
			}
			for _, want := range tc.wantArgs {
				if !slices.Contains(got, want) {
					t.Errorf("container args %v lack %s", got, want)
				}
			}
			if slices.Contains(tc.components, "webhook") || tc.generate {
				checkWebhookConfiguration(t, objs, ns)
			}
			apply(ctx, t, c, objs)
			t.Cleanup(func() { remove(context.Background(), t, c, objs) })
		})
	}
}

// checkWebhookConfiguration: the pre-check can never block writes, and it
// points at the Service the build contains, in the build's namespace.
func checkWebhookConfiguration(t *testing.T, objs []*unstructured.Unstructured, ns string) {
	t.Helper()
	for _, o := range byKind(objs, "ValidatingWebhookConfiguration") {
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		for _, h := range hooks {
			hook := h.(map[string]any)
			if hook["failurePolicy"] != "Ignore" {
				t.Errorf("webhook %s failurePolicy %v, want Ignore", hook["name"], hook["failurePolicy"])
			}
			svc, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "namespace")
			name, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "name")
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			if svc != ns || path != configbinding.WebhookPath {
				t.Errorf("webhook calls %s/%s%s, want namespace %s and path %s", svc, name, path, ns, configbinding.WebhookPath)
			}
			found := false
			for _, s := range byKind(objs, "Service") {
				found = found || s.GetName() == name
			}
			if !found {
				t.Errorf("webhook Service %s is not in the build", name)
			}
		}
	}
}

// generateWebhookCert runs hack/webhookcert as `make kind-webhook-cert`
// does and returns its files, by path relative to deploy/.
func generateWebhookCert(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for f, b := range generateCert(t) {
		files[filepath.Join("kind-webhook", "generated", f)] = b
	}
	return files
}

// generateCert runs hack/webhookcert with args and returns its files
// (secret.yaml, cabundle-patch.yaml) by name.
func generateCert(t *testing.T, args ...string) map[string][]byte {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command("go", append([]string{"run", "./hack/webhookcert", "-out", out}, args...)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/webhookcert: %v\n%s", err, b)
	}
	files := map[string][]byte{}
	for _, f := range []string{"secret.yaml", "cabundle-patch.yaml"} {
		b, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = b
	}
	return files
}

// TestMirrorRBACSufficient runs the real binary with the mirror component's
// RBAC and flag, as the ServiceAccount only: a binding becomes Ready from
// its domain's ExternalDomain, the mirror is deleted with the domain's last
// binding (the delete verb, under the fencing policy), and nothing it did was
// forbidden.
func TestMirrorRBACSufficient(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c, "mirror")
	cc := startConfigCenter(ctx, t, configcenter.SeedOptions{Domains: 1, KeysPerDomain: 2, ValueBytes: 16})
	domain := configcenter.SeedDomain(0)
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &configv1alpha1.ExternalDomain{ObjectMeta: metav1.ObjectMeta{Name: domain}})
	})
	kshard, _ := runReplica(ctx, t, ns, cc.Endpoint(), "--external-source=mirror")

	app := uniqueName("app")
	createNamespace(ctx, t, c, app, targets)
	cb := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: "checkout"},
		Spec: configv1alpha1.ConfigBindingSpec{
			Domain: domain, Keys: []configv1alpha1.ConfigKey{"key-0"},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "checkout-config"},
		},
	}
	if err := c.Create(ctx, cb); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, 2*time.Minute, "ConfigBinding Ready from the mirror", func() error {
		var got configv1alpha1.ConfigBinding
		if err := c.Get(ctx, client.ObjectKeyFromObject(cb), &got); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, configbinding.ConditionReady) {
			return fmt.Errorf("status %+v", got.Status)
		}
		var ed configv1alpha1.ExternalDomain
		if err := c.Get(ctx, client.ObjectKey{Name: domain}, &ed); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(ed.Status.Conditions, externaldomain.ConditionSynced) || ed.Status.KeyCount != 2 {
			return fmt.Errorf("mirror status %+v", ed.Status)
		}
		return nil
	})
	// The domain's last binding goes: the replica deletes its mirror.
	if err := c.Delete(ctx, cb); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, 2*time.Minute, "the mirror of a domain without bindings deleted", func() error {
		err := c.Get(ctx, client.ObjectKey{Name: domain}, &configv1alpha1.ExternalDomain{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("ExternalDomain %s: %v", domain, err)
		}
		return nil
	})
	kshard.stop(t, 2*time.Minute)
	for _, line := range strings.Split(kshard.output(t), "\n") {
		if strings.Contains(strings.ToLower(line), "forbidden") {
			t.Errorf("a request of the replica was forbidden: %s", line)
		}
	}
}
