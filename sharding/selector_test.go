package sharding_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
)

// TestOwnedKindSelector: an owned kind's Selector keeps objects that only
// copy a shard label out of the shard caches (a tenant cannot grow a
// replica's memory by labelling their ConfigMaps), while the objects it
// selects are cached.
func TestOwnedKindSelector(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "selector"
	rc := ringConfig(ns, ring, "s-0")
	rc.ownedSelector = labels.SelectorFromSet(labels.Set{"kshard.dev/test-owned": "yes"})
	r := startReplica(t, rc)
	expectRingHeld(t, c, ns, ring, []string{"s-0"})
	controlplane.Eventually(t, time.Minute, "replica ready", r.rep.Ready)

	const shard = 5
	mk := func(name string, owned bool) {
		l := map[string]string{sharding.LabelShard: fmt.Sprint(shard)}
		if owned {
			l["kshard.dev/test-owned"] = "yes"
		}
		if err := c.Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l},
			Data: map[string]string{"k": "v"}}); err != nil {
			t.Fatal(err)
		}
	}
	// The copy first: the watch delivers in resourceVersion order, so once
	// the owned one is cached the copy would have been too.
	mk("tenant-copy", false)
	mk("owned", true)
	controlplane.Eventually(t, time.Minute, "owned ConfigMap cached", func() error {
		reader, ok := r.rep.Reader(shard)
		if !ok {
			return fmt.Errorf("shard %d not held", shard)
		}
		var list corev1.ConfigMapList
		if err := reader.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		names := map[string]bool{}
		for _, cm := range list.Items {
			names[cm.Name] = true
		}
		if names["tenant-copy"] {
			t.Fatal("a ConfigMap that only copies the shard label is cached")
		}
		if !names["owned"] {
			return fmt.Errorf("cached: %v", names)
		}
		return nil
	})
}

// TestLabelerKeepsToForSelector: the labeler labels the objects For's
// Selector selects, and leaves the others of the kind alone: they are no
// shard's, and the ServiceAccount need not be allowed to patch them.
func TestLabelerKeepsToForSelector(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	rc := ringConfig(ns, "for-selector", "f-0")
	rc.forSelector = labels.SelectorFromSet(labels.Set{"kshard.dev/test-team": "a"})
	mk := func(name string, team string) {
		cb := &configv1alpha1.ConfigBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"kshard.dev/test-team": team}},
			Spec: configv1alpha1.ConfigBindingSpec{Domain: "payments", Keys: []configv1alpha1.ConfigKey{"k"},
				Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: name}},
		}
		if err := c.Create(context.Background(), cb); err != nil {
			t.Fatal(err)
		}
	}
	// The other team's first: the watch delivers in resourceVersion order,
	// so once team a's is labeled the other would have been too.
	mk("team-b", "b")
	mk("team-a", "a")
	startReplica(t, rc)
	expectRingHeld(t, c, ns, "for-selector", []string{"f-0"})
	controlplane.Eventually(t, time.Minute, "team a's binding labeled", func() error {
		var cb configv1alpha1.ConfigBinding
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "team-a"}, &cb); err != nil {
			return err
		}
		if _, ok := cb.Labels[sharding.LabelShard]; !ok {
			return fmt.Errorf("not labeled yet: %v", cb.Labels)
		}
		return nil
	})
	var cb configv1alpha1.ConfigBinding
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "team-b"}, &cb); err != nil {
		t.Fatal(err)
	}
	if l, ok := cb.Labels[sharding.LabelShard]; ok {
		t.Errorf("the labeler labeled a binding For's Selector leaves out: shard %s", l)
	}
}

// TestOneControllerPerReplica: a Replica feeds one controller's queue; a
// second controller would never get a request, so creating one is an error.
func TestOneControllerPerReplica(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	r := startReplica(t, ringConfig(ns, "one-controller", "o-0"))
	_, err := r.rep.NewController("second", &statusReconciler{rep: r.rep}, controller.TypedOptions[sharding.Request]{})
	if err == nil || !strings.Contains(err.Error(), "one controller per Replica") {
		t.Fatalf("a second controller: got %v, want an error", err)
	}
}
