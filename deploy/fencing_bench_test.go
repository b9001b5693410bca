package deploy_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// reportLatency runs op b.N times and reports the percentiles of its
// latency as the client saw it.
func reportLatency(b *testing.B, op func(i int) error) {
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := op(i); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

// BenchmarkShardWritesPolicy measures what the kshard-shard-writes policy
// costs a replica's write: status patches of one ConfigBinding by the pod
// that holds its shard, through a ring of 64 shard Leases (the policy runs
// once per Lease), on the same API server: without the policy, with the
// shipped bindings (one per shard, each naming its Lease), and with one
// binding that selects every Lease (the policy runs 64 times per write). It
// reports the latency percentiles of the patch as the client sees them:
//
//	go test -run '^$' -bench ShardWritesPolicy -benchtime 2000x ./deploy/
func BenchmarkShardWritesPolicy(b *testing.B) {
	ctx := context.Background()
	c := adminClient(b)
	ns := installBase(ctx, b, c)
	holder := lease.Holder("kshard-0", "bench")
	now := metav1.NewMicroTime(time.Now())
	for n := range int32(64) {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lease.ShardName("kshard", n),
				Labels: map[string]string{sharding.LabelRing: "kshard", sharding.LabelLeaseKind: lease.KindShard}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](3600), AcquireTime: &now, RenewTime: &now},
		}
		holdLease(ctx, b, c, l)
	}
	app := uniqueName("app")
	createNamespace(ctx, b, c, app, targets)
	cb := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: "bench", Labels: map[string]string{sharding.LabelShard: "3", sharding.LabelDomain: "domain-3"}},
		Spec: configv1alpha1.ConfigBindingSpec{Domain: "domain-3", Keys: []configv1alpha1.ConfigKey{"key-0"},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "bench-config"}},
	}
	if err := c.Create(ctx, cb); err != nil {
		b.Fatal(err)
	}
	// Unthrottled: client-go's default 5 requests/s would be all the
	// benchmark measured.
	cfg := tokenConfig(podToken(ctx, b, ns, "kshard-0"))
	cfg.QPS, cfg.Burst = -1, 0
	replica, err := client.New(cfg, client.Options{Scheme: c.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	stranger := tokenClient(b, podToken(ctx, b, ns, "kshard-9"))
	patch := func(w client.Client, i int) error {
		obj := &configv1alpha1.ConfigBinding{ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: "bench"}}
		return w.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType,
			fmt.Appendf(nil, `{"status":{"observedGeneration":%d}}`, i)))
	}
	// The shipped bindings in force: the holder writes, another pod may
	// not.
	controlplane.Eventually(b, time.Minute, "the policy refusing a pod that holds no Lease", func() error {
		if err := patch(stranger, 1); err == nil {
			return fmt.Errorf("kshard-9 patched a binding of shard 3, held by %s", holder)
		}
		return patch(replica, 1)
	})
	run := func(b *testing.B) { reportLatency(b, func(i int) error { return patch(replica, i+2) }) }
	inForce := func(want bool) func() error {
		return func() error {
			switch err := patch(stranger, 1); {
			case want && err == nil:
				return fmt.Errorf("kshard-9 patched a binding of shard 3, held by %s", holder)
			case !want && err != nil:
				return fmt.Errorf("still refused: %w", err)
			}
			return nil
		}
	}
	shipped := unbindFencing(ctx, b, c, ns)
	bind := func(bindings ...admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
		for _, vapb := range bindings {
			vapb.ObjectMeta = metav1.ObjectMeta{Name: vapb.Name, Labels: vapb.Labels}
			if err := c.Create(ctx, &vapb); err != nil {
				b.Fatal(err)
			}
		}
		controlplane.Eventually(b, time.Minute, "the policy in force", inForce(true))
	}
	// One binding that selects every shard Lease of the ring: the policy
	// runs once per Lease.
	selecting := admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: audit.FencingPolicy + "-" + ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        audit.FencingPolicy + "-" + ns,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			ParamRef: &admissionregistrationv1.ParamRef{Namespace: ns, ParameterNotFoundAction: ptr.To(admissionregistrationv1.AllowAction),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{sharding.LabelRing: "kshard", sharding.LabelLeaseKind: lease.KindShard}}},
		},
	}
	// Alternate the three, so that a machine that gets busier or quieter
	// during the run weighs on all alike.
	for round := range 2 {
		controlplane.Eventually(b, time.Minute, "no policy in force", inForce(false))
		b.Run(fmt.Sprintf("no-policy/round-%d", round), run)
		bind(shipped...)
		b.Run(fmt.Sprintf("binding-per-shard/round-%d", round), run)
		unbindFencing(ctx, b, c, ns)
		bind(selecting)
		b.Run(fmt.Sprintf("one-binding-all-leases/round-%d", round), run)
		unbindFencing(ctx, b, c, ns)
	}
	bind(shipped...)
}
