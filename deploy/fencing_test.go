package deploy_test

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/netfault"
	"github.com/kshard/kshard/internal/promtext"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// Lease timing of the fencing test's replicas, and the delay on the wire:
// longer than a lease, so the delayed replica's shards move while its
// requests are held.
const (
	fenceLease   = 8 * time.Second
	fenceRenew   = 6 * time.Second
	fenceRetry   = time.Second
	fenceDelay   = 20 * time.Second
	fenceShards  = 8
	fenceUpdates = 5 * time.Second // how long updates flow at the start of the delay, less than fenceRenew
)

// TestAdmissionFencesDelayedWrites holds a write on the wire while its
// shard's Lease moves: replica kshard-1 reaches the API server through a
// proxy that delays what it sends by longer than a lease, while the spec of
// its bindings changes. Its writes pass its own fence (WriteContext) when
// they are sent and arrive after kshard-0 took the shards over. The API
// server's own audit log then shows:
//
//   - with deploy/base's kshard-shard-writes policy, each late write refused
//     (403, the policy's message), none committed outside a tenure, and the
//     API server's count of the policy's denials grown;
//   - without it (the policy binding deleted), late writes committed
//     outside the writer's tenure, which the checker (internal/audit) names:
//     the check can fail, and the fault is real.
func TestAdmissionFencesDelayedWrites(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c)
	cc := startConfigCenter(ctx, t, configcenter.SeedOptions{Domains: fenceShards, KeysPerDomain: 3, ValueBytes: 16})
	apiURL, err := url.Parse(cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := netfault.Listen(apiURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	timing := []string{"--shards", strconv.Itoa(fenceShards), "--lease-duration", fenceLease.String(),
		"--renew-deadline", fenceRenew.String(), "--retry-period", fenceRetry.String(), "--requeue-max-delay", "2s"}
	runReplicaAs(ctx, t, ns, "kshard-0", cp.Config.Host, cc.Endpoint(), timing...)
	runReplicaAs(ctx, t, ns, "kshard-1", proxy.Addr(), cc.Endpoint(), timing...)

	app := uniqueName("app")
	createNamespace(ctx, t, c, app, targets)
	// The package's other tests run rings of their own that would take
	// this test's bindings up while the namespace terminates: they go
	// first, and the test waits until they are gone.
	t.Cleanup(func() {
		if err := c.DeleteAllOf(context.Background(), &configv1alpha1.ConfigBinding{}, client.InNamespace(app)); err != nil {
			t.Error(err)
			return
		}
		controlplane.Eventually(t, 2*time.Minute, "the test's bindings deleted", func() error {
			var list configv1alpha1.ConfigBindingList
			if err := c.List(context.Background(), &list, client.InNamespace(app)); err != nil {
				return err
			}
			if n := len(list.Items); n > 0 {
				return fmt.Errorf("%d bindings left", n)
			}
			return nil
		})
	})
	bindings := createBindings(ctx, t, c, app, 40, fenceShards)
	settled := func(what string) {
		t.Helper()
		controlplane.Eventually(t, 3*time.Minute, what, func() error {
			if err := allReady(ctx, c, bindings); err != nil {
				return err
			}
			held := shardsHeld(ctx, t, c, ns)
			if len(held["kshard-0"]) == 0 || len(held["kshard-1"]) == 0 {
				return fmt.Errorf("shards held %v: want both replicas holding some", held)
			}
			return nil
		})
	}
	settled("every binding Ready, both replicas holding shards")

	probe := probeFence(ctx, t, c, ns, app)
	// The package's other tests run rings too, on the same API server:
	// only this test's objects are checked against this test's Leases.
	checkOpts := audit.CheckOptions{Ring: "kshard", LeaseNamespace: ns, Namespaces: []string{app},
		ReplicaUsers: []string{"system:serviceaccount:" + ns + ":kshard"}}

	// Fenced by the API server.
	controlplane.Eventually(t, time.Minute, "the shard-writes policy refusing a pod that holds no Lease", func() error { return probe(true) })
	denials := policyDenials(ctx, t)
	fenced := time.Now()
	delayWrites(ctx, t, c, proxy, ns, bindings, []string{"key-0", "key-1", "key-2"})
	settled("settled after the delayed writes (fenced)")
	e := audit.CheckExclusive(readAPIAudit(t), checkOpts)
	t.Logf("fenced: %s", e)
	if !e.OK() {
		t.Errorf("with the shard-writes policy, writes committed outside a tenure:\n%s", e)
	}
	if n := countSince(e.Refused, fenced, "kshard-1_"); n == 0 {
		t.Errorf("no write of the delayed replica was refused by the policy; refused: %v", e.Refused)
	} else if grown := policyDenials(ctx, t) - denials; grown < float64(n) {
		t.Errorf("the audit log shows %d refused writes, the API server counted %v denials of the policy", n, grown)
	}
	if e.Writes() == 0 || e.LeaseWrites == 0 {
		t.Errorf("the audit log shows no replica writes: %s", e)
	}

	// Not fenced by the API server: the checker must see the late writes.
	unbindFencing(ctx, t, c, ns)
	controlplane.Eventually(t, time.Minute, "the shard-writes policy no longer in force", func() error { return probe(false) })
	unfenced := time.Now()
	delayWrites(ctx, t, c, proxy, ns, bindings, []string{"key-1", "key-2"})
	settled("settled after the delayed writes (not fenced)")
	e = audit.CheckExclusive(readAPIAudit(t), checkOpts)
	t.Logf("not fenced: %s", e)
	if n := countSince(e.Stray, unfenced, "kshard-1_"); n == 0 {
		t.Errorf("without the policy the delayed writes were not seen committed outside a tenure: the check cannot fail, or the fault did not happen:\n%s", e)
	}
	if n := countSince(e.Stray, time.Time{}, "") - countSince(e.Stray, unfenced, ""); n != 0 {
		t.Errorf("%d writes outside a tenure before the policy was removed:\n%s", n, e)
	}
}

// delayWrites delays what kshard-1 sends by fenceDelay and, while the delay
// starts, changes the keys of its bindings back and forth between two sets,
// so that it sends writes that arrive after its shards moved; then it sets
// the keys to final, a set that is neither of the two nor the keys before.
// kshard-0 writes final once it took the shards over, and the writes
// kshard-1 sent carry one of the other two: a late write commits a change
// (or is refused), never a no-op the checker rightly excuses. (When the
// last change happened to repeat the first, the held writes matched what
// kshard-0 wrote, and the check could not see them.) It returns once the
// delay is over and the held bytes delivered.
func delayWrites(ctx context.Context, t *testing.T, c client.Client, proxy *netfault.Proxy, ns string, bindings []client.ObjectKey, final []string) {
	t.Helper()
	held := shardsHeld(ctx, t, c, ns)["kshard-1"]
	var victims []client.ObjectKey
	for _, k := range bindings {
		var cb configv1alpha1.ConfigBinding
		if err := c.Get(ctx, k, &cb); err != nil {
			t.Fatal(err)
		}
		if s, err := strconv.Atoi(cb.Labels[sharding.LabelShard]); err == nil && held[int32(s)] {
			victims = append(victims, k)
		}
	}
	if len(victims) == 0 {
		t.Fatalf("kshard-1 holds shards %v but none of the bindings", held)
	}
	setKeys := func(keys []string) {
		patch := fmt.Sprintf(`{"spec":{"keys":["%s"]}}`, strings.Join(keys, `","`))
		for _, k := range victims {
			cb := &configv1alpha1.ConfigBinding{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
			if err := c.Patch(ctx, cb, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
				t.Fatal(err)
			}
		}
	}
	passing := [][]string{{"key-0"}, {"key-2"}}
	start := time.Now()
	proxy.Delay(fenceDelay)
	for i := 0; time.Since(start) < fenceUpdates; i++ {
		setKeys(passing[i%len(passing)])
		time.Sleep(300 * time.Millisecond)
	}
	setKeys(final)
	if rest := fenceDelay - time.Since(start); rest > 0 {
		time.Sleep(rest + 2*time.Second)
	}
	if proxy.Delayed() == 0 {
		t.Fatal("the proxy delayed nothing kshard-1 sent")
	}
}

// unbindFencing deletes the shard-writes policy's bindings of the base
// installed in ns, and returns them as they were.
func unbindFencing(ctx context.Context, t testing.TB, c client.Client, ns string) []admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	t.Helper()
	var list admissionregistrationv1.ValidatingAdmissionPolicyBindingList
	if err := c.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	var out []admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, b := range list.Items {
		if b.Spec.PolicyName != audit.FencingPolicy+"-"+ns {
			continue
		}
		if err := c.Delete(ctx, &b); err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		t.Fatalf("no binding of policy %s-%s", audit.FencingPolicy, ns)
	}
	return out
}

// createBindings creates n ConfigBindings cb-<i> in ns over the config
// center's seeded domains domain-0 … domain-<domains-1>, each binding key-0
// and key-1 into ConfigMap cb-<i>.
func createBindings(ctx context.Context, t testing.TB, c client.Client, ns string, n, domains int) []client.ObjectKey {
	t.Helper()
	keys := make([]client.ObjectKey, 0, n)
	for i := range n {
		cb := &configv1alpha1.ConfigBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cb-%d", i)},
			Spec: configv1alpha1.ConfigBindingSpec{
				Domain: fmt.Sprintf("domain-%d", i%domains),
				Keys:   []configv1alpha1.ConfigKey{"key-0", "key-1"},
				Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: fmt.Sprintf("cb-%d", i)},
			},
		}
		if err := c.Create(ctx, cb); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, client.ObjectKeyFromObject(cb))
	}
	return keys
}

// shardsHeld returns the shards each replica holds, by the shard Leases.
func shardsHeld(ctx context.Context, t *testing.T, c client.Client, ns string) map[string]map[int32]bool {
	t.Helper()
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.InNamespace(ns), client.MatchingLabels{sharding.LabelLeaseKind: lease.KindShard}); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[int32]bool{}
	for _, l := range leases.Items {
		n, ok := lease.ParseShardName("kshard", l.Name, fenceShards)
		holder := lease.HolderReplica(ptr.Deref(l.Spec.HolderIdentity, ""))
		if !ok || holder == "" {
			continue
		}
		if out[holder] == nil {
			out[holder] = map[int32]bool{}
		}
		out[holder][n] = true
	}
	return out
}

// allReady says which binding is not Ready at its latest generation.
func allReady(ctx context.Context, c client.Client, keys []client.ObjectKey) error {
	for _, k := range keys {
		var cb configv1alpha1.ConfigBinding
		if err := c.Get(ctx, k, &cb); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
		if cond == nil || cond.Status != metav1.ConditionTrue || cb.Status.ObservedGeneration != cb.Generation {
			return fmt.Errorf("binding %s not Ready at generation %d: %+v", k, cb.Generation, cb.Status)
		}
	}
	return nil
}

// probeFence returns a check of whether the shard-writes policy is in
// force: a dry-run write, as a pod that holds no Lease, to a ConfigMap of a
// held shard, must be refused with the policy's message (want true) or
// admitted (want false). A dry run commits nothing, and the checker ignores
// it.
func probeFence(ctx context.Context, t *testing.T, c client.Client, ns, app string) func(want bool) error {
	t.Helper()
	pc := tokenClient(t, podToken(ctx, t, ns, "kshard-probe"))
	return func(want bool) error {
		var cms corev1.ConfigMapList
		if err := c.List(ctx, &cms, client.InNamespace(app), client.HasLabels{sharding.LabelShard}); err != nil {
			return err
		}
		if len(cms.Items) == 0 {
			return fmt.Errorf("no ConfigMap of a shard in %s", app)
		}
		cm := &cms.Items[0]
		err := pc.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"probe":"x"}}}`)), client.DryRunAll)
		refused := err != nil && strings.Contains(err.Error(), "kshard fencing")
		switch {
		case want && !refused:
			return fmt.Errorf("a pod holding no Lease wrote ConfigMap %s (shard %s): %v", cm.Name, cm.Labels[sharding.LabelShard], err)
		case !want && err != nil:
			return fmt.Errorf("still refused: %v", err)
		}
		return nil
	}
}

// policyDenials reads the API server's own count of requests the
// shard-writes policy denied.
func policyDenials(ctx context.Context, t *testing.T) float64 {
	t.Helper()
	return apiServerCount(ctx, t, "apiserver_validating_admission_policy_check_total", func(m *dto.Metric) bool {
		return strings.HasPrefix(promtext.Label(m, "policy"), audit.FencingPolicy) && promtext.Label(m, "enforcement_action") == "deny"
	})
}

// apiServerCount sums a counter of the API server's /metrics over the
// series match accepts. A metric the server does not export fails the
// test: a count of zero must mean none.
func apiServerCount(ctx context.Context, t *testing.T, name string, match func(*dto.Metric) bool) float64 {
	t.Helper()
	fams, err := cp.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fam, ok := fams[name]
	if !ok {
		t.Fatalf("the API server exports no %s", name)
	}
	var n float64
	for _, m := range fam.GetMetric() {
		if match(m) {
			n += promtext.Value(m)
		}
	}
	return n
}

// readAPIAudit reads the control plane's audit log so far.
func readAPIAudit(t *testing.T) *audit.APILog {
	t.Helper()
	l, err := audit.ReadAPILogFile(apiAudit)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// countSince counts the writes received at or after since by a holder
// identity with the given prefix.
func countSince(ws []audit.Write, since time.Time, holderPrefix string) int {
	n := 0
	for _, w := range ws {
		if !w.Received.Before(since) && strings.HasPrefix(w.Holder, holderPrefix) {
			n++
		}
	}
	return n
}
