package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding/lease"
)

// The attacker's world: its pod holds shard 7's Lease, another replica
// holds shard 5's and the labeler Lease, shard 3's Lease is held by nobody
// (as deploy/base ships it), shard 9 has no Lease (an administrator
// deleted it).
const (
	ownShard, foreignShard, freeShard, leaselessShard = "7", "5", "3", "9"
	attacker, victim                                  = "kshard-0", "kshard-1"
)

// outcome is what the API server did with one attempted write.
type outcome int

const (
	admitted outcome = iota
	refusedByFence
	refusedByRBAC
)

func (o outcome) String() string {
	return [...]string{"admitted", "refused by an admission policy", "refused by RBAC"}[o]
}

// attempt is one write the attacker tries, and whether it is inside the
// attacker's tenure (and must be admitted) or outside it (and must not).
type attempt struct {
	what   string
	inside bool
	write  func() error
}

// TestFenceHasNoSideDoor tries, with a pod-bound token of deploy/base's
// ServiceAccount for pod kshard-0 (holding shard 7's Lease only), every
// write the replicas' RBAC and the API permit on every kind kshard touches:
// create, update, patch and delete of ConfigMaps, ConfigBindings and their
// status, ExternalDomains and their status, the Leases and the shard table,
// for the shard it holds, a shard another pod holds, a shard whose Lease
// does not exist and no shard, relabelling, unlabelling and mislabelling
// each. Every write inside its tenure is admitted, every write outside it
// refused, by deploy/base as kustomize builds it. Dry runs: admission
// decides them as it would the real writes, and they change nothing for the
// next attempt.
//
// Then, with the fence unbound, a relabel out of shard 5 into the
// attacker's shard is committed, and the audit-log check (internal/audit),
// which reads the API server's own record, names it outside a tenure.
func TestFenceHasNoSideDoor(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c, "mirror")
	app := uniqueName("app")
	createNamespace(ctx, t, c, app, targets)
	closed := uniqueName("closed")
	createNamespace(ctx, t, c, closed, nil)

	attackerHolder, victimHolder := attacker+"_"+uniqueName("inc"), victim+"_"+uniqueName("inc")
	for name, h := range map[string]string{
		lease.ShardName("kshard", 7):         attackerHolder,
		lease.ShardName("kshard", 5):         victimHolder,
		lease.LabelerName("kshard"):          victimHolder,
		lease.MemberName("kshard", attacker): attackerHolder,
		lease.MemberName("kshard", victim):   victimHolder,
	} {
		// Labelled as the replicas label them.
		kind := lease.KindShard
		if strings.Contains(name, "-member-") {
			kind = lease.KindMember
		}
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{"kshard.dev/ring": "kshard", "kshard.dev/lease-kind": kind}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(h), LeaseDurationSeconds: ptr.To[int32](3600),
				RenewTime: ptr.To(metav1.NewMicroTime(time.Now()))}}
		holdLease(ctx, t, c, l)
	}
	if err := c.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lease.ShardName("kshard", 9)}}); err != nil {
		t.Fatal(err)
	}

	// The objects, created by the cluster's admin.
	binding := func(name, shard string) *configv1alpha1.ConfigBinding {
		cb := &configv1alpha1.ConfigBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: name},
			Spec: configv1alpha1.ConfigBindingSpec{Domain: "d-" + name, Keys: []configv1alpha1.ConfigKey{"k"},
				Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: name}},
		}
		if shard != "" {
			cb.Labels = map[string]string{"kshard.dev/shard": shard, "kshard.dev/domain": "d-" + name}
		}
		if err := c.Create(ctx, cb); err != nil {
			t.Fatal(err)
		}
		return cb
	}
	b5, b7, bu := binding("b5", foreignShard), binding("b7", ownShard), binding("bu", "")
	// Other tests' replicas watch every namespace: none must find these.
	t.Cleanup(func() {
		if err := c.DeleteAllOf(context.Background(), &configv1alpha1.ConfigBinding{}, client.InNamespace(app)); err != nil {
			t.Error(err)
		}
	})
	target := func(namespace, name, shard string, owner *configv1alpha1.ConfigBinding) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "kshard"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: configv1alpha1.GroupVersion.String(), Kind: "ConfigBinding",
				Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}},
			Data: map[string]string{"k": "v"}}
		if shard != "" {
			cm.Labels["kshard.dev/shard"] = shard
			cm.Labels["kshard.dev/domain"] = owner.Spec.Domain
		}
		return cm
	}
	cm5, cm7 := target(app, "b5", foreignShard, b5), target(app, "b7", ownShard, b7)
	mirror := func(name, shard string) *configv1alpha1.ExternalDomain {
		ed := &configv1alpha1.ExternalDomain{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"kshard.dev/shard": shard, "kshard.dev/ring": "kshard"}},
			Spec: configv1alpha1.ExternalDomainSpec{Domain: name}}
		return ed
	}
	ed5, ed7 := mirror(uniqueName("ed5"), foreignShard), mirror(uniqueName("ed7"), ownShard)
	table := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: replica.DefaultShardTable}, Data: map[string]string{"d-b5": "5"}}
	for _, o := range []client.Object{cm5, cm7, ed5, ed7, table} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, o := range []client.Object{ed5, ed7} {
			_ = c.Delete(context.Background(), o)
		}
	})

	sa := podClient(ctx, t, ns, attacker, attackerHolder)
	labeler := podClient(ctx, t, ns, victim, victimHolder)
	controlplane.Eventually(t, time.Minute, "RBAC and the fence in force for the attacker", func() error {
		err := sa.Patch(ctx, cm5.DeepCopy(), merge(`{"metadata":{"annotations":{"probe":"x"}}}`), client.DryRunAll)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "kshard fencing") {
			return fmt.Errorf("an annotation on a shard-5 ConfigMap: %v", err)
		}
		// The labels policy is loaded apart from the writes policy: a
		// relabel out of the ring's shards must be refused by it too.
		err = sa.Patch(ctx, cm7.DeepCopy(), merge(`{"metadata":{"labels":{"kshard.dev/shard":"64"}}}`), client.DryRunAll)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "shards (label") {
			return fmt.Errorf("a shard-7 ConfigMap relabelled 64: %v", err)
		}
		return sa.Patch(ctx, cm7.DeepCopy(), merge(`{"metadata":{"annotations":{"probe":"x"}}}`), client.DryRunAll)
	})

	dry := client.DryRunAll
	labels := func(shard string) string {
		if shard == "" {
			return `{"kshard.dev/shard":null,"kshard.dev/domain":null}`
		}
		return fmt.Sprintf(`{"kshard.dev/shard":%q}`, shard)
	}
	patchCM := func(cm *corev1.ConfigMap, patch string) func() error {
		return func() error { return sa.Patch(ctx, cm.DeepCopy(), merge(patch), dry) }
	}
	putCM := func(cm *corev1.ConfigMap, edit func(*corev1.ConfigMap)) func() error {
		return func() error {
			var cur corev1.ConfigMap
			if err := c.Get(ctx, client.ObjectKeyFromObject(cm), &cur); err != nil {
				return err
			}
			edit(&cur)
			return sa.Update(ctx, &cur, dry)
		}
	}
	createCM := func(cm *corev1.ConfigMap) func() error {
		return func() error { cm := cm.DeepCopy(); cm.Name = uniqueName("new"); return sa.Create(ctx, cm, dry) }
	}
	patchCB := func(cb *configv1alpha1.ConfigBinding, patch string) func() error {
		return func() error { return sa.Patch(ctx, cb.DeepCopy(), merge(patch), dry) }
	}
	patchStatus := func(cb *configv1alpha1.ConfigBinding) func() error {
		return func() error {
			return sa.Status().Patch(ctx, cb.DeepCopy(), merge(`{"status":{"observedGeneration":1}}`), &client.SubResourcePatchOptions{PatchOptions: client.PatchOptions{DryRun: []string{metav1.DryRunAll}}})
		}
	}
	edStatus := func(ed *configv1alpha1.ExternalDomain) func() error {
		return func() error {
			var cur configv1alpha1.ExternalDomain
			if err := c.Get(ctx, client.ObjectKeyFromObject(ed), &cur); err != nil {
				return err
			}
			cur.Status.KeyCount = 3
			return sa.Status().Update(ctx, &cur, &client.SubResourceUpdateOptions{UpdateOptions: client.UpdateOptions{DryRun: []string{metav1.DryRunAll}}})
		}
	}
	deleteLease := func(name string) func() error {
		return func() error {
			return sa.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, dry)
		}
	}
	cm5Labels := func(shard string) func(*corev1.ConfigMap) {
		return func(cm *corev1.ConfigMap) {
			if shard == "" {
				delete(cm.Labels, "kshard.dev/shard")
				return
			}
			cm.Labels["kshard.dev/shard"] = shard
		}
	}

	attempts := []attempt{
		// ConfigMaps of the attacker's shard.
		{"annotate a ConfigMap of its shard", true, patchCM(cm7, `{"metadata":{"annotations":{"a":"b"}}}`)},
		{"change the data of a ConfigMap of its shard", true, patchCM(cm7, `{"data":{"k":"w"}}`)},
		{"update (PUT) a ConfigMap of its shard (replicas patch, never update)", false, putCM(cm7, func(cm *corev1.ConfigMap) { cm.Data["k"] = "w" })},
		{"create a ConfigMap in its shard", true, createCM(target(app, "", ownShard, b7))},
		{"remove its shard's label from a ConfigMap, nothing else (hand it over)", true, patchCM(cm7, `{"metadata":{"labels":`+labels("")+`}}`)},
		{"remove its shard's label from a ConfigMap, with data", false, patchCM(cm7, `{"metadata":{"labels":`+labels("")+`},"data":{"k":"w"}}`)},
		{"relabel a ConfigMap of its shard 7 -> 5", false, patchCM(cm7, `{"metadata":{"labels":`+labels(foreignShard)+`}}`)},
		{"relabel a ConfigMap of its shard 7 -> 07", false, patchCM(cm7, `{"metadata":{"labels":`+labels("07")+`}}`)},
		{"relabel a ConfigMap of its shard 7 -> 9 (no Lease)", false, patchCM(cm7, `{"metadata":{"labels":`+labels(leaselessShard)+`}}`)},
		{"relabel a ConfigMap of its shard 7 -> 3 (held by nobody)", false, patchCM(cm7, `{"metadata":{"labels":`+labels(freeShard)+`}}`)},
		{"relabel a ConfigMap of its shard 7 -> 64 (no such shard)", false, patchCM(cm7, `{"metadata":{"labels":`+labels("64")+`}}`)},
		// ConfigMaps of another pod's shard, of a shard with no Lease, of none.
		{"annotate a shard-5 ConfigMap", false, patchCM(cm5, `{"metadata":{"annotations":{"a":"b"}}}`)},
		{"change a shard-5 ConfigMap's data", false, patchCM(cm5, `{"data":{"k":"w"}}`)},
		{"relabel a shard-5 ConfigMap 5 -> 7, with data", false, patchCM(cm5, `{"metadata":{"labels":`+labels(ownShard)+`},"data":{"k":"w"}}`)},
		{"relabel a shard-5 ConfigMap 5 -> 7", false, patchCM(cm5, `{"metadata":{"labels":`+labels(ownShard)+`}}`)},
		{"remove a shard-5 ConfigMap's label, with data", false, patchCM(cm5, `{"metadata":{"labels":`+labels("")+`},"data":{"k":"w"}}`)},
		{"remove a shard-5 ConfigMap's label, nothing else", false, patchCM(cm5, `{"metadata":{"labels":`+labels("")+`}}`)},
		{"relabel a shard-5 ConfigMap 5 -> 05, with data", false, patchCM(cm5, `{"metadata":{"labels":`+labels("05")+`},"data":{"k":"w"}}`)},
		{"update (PUT) a shard-5 ConfigMap relabelled 5 -> 7", false, putCM(cm5, cm5Labels(ownShard))},
		{"update (PUT) a shard-5 ConfigMap unlabelled", false, putCM(cm5, cm5Labels(""))},
		{"create a ConfigMap in shard 5", false, createCM(target(app, "", foreignShard, b5))},
		{"create a ConfigMap in shard 9 (no Lease)", false, createCM(target(app, "", leaselessShard, b5))},
		{"create a ConfigMap in shard 3 (held by nobody)", false, createCM(target(app, "", freeShard, b5))},
		{"create a ConfigMap of a shard-5 binding with no shard label", false, createCM(target(app, "", "", b5))},
		{"create a ConfigMap with shard label 07", false, createCM(target(app, "", "07", b7))},
		{"create a ConfigMap in its shard where the namespace did not opt in", false, createCM(target(closed, "", ownShard, b7))},
		{"delete a ConfigMap of its shard", false, func() error { return sa.Delete(ctx, cm7.DeepCopy(), dry) }},
		{"delete a shard-5 ConfigMap", false, func() error { return sa.Delete(ctx, cm5.DeepCopy(), dry) }},
		// ConfigBindings: only the labeler stamps labels, a holder removes
		// its shard's; nothing else of them changes.
		{"change a ConfigBinding's spec, its shard", false, patchCB(b7, `{"spec":{"keys":["x"]}}`)},
		{"change a ConfigBinding's spec, shard 5", false, patchCB(b5, `{"spec":{"target":{"configMapName":"other"}}}`)},
		{"change an unlabelled ConfigBinding's spec", false, patchCB(bu, `{"spec":{"keys":["x"]}}`)},
		{"annotate a ConfigBinding of its shard", false, patchCB(b7, `{"metadata":{"annotations":{"a":"b"}}}`)},
		{"add a label to a ConfigBinding of its shard", false, patchCB(b7, `{"metadata":{"labels":{"team":"x"}}}`)},
		{"add a finalizer to a ConfigBinding of its shard", false, patchCB(b7, `{"metadata":{"finalizers":["x/y"]}}`)},
		{"remove its shard's label from a ConfigBinding (hand it to the labeler)", true, patchCB(b7, `{"metadata":{"labels":`+labels("")+`}}`)},
		{"remove a shard-5 ConfigBinding's label", false, patchCB(b5, `{"metadata":{"labels":`+labels("")+`}}`)},
		{"relabel a ConfigBinding 5 -> 7 (not the labeler)", false, patchCB(b5, `{"metadata":{"labels":`+labels(ownShard)+`}}`)},
		{"relabel a ConfigBinding 7 -> 5 (not the labeler)", false, patchCB(b7, `{"metadata":{"labels":`+labels(foreignShard)+`}}`)},
		{"stamp shard 7 on an unlabelled ConfigBinding (not the labeler)", false, patchCB(bu, `{"metadata":{"labels":`+labels(ownShard)+`}}`)},
		{"stamp shard 07 on an unlabelled ConfigBinding", false, patchCB(bu, `{"metadata":{"labels":`+labels("07")+`}}`)},
		{"create a ConfigBinding", false, func() error {
			cb := b7.DeepCopy()
			cb.ObjectMeta = metav1.ObjectMeta{Namespace: app, Name: uniqueName("cb"), Labels: b7.Labels}
			return sa.Create(ctx, cb, dry)
		}},
		{"delete a ConfigBinding of its shard", false, func() error { return sa.Delete(ctx, b7.DeepCopy(), dry) }},
		{"patch the status of a ConfigBinding of its shard", true, patchStatus(b7)},
		{"patch the status of a shard-5 ConfigBinding", false, patchStatus(b5)},
		{"patch the status of an unlabelled ConfigBinding", false, patchStatus(bu)},
		// ExternalDomains (the mirror component's rights).
		{"create an ExternalDomain in its shard", true, func() error {
			ed := mirror(uniqueName("new"), ownShard)
			return sa.Create(ctx, ed, dry)
		}},
		{"create an ExternalDomain in shard 5", false, func() error { return sa.Create(ctx, mirror(uniqueName("new"), foreignShard), dry) }},
		{"create an ExternalDomain with no shard label", false, func() error {
			ed := mirror(uniqueName("new"), "")
			delete(ed.Labels, "kshard.dev/shard")
			return sa.Create(ctx, ed, dry)
		}},
		{"update the status of an ExternalDomain of its shard", true, edStatus(ed7)},
		{"update the status of a shard-5 ExternalDomain", false, edStatus(ed5)},
		{"relabel an ExternalDomain 5 -> 7", false, func() error {
			return sa.Patch(ctx, ed5.DeepCopy(), merge(`{"metadata":{"labels":`+labels(ownShard)+`}}`), dry)
		}},
		{"delete an ExternalDomain of its shard", true, func() error { return sa.Delete(ctx, ed7.DeepCopy(), dry) }},
		{"delete a shard-5 ExternalDomain", false, func() error { return sa.Delete(ctx, ed5.DeepCopy(), dry) }},
		// Leases: none deleted but its own member Lease.
		{"delete its own member Lease (leaving the ring)", true, deleteLease(lease.MemberName("kshard", attacker))},
		{"delete another replica's member Lease", false, deleteLease(lease.MemberName("kshard", victim))},
		{"delete shard 5's Lease", false, deleteLease(lease.ShardName("kshard", 5))},
		{"delete its own shard 7's Lease", false, deleteLease(lease.ShardName("kshard", 7))},
		{"delete the labeler Lease", false, deleteLease(lease.LabelerName("kshard"))},
		// The shard table: the labeler's, written only by its holder.
		{"patch the shard table (not the labeler)", false, func() error {
			return sa.Patch(ctx, table.DeepCopy(), merge(`{"data":{"d-b5":"7"}}`), dry)
		}},
		{"update (PUT) the shard table (not the labeler)", false, func() error {
			var cur corev1.ConfigMap
			if err := c.Get(ctx, client.ObjectKeyFromObject(table), &cur); err != nil {
				return err
			}
			cur.Data["d-b5"] = "7"
			return sa.Update(ctx, &cur, dry)
		}},
		{"delete the shard table", false, func() error { return sa.Delete(ctx, table.DeepCopy(), dry) }},
	}

	// The labeler (kshard-1) stamps and moves bindings, changing nothing
	// else, and writes the shard table.
	byLabeler := func(cb *configv1alpha1.ConfigBinding, patch string) func() error {
		return func() error { return labeler.Patch(ctx, cb.DeepCopy(), merge(patch), dry) }
	}
	attempts = append(attempts,
		attempt{"the labeler stamps shard 5 on an unlabelled ConfigBinding", true, byLabeler(bu, `{"metadata":{"labels":`+labels(foreignShard)+`}}`)},
		attempt{"the labeler moves a ConfigBinding 7 -> 5", true, byLabeler(b7, `{"metadata":{"labels":`+labels(foreignShard)+`}}`)},
		attempt{"the labeler stamps a label and changes the spec", false, byLabeler(bu, `{"metadata":{"labels":`+labels(foreignShard)+`},"spec":{"keys":["x"]}}`)},
		attempt{"the labeler stamps shard 64 (no such shard)", false, byLabeler(bu, `{"metadata":{"labels":`+labels("64")+`}}`)},
		attempt{"the labeler patches the shard table", true, func() error {
			return labeler.Patch(ctx, table.DeepCopy(), merge(`{"data":{"d-b7":"7"}}`), dry)
		}},
	)

	counts := map[bool]map[outcome]int{true: {}, false: {}}
	for _, a := range attempts {
		got, err := classify(a.write())
		if err != nil {
			t.Errorf("%s: %v", a.what, err)
			continue
		}
		counts[a.inside][got]++
		switch {
		case a.inside && got != admitted:
			t.Errorf("inside its tenure, %s: %s", a.what, got)
		case !a.inside && got == admitted:
			t.Errorf("OUTSIDE its tenure, %s: admitted", a.what)
		}
	}
	t.Logf("%d writes attempted as pod %s (holding shard %s's Lease only) and the labeler: inside their tenures %d, admitted %d; "+
		"outside it %d, admitted %d, refused by an admission policy %d, refused by RBAC %d",
		len(attempts), attacker, ownShard, counts[true][admitted]+counts[true][refusedByFence]+counts[true][refusedByRBAC], counts[true][admitted],
		counts[false][admitted]+counts[false][refusedByFence]+counts[false][refusedByRBAC], counts[false][admitted],
		counts[false][refusedByFence], counts[false][refusedByRBAC])

	// A planted relabel, committed with the fence unbound: the audit-log
	// check must name it, by the shard it left.
	var bindings admissionregistrationv1.ValidatingAdmissionPolicyBindingList
	if err := c.List(ctx, &bindings); err != nil {
		t.Fatal(err)
	}
	for _, b := range bindings.Items {
		if strings.Contains(b.Name, "-"+ns) {
			if err := c.Delete(ctx, &b); err != nil {
				t.Fatal(err)
			}
		}
	}
	controlplane.Eventually(t, time.Minute, "the fence unbound", func() error {
		return sa.Patch(ctx, cm5.DeepCopy(), merge(`{"metadata":{"annotations":{"probe":"x"}}}`), client.DryRunAll)
	})
	if err := sa.Patch(ctx, cm5.DeepCopy(), merge(`{"metadata":{"labels":`+labels(ownShard)+`}}`)); err != nil {
		t.Fatalf("the planted relabel: %v", err)
	}
	e := audit.CheckExclusive(readAPIAudit(t), audit.CheckOptions{Ring: "kshard", LeaseNamespace: ns, Namespaces: []string{app},
		ReplicaUsers: []string{"system:serviceaccount:" + ns + ":kshard"}})
	if len(e.Stray) != 1 || e.Stray[0].Name != cm5.Name || e.Stray[0].Holder != attackerHolder {
		t.Errorf("the audit-log check did not name the planted relabel of ConfigMap %s (5 -> 7) alone:\n%s", cm5.Name, e)
	}
}

// TestFenceStopsOnlyTheReplicas checks that the fence, installed as
// deploy/base ships it and before any replica has run, refuses a replica's
// token a write to an object of a shard nobody holds, and admits the same
// writes from the cluster's administrator: creating, changing, relabelling
// and deleting shard-labelled ConfigMaps, relabelling a ConfigBinding,
// creating an ExternalDomain. The API server resolves a binding's param (the
// shard's Lease) before the policy's match conditions, so without the shard
// Leases deploy/base ships with its bindings the administrator's writes are
// refused too ("no params found"), until a replica first takes the shard.
// Dry runs: admission decides them as it would the real writes.
func TestFenceStopsOnlyTheReplicas(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c)
	app := uniqueName("app")
	createNamespace(ctx, t, c, app, targets)
	const shard, other = "11", "12"
	cb := &configv1alpha1.ConfigBinding{ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: "b"},
		Spec: configv1alpha1.ConfigBindingSpec{Domain: "d-b", Keys: []configv1alpha1.ConfigKey{"k"},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "b"}}}
	if err := c.Create(ctx, cb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), cb) })
	// A target as kshard writes one (managed-by, controlled by its binding),
	// so that of the fence's policies only the shard's refuses the replica.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: "admins",
		Labels: map[string]string{"kshard.dev/shard": shard, "kshard.dev/domain": "d-b", "app.kubernetes.io/managed-by": "kshard"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: configv1alpha1.GroupVersion.String(), Kind: "ConfigBinding",
			Name: cb.Name, UID: cb.UID, Controller: ptr.To(true)}}},
		Data: map[string]string{"k": "v"}}
	newCM := func() *corev1.ConfigMap { o := cm.DeepCopy(); o.Name = uniqueName("new"); return o }
	dry := client.DryRunAll
	sa := podClient(ctx, t, ns, attacker, attacker+"_"+uniqueName("inc"))
	refused := func() error {
		err := sa.Create(ctx, newCM(), dry)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "kshard fencing") || !strings.Contains(err.Error(), "holder: nobody") {
			return fmt.Errorf("a replica's create of a ConfigMap in shard %s: %v", shard, err)
		}
		return nil
	}
	// The shard's binding in force (its refusal, whatever it says), before
	// the administrator's writes could pass for its absence.
	controlplane.Eventually(t, time.Minute, "the shard's binding in force", func() error {
		if err := sa.Create(ctx, newCM(), dry); err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+audit.FencingPolicy) {
			return fmt.Errorf("a replica's create of a ConfigMap in shard %s: %v", shard, err)
		}
		return nil
	})
	writes := map[string]func() error{
		"create a ConfigMap in shard " + shard: func() error { return c.Create(ctx, newCM(), dry) },
		"change its data":                      func() error { return c.Patch(ctx, cm.DeepCopy(), merge(`{"data":{"k":"w"}}`), dry) },
		"relabel it " + shard + " -> " + other: func() error {
			return c.Patch(ctx, cm.DeepCopy(), merge(`{"metadata":{"labels":{"kshard.dev/shard":"`+other+`"}}}`), dry)
		},
		"delete it": func() error { return c.Delete(ctx, cm.DeepCopy(), dry) },
		"label a ConfigBinding with shard " + shard: func() error {
			return c.Patch(ctx, cb.DeepCopy(), merge(`{"metadata":{"labels":{"kshard.dev/shard":"`+shard+`","kshard.dev/domain":"d-b"}}}`), dry)
		},
		"create an ExternalDomain in shard " + shard: func() error {
			name := uniqueName("ed")
			return c.Create(ctx, &configv1alpha1.ExternalDomain{ObjectMeta: metav1.ObjectMeta{Name: name,
				Labels: map[string]string{"kshard.dev/shard": shard, "kshard.dev/ring": "kshard"}},
				Spec: configv1alpha1.ExternalDomainSpec{Domain: name}}, dry)
		},
	}
	// The ConfigMap the changes above are tried on, created for real.
	controlplane.Eventually(t, time.Minute, "the administrator creating a ConfigMap in shard "+shard, func() error {
		if err := c.Create(ctx, cm.DeepCopy()); !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
	for name, write := range writes {
		// Eventually: the API server's informer of the params may not yet
		// have the Leases installBase applied.
		controlplane.Eventually(t, time.Minute, "the administrator: "+name, write)
	}
	controlplane.Eventually(t, time.Minute, "a replica's token refused a write to shard "+shard+", held by nobody", refused)
}

// podClient is a client with a token bound to pod id in ns, whose user
// agent names holder (as a replica's does, for the audit-log check).
func podClient(ctx context.Context, t *testing.T, ns, id, holder string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(tokenConfig(podToken(ctx, t, ns, id)))
	cfg.UserAgent = audit.UserAgent(rest.DefaultKubernetesUserAgent(), holder)
	c, err := client.New(cfg, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// classify says what the API server did with a write: admitted, or refused
// by an admission policy or by RBAC. Any other answer is an error.
func classify(err error) (outcome, error) {
	var status apierrors.APIStatus
	switch {
	case err == nil:
		return admitted, nil
	case !errors.As(err, &status):
		return 0, err
	case strings.Contains(status.Status().Message, "ValidatingAdmissionPolicy"):
		// 403 from a validation, 422 from a binding whose Lease is
		// missing (parameterNotFoundAction Deny).
		return refusedByFence, nil
	case apierrors.IsForbidden(err) && strings.Contains(status.Status().Message, " cannot "):
		return refusedByRBAC, nil
	}
	return 0, err
}

func merge(patch string) client.Patch { return client.RawPatch(types.MergePatchType, []byte(patch)) }
