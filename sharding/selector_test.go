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
