package sharding_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
	"github.com/kshard/kshard/sharding/ring"
)

// TestStatusNamesABadShardCountAnnotation: a live member Lease whose
// kshard.dev/shards annotation is no shard count (hand-edited, or written by
// something else) makes `kshard status` fail naming the Lease and the
// annotation. A negative count made it panic drawing a ring of -3 shards.
func TestStatusNamesABadShardCountAnnotation(t *testing.T) {
	t.Parallel() // own namespace and ring; it reads only them, and counts ConfigBindings
	c := newClient(t)
	ns := newNamespace(t, c)
	for _, bad := range []string{"-3", "0", "99999", "x"} {
		ringName := "badcount"
		now := metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lease.MemberName(ringName, "r-0"),
				Labels:      map[string]string{sharding.LabelRing: ringName, sharding.LabelLeaseKind: lease.KindMember},
				Annotations: map[string]string{sharding.AnnotationShards: bad}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("r-0_1"), LeaseDurationSeconds: ptr.To[int32](3600),
				AcquireTime: &now, RenewTime: &now},
		}
		if err := c.Create(context.Background(), l); err != nil {
			t.Fatal(err)
		}
		_, err := ring.ReadStatus(context.Background(), c, ring.StatusOptions{Namespace: ns, Ring: ringName, Kind: configv1alpha1.GroupVersion.WithKind("ConfigBinding"), LabelPrefix: sharding.DefaultLabelPrefix})
		want := `member Lease badcount-member-r-0: annotation kshard.dev/shards "` + bad + `" is not a shard count in [1, 4096]`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("annotation %q: ReadStatus error %v, want one containing %q", bad, err, want)
		}
		if err := c.Delete(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLabelAndMetricsPrefix: a ring with a label prefix of its own marks
// its objects and Leases under it and under nothing else, and reads them
// back: every object is labeled and reconciled, ReadStatus with the prefix
// finds every shard held, and with kshard's default it finds no ring at all.
// Its metrics are named under its metrics prefix.
func TestLabelAndMetricsPrefix(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replica watches that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ringName := "prefixed"
	rc := ringConfig(ns, ringName, "r-0")
	rc.labelPrefix, rc.metricsPrefix = "pricing.example.dev", "pricing"
	keys := createBindings(t, c, ns, 30, 10)
	startReplica(t, rc)
	gvk := configv1alpha1.GroupVersion.WithKind("ConfigBinding")
	controlplane.Eventually(t, 2*time.Minute, "every shard held and every object reconciled", func() error {
		st, err := ring.ReadStatus(context.Background(), c, ring.StatusOptions{Namespace: ns, Ring: ringName, Kind: gvk, LabelPrefix: rc.labelPrefix})
		if err != nil {
			return err
		}
		// (Its object counts are the whole cluster's, other tests' too.)
		if len(st.Unowned) > 0 || st.ShardCount != shards {
			return fmt.Errorf("%d shards of %d, %d unowned", st.ShardCount, shards, len(st.Unowned))
		}
		for _, k := range keys {
			var cb configv1alpha1.ConfigBinding
			if err := c.Get(context.Background(), k, &cb); err != nil {
				return err
			}
			if cb.Status.ObservedGeneration != cb.Generation {
				return fmt.Errorf("%s not reconciled at generation %d", cb.Name, cb.Generation)
			}
		}
		return nil
	})
	for _, k := range keys {
		var cb configv1alpha1.ConfigBinding
		if err := c.Get(context.Background(), k, &cb); err != nil {
			t.Fatal(err)
		}
		if got := cb.Labels["pricing.example.dev/shard"]; got != fmt.Sprint(sharding.ShardOf(cb.Spec.Domain, shards)) ||
			cb.Labels["pricing.example.dev/domain"] != cb.Spec.Domain {
			t.Errorf("%s labeled %v, want pricing.example.dev/shard %s of domain %s", cb.Name, cb.Labels, got, cb.Spec.Domain)
		}
		if _, ok := cb.Labels[sharding.LabelShard]; ok {
			t.Errorf("%s carries %s: %v", cb.Name, sharding.LabelShard, cb.Labels)
		}
	}
	var leases coordinationv1.LeaseList
	if err := c.List(context.Background(), &leases, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		if _, ok := l.Labels[sharding.LabelRing]; ok {
			t.Errorf("Lease %s carries %s: %v", l.Name, sharding.LabelRing, l.Labels)
		}
	}
	st, err := ring.ReadStatus(context.Background(), c, ring.StatusOptions{Namespace: ns, Ring: ringName, Kind: gvk, LabelPrefix: sharding.DefaultLabelPrefix})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) > 0 || st.ShardCount > 0 {
		t.Errorf("with the default prefix ReadStatus finds %d members and %d shards, want none", len(st.Members), st.ShardCount)
	}
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	owned := -1.0
	for _, f := range families {
		if f.GetName() != "pricing_shards_owned" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "ring" && l.GetValue() == ringName {
					owned = m.GetGauge().GetValue()
				}
			}
		}
	}
	if owned != float64(shards) {
		t.Errorf("pricing_shards_owned{ring=%q} = %v, want %d (-1: not exported)", ringName, owned, shards)
	}
}
