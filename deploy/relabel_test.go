package deploy_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
)

// TestWrongLabelsAreHandedOver: under deploy/base's fence no replica moves
// an object into a shard it does not hold, so the relabels kshard needs go
// through the holder of the wrong shard, who removes its label, and the
// object's rightful shard, which takes it. Two replicas hold the shards of
// a ring of 8; someone labels a binding's ConfigMap with a shard the other
// replica holds (a squatter), and another binding with a shard that is
// wrong for its domain, held by the other replica too; then both bindings'
// keys change. Each ends Ready at its new generation in its domain's shard,
// its ConfigMap labelled with that shard and holding the new keys: the
// squatter did not block the rightful holder. Without the holders' hand-over
// the fence refuses the rightful holder's write for good.
func TestWrongLabelsAreHandedOver(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c)
	const shards = 8
	cc := startConfigCenter(ctx, t, configcenter.SeedOptions{Domains: shards, KeysPerDomain: 3, ValueBytes: 16})
	timing := []string{"--shards", strconv.Itoa(shards), "--lease-duration", "8s", "--renew-deadline", "6s", "--retry-period", "1s", "--requeue-max-delay", "2s"}
	runReplicaAs(ctx, t, ns, "kshard-0", cp.Config.Host, cc.Endpoint(), timing...)
	runReplicaAs(ctx, t, ns, "kshard-1", cp.Config.Host, cc.Endpoint(), timing...)

	app := uniqueName("app")
	createNamespace(ctx, t, c, app, targets)
	t.Cleanup(func() {
		if err := c.DeleteAllOf(context.Background(), &configv1alpha1.ConfigBinding{}, client.InNamespace(app)); err != nil {
			t.Error(err)
		}
	})
	bindings := createBindings(ctx, t, c, app, 2*shards, shards)
	var held map[string]map[int32]bool
	controlplane.Eventually(t, 3*time.Minute, "every binding Ready, both replicas holding shards", func() error {
		if err := allReady(ctx, c, bindings); err != nil {
			return err
		}
		held = shardsHeld(ctx, t, c, ns)
		if len(held["kshard-0"]) == 0 || len(held["kshard-1"]) == 0 {
			return fmt.Errorf("shards held %v: want both replicas holding some", held)
		}
		return nil
	})
	// otherShard is a shard held by the replica that does not hold n.
	otherShard := func(n int32) int32 {
		for _, r := range []string{"kshard-0", "kshard-1"} {
			if held[r][n] {
				continue
			}
			for m := range int32(shards) {
				if held[r][m] {
					return m
				}
			}
		}
		t.Fatalf("no shard held apart from shard %d: %v", n, held)
		return 0
	}
	get := func(key client.ObjectKey) *configv1alpha1.ConfigBinding {
		var cb configv1alpha1.ConfigBinding
		if err := c.Get(ctx, key, &cb); err != nil {
			t.Fatal(err)
		}
		return &cb
	}
	relabel := func(o client.Object, shard int32) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"%d"}}}`, sharding.LabelShard, shard)
		if err := c.Patch(ctx, o, merge(patch)); err != nil {
			t.Fatal(err)
		}
	}

	// The squatter: binding 0's ConfigMap labelled with the other
	// replica's shard.
	squatted := get(bindings[0])
	right := sharding.ShardOf(squatted.Spec.Domain, shards)
	squatShard := otherShard(right)
	relabel(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: squatted.Spec.Target.ConfigMapName}}, squatShard)
	// The wrong label: binding 1 moved to the other replica's shard.
	moved := get(bindings[1])
	movedRight := sharding.ShardOf(moved.Spec.Domain, shards)
	relabel(moved, otherShard(movedRight))
	t.Logf("ConfigMap %s labelled %d (its binding's shard: %d); binding %s labelled %d (its domain's shard: %d); held: %v",
		squatted.Spec.Target.ConfigMapName, squatShard, right, moved.Name, otherShard(movedRight), movedRight, held)
	// Both bindings' keys change: only their rightful holders can write it.
	newKeys := []configv1alpha1.ConfigKey{"key-1", "key-2"}
	for _, k := range bindings[:2] {
		if err := c.Patch(ctx, get(k), merge(`{"spec":{"keys":["key-1","key-2"]}}`)); err != nil {
			t.Fatal(err)
		}
	}

	controlplane.Eventually(t, 3*time.Minute, "both bindings Ready at their new generation in their domain's shard, their ConfigMaps there with the new keys", func() error {
		for _, k := range bindings[:2] {
			cb := get(k)
			want := strconv.Itoa(int(sharding.ShardOf(cb.Spec.Domain, shards)))
			if got := cb.Labels[sharding.LabelShard]; got != want {
				return fmt.Errorf("binding %s labelled %q, its domain's shard is %s", k.Name, got, want)
			}
			cond := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
			if cond == nil || cond.Status != metav1.ConditionTrue || cb.Status.ObservedGeneration != cb.Generation {
				return fmt.Errorf("binding %s not Ready at generation %d: %+v", k.Name, cb.Generation, cb.Status)
			}
			var cm corev1.ConfigMap
			if err := c.Get(ctx, client.ObjectKey{Namespace: app, Name: cb.Spec.Target.ConfigMapName}, &cm); err != nil {
				return err
			}
			if got := cm.Labels[sharding.LabelShard]; got != want {
				return fmt.Errorf("ConfigMap %s labelled %q, its binding's shard is %s", cm.Name, got, want)
			}
			var keys []configv1alpha1.ConfigKey
			for key := range cm.Data {
				keys = append(keys, configv1alpha1.ConfigKey(key))
			}
			slices.Sort(keys)
			if !slices.Equal(keys, newKeys) {
				return fmt.Errorf("ConfigMap %s holds keys %v, want %v", cm.Name, keys, newKeys)
			}
		}
		return nil
	})
}
