package main_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// TestControllerReadsEtcd runs the real binary with --config-center=etcd
// against an etcd of its own (never the API server's): a binding's values
// reach its ConfigMap, a value changed in etcd reaches it through the watch,
// and a key deleted in etcd makes the binding say KeyNotFound.
func TestControllerReadsEtcd(t *testing.T) {
	controlplane.Require(t, cp)
	ctx := context.Background()
	kshardBin := buildKshard(t)
	etcd := startConfigCenter(ctx, t)
	ec, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	put := func(key, value string) {
		t.Helper()
		if _, err := ec.Put(ctx, etcdsource.DefaultPrefix+"/payments/"+key, value); err != nil {
			t.Fatal(err)
		}
	}
	put("limit", "100")
	put("currency", "EUR")

	c, kubeconfig, ns, leaseNS := newEnv(ctx, t, "etcd")
	start(t, "kshard-0", kshardBin, "controller",
		"--kubeconfig", kubeconfig, "--replica-id", "kshard-0", "--ring", "etcd", "--lease-namespace", leaseNS,
		"--config-center", "etcd", "--etcd-servers", etcd.Endpoint(),
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--lease-duration", "6s", "--renew-deadline", "4s", "--retry-period", "1s", "--shards", "8")

	cb := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "checkout"},
		Spec: configv1alpha1.ConfigBindingSpec{Domain: "payments", Keys: []configv1alpha1.ConfigKey{"limit", "currency"},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "checkout-config"}},
	}
	if err := c.Create(ctx, cb); err != nil {
		t.Fatal(err)
	}
	configMapHas := func(want map[string]string) func() error {
		return func() error {
			var cm corev1.ConfigMap
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout-config"}, &cm); err != nil {
				return err
			}
			for k, v := range want {
				if cm.Data[k] != v {
					return fmt.Errorf("ConfigMap data %v, want %s=%s", cm.Data, k, v)
				}
			}
			return nil
		}
	}
	controlplane.Eventually(t, 2*time.Minute, "etcd's values in the ConfigMap", configMapHas(map[string]string{"limit": "100", "currency": "EUR"}))
	put("limit", "250")
	controlplane.Eventually(t, time.Minute, "a value changed in etcd in the ConfigMap", configMapHas(map[string]string{"limit": "250", "currency": "EUR"}))
	if _, err := ec.Delete(ctx, etcdsource.DefaultPrefix+"/payments/currency"); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, time.Minute, "a key deleted in etcd named in the binding's condition", func() error {
		var got configv1alpha1.ConfigBinding
		if err := c.Get(ctx, client.ObjectKeyFromObject(cb), &got); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, configbinding.ConditionReady)
		if cond == nil || cond.Reason != configbinding.ReasonKeyNotFound {
			return fmt.Errorf("condition %+v, want %s", cond, configbinding.ReasonKeyNotFound)
		}
		return nil
	})
}

// startConfigCenter starts an etcd of the test's own as the config center.
func startConfigCenter(ctx context.Context, t *testing.T) *configetcd.Server {
	t.Helper()
	etcd, err := configetcd.Start(ctx, configetcd.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = etcd.Close() })
	return etcd
}
