package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { os.Exit(controlplane.RunTests(m, &cp)) }

func newClient(t *testing.T) client.Client {
	controlplane.Require(t, cp)
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := configv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newNamespace(ctx context.Context, t *testing.T, c client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func valid(ns, name string) *configv1alpha1.ConfigBinding {
	return &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: configv1alpha1.ConfigBindingSpec{
			Domain: "payments",
			Keys:   []configv1alpha1.ConfigKey{"fraud-threshold", "currency.list", "a_b"},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "checkout-config"},
		},
	}
}

func TestCRDIsServed(t *testing.T) {
	c := newClient(t)
	var list configv1alpha1.ConfigBindingList
	if err := c.List(context.Background(), &list); err != nil {
		t.Fatalf("listing ConfigBindings: %v", err)
	}
}

func TestAdmissionAcceptsValidObject(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	ns := newNamespace(ctx, t, c)
	if err := c.Create(ctx, valid(ns, "ok")); err != nil {
		t.Fatalf("valid ConfigBinding rejected: %v", err)
	}
	// Keys at the limits are accepted too.
	max := valid(ns, "max")
	max.Spec.Keys = nil
	for i := range 64 {
		max.Spec.Keys = append(max.Spec.Keys, configv1alpha1.ConfigKey(fmt.Sprintf("k%d", i)))
	}
	max.Spec.Keys[0] = configv1alpha1.ConfigKey(strings.Repeat("a", 63))
	max.Spec.Domain = "a"
	max.Spec.Target.ConfigMapName = "app.config-1"
	if err := c.Create(ctx, max); err != nil {
		t.Fatalf("ConfigBinding at the limits rejected: %v", err)
	}
}

func TestAdmissionRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	ns := newNamespace(ctx, t, c)

	keys := func(ks ...string) []configv1alpha1.ConfigKey {
		out := make([]configv1alpha1.ConfigKey, 0, len(ks))
		for _, k := range ks {
			out = append(out, configv1alpha1.ConfigKey(k))
		}
		return out
	}
	var tooMany []string
	for i := range 65 {
		tooMany = append(tooMany, fmt.Sprintf("k%d", i))
	}

	cases := []struct {
		name   string
		mutate func(*configv1alpha1.ConfigBinding)
		field  string
	}{
		{"empty domain", func(o *configv1alpha1.ConfigBinding) { o.Spec.Domain = "" }, "spec.domain"},
		{"uppercase domain", func(o *configv1alpha1.ConfigBinding) { o.Spec.Domain = "Payments" }, "spec.domain"},
		{"domain with dot", func(o *configv1alpha1.ConfigBinding) { o.Spec.Domain = "pay.ments" }, "spec.domain"},
		{"key with slash", func(o *configv1alpha1.ConfigBinding) { o.Spec.Keys = keys("a/b") }, "spec.keys[0]"},
		{"key dot-dot", func(o *configv1alpha1.ConfigBinding) { o.Spec.Keys = keys("ok", "..") }, "spec.keys[1]"},
		{"key containing dot-dot", func(o *configv1alpha1.ConfigBinding) { o.Spec.Keys = keys("a..b") }, "spec.keys[0]"},
		{"key too long", func(o *configv1alpha1.ConfigBinding) { o.Spec.Keys = keys(strings.Repeat("a", 64)) }, "spec.keys[0]"},
		{"duplicate keys", func(o *configv1alpha1.ConfigBinding) { o.Spec.Keys = keys("a", "b", "a") }, "spec.keys[2]"},
		{"65 keys", func(o *configv1alpha1.ConfigBinding) { o.Spec.Keys = keys(tooMany...) }, "spec.keys"},
		{"empty key list", func(o *configv1alpha1.ConfigBinding) { o.Spec.Keys = keys() }, "spec.keys"},
		{"invalid ConfigMap name", func(o *configv1alpha1.ConfigBinding) { o.Spec.Target.ConfigMapName = "Bad_Name" }, "spec.target.configMapName"},
		{"empty ConfigMap name", func(o *configv1alpha1.ConfigBinding) { o.Spec.Target.ConfigMapName = "" }, "spec.target.configMapName"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := valid(ns, fmt.Sprintf("bad-%d", i))
			tc.mutate(obj)
			err := c.Create(ctx, obj)
			if err == nil {
				t.Fatalf("%s was accepted", tc.name)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("rejection does not name %s: %v", tc.field, err)
			}
			t.Logf("rejected: %v", err)
		})
	}
}

func TestAdmissionRejectsDomainChange(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	ns := newNamespace(ctx, t, c)
	obj := valid(ns, "immutable")
	if err := c.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	obj.Spec.Domain = "shipping"
	err := c.Update(ctx, obj)
	if err == nil {
		t.Fatal("domain change was accepted")
	}
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.domain") || !strings.Contains(err.Error(), "immutable") {
		t.Fatalf("want an Invalid error naming spec.domain as immutable, got %v", err)
	}
	// Other fields stay mutable.
	var fresh configv1alpha1.ConfigBinding
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &fresh); err != nil {
		t.Fatal(err)
	}
	fresh.Spec.Keys = append(fresh.Spec.Keys, "new-key")
	if err := c.Update(ctx, &fresh); err != nil {
		t.Fatalf("key change rejected: %v", err)
	}
}
