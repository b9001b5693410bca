package configbinding_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configcenter/standin"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/reconcile/externaldomain"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

func mirrorMode(o *replica.Options) { o.ExternalSource = replica.SourceMirror }

// mirrorOf waits until the domain's mirror satisfies cond and returns it.
func (e *env) mirrorOf(t *testing.T, domain string, cond func(*configv1alpha1.ExternalDomain) error) *configv1alpha1.ExternalDomain {
	t.Helper()
	var ed configv1alpha1.ExternalDomain
	controlplane.Eventually(t, 2*time.Minute, "mirror of "+domain, func() error {
		if err := e.c.Get(context.Background(), client.ObjectKey{Name: domain}, &ed); err != nil {
			return err
		}
		return cond(&ed)
	})
	return &ed
}

// deleteMirrors removes the test's cluster-scoped mirrors when it ends.
func (e *env) deleteMirrors(t *testing.T, domains ...string) {
	t.Cleanup(func() {
		for _, d := range domains {
			_ = e.c.Delete(context.Background(), &configv1alpha1.ExternalDomain{ObjectMeta: metav1.ObjectMeta{Name: d}})
		}
	})
}

// syncedReason is a mirrorOf condition: the mirror's Synced condition has
// reason.
func syncedReason(reason string) func(*configv1alpha1.ExternalDomain) error {
	return func(ed *configv1alpha1.ExternalDomain) error {
		if c := meta.FindStatusCondition(ed.Status.Conditions, externaldomain.ConditionSynced); c == nil || c.Reason != reason {
			return fmt.Errorf("conditions %+v, want Synced with reason %s", ed.Status.Conditions, reason)
		}
		return nil
	}
}

func mirrored(key, value string) func(*configv1alpha1.ExternalDomain) error {
	return func(ed *configv1alpha1.ExternalDomain) error {
		if !meta.IsStatusConditionTrue(ed.Status.Conditions, externaldomain.ConditionSynced) {
			return fmt.Errorf("not synced: %+v", ed.Status.Conditions)
		}
		for _, k := range ed.Status.Keys {
			if k.Name == key && k.Value == value {
				return nil
			}
		}
		return fmt.Errorf("keys %+v lack %s=%s", ed.Status.Keys, key, value)
	}
}

// startMirroredApp starts a mirror-mode env named after domain, with key a
// = v1 in the config center and one binding "app" of it Synced, and returns
// the domain's mirror.
func startMirroredApp(t *testing.T, domain string, adjust ...func(*replica.Options)) (*env, *configv1alpha1.ExternalDomain) {
	t.Helper()
	e := startEnvWith(t, domain, append([]func(*replica.Options){mirrorMode}, adjust...)...)
	e.deleteMirrors(t, domain)
	if _, err := e.cc.Put(domain, "a", "v1"); err != nil {
		t.Fatal(err)
	}
	e.create(t, "app", domain, "a")
	e.waitReason(t, "app", configbinding.ReasonSynced)
	return e, e.mirrorOf(t, domain, mirrored("a", "v1"))
}

// TestMirrorChangeReachesConfigMap: with --external-source=mirror a domain's
// keys are mirrored into its ExternalDomain (sharded like its bindings), and
// a config-center change reaches the mirror and then the ConfigMap.
func TestMirrorChangeReachesConfigMap(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnvWith(t, "mirror", mirrorMode)
	const domain = "mirror-feed"
	e.deleteMirrors(t, domain)
	for _, k := range []string{"a", "b"} {
		if _, err := e.cc.Put(domain, k, "v-"+k); err != nil {
			t.Fatal(err)
		}
	}
	e.create(t, "app", domain, "a")
	e.waitReason(t, "app", configbinding.ReasonSynced)
	e.waitData(t, "app-config", map[string]string{"a": "v-a"})

	ed := e.mirrorOf(t, domain, mirrored("b", "v-b"))
	shard := sharding.ShardOf(domain, e.opts.Shards)
	if ed.Labels[sharding.LabelShard] != fmt.Sprint(shard) || ptr.Deref(ed.Status.Shard, -1) != shard ||
		ed.Status.Replica != "mirror-0" || ed.Status.KeyCount != 2 || ed.Status.LastSyncTime == nil {
		t.Fatalf("mirror labels %v status %+v", ed.Labels, ed.Status)
	}

	if _, err := e.cc.Put(domain, "a", "changed"); err != nil {
		t.Fatal(err)
	}
	e.mirrorOf(t, domain, mirrored("a", "changed"))
	e.waitData(t, "app-config", map[string]string{"a": "changed"})

	// A key created later heals a KeyNotFound binding through the mirror.
	e.create(t, "late", domain, "c")
	e.waitReason(t, "late", configbinding.ReasonKeyNotFound)
	if _, err := e.cc.Put(domain, "c", "v-c"); err != nil {
		t.Fatal(err)
	}
	e.waitReason(t, "late", configbinding.ReasonSynced)
	e.waitData(t, "late-config", map[string]string{"c": "v-c"})
}

// TestMirrorTooLarge: a domain above the mirror's size limit gets the
// TooLarge condition instead of a failed write loop, its bindings say
// DomainTooLarge, and both recover when the domain fits again.
func TestMirrorTooLarge(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnvWith(t, "mirror-big", func(o *replica.Options) { mirrorMode(o); o.MirrorMaxBytes = 1024 })
	const domain = "mirror-big"
	e.deleteMirrors(t, domain)
	big := strings.Repeat("x", 300)
	for i := range 5 {
		if _, err := e.cc.Put(domain, fmt.Sprintf("k%d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	e.create(t, "app", domain, "k0")
	cb := e.waitReason(t, "app", configbinding.ReasonDomainTooLarge)
	if c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady); !strings.Contains(c.Message, "mirror limit") {
		t.Fatalf("binding message does not say why: %q", c.Message)
	}
	ed := e.mirrorOf(t, domain, func(ed *configv1alpha1.ExternalDomain) error {
		c := meta.FindStatusCondition(ed.Status.Conditions, externaldomain.ConditionSynced)
		if c == nil || c.Reason != externaldomain.ReasonTooLarge {
			return fmt.Errorf("conditions %+v", ed.Status.Conditions)
		}
		return nil
	})
	if len(ed.Status.Keys) != 0 || ed.Status.KeyCount != 5 {
		t.Fatalf("too-large mirror holds %d keys, counts %d", len(ed.Status.Keys), ed.Status.KeyCount)
	}
	for i := 1; i < 5; i++ {
		if _, err := e.cc.Delete(domain, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	e.waitReason(t, "app", configbinding.ReasonSynced)
	e.waitData(t, "app-config", map[string]string{"k0": big})
}

// TestMirrorMovesWithShard: two replicas share the ring; every mirror is
// written by the holder of its domain's shard, and when that replica leaves,
// the mirror moves to the new holder, which keeps it current. The watch of
// every mirror write shows no domain ever written by its old holder after
// the new one started writing.
func TestMirrorMovesWithShard(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnvWith(t, "mirror-move", mirrorMode)
	second := e.opts
	second.Identity = "mirror-move-1"
	e.startReplica(t, second)
	// Find a replica-0 domain set: enough domains that both replicas hold some.
	var domains []string
	for i := range 12 {
		domains = append(domains, fmt.Sprintf("mirror-move-%d", i))
	}
	e.deleteMirrors(t, domains...)
	for i, d := range domains {
		if _, err := e.cc.Put(d, "k", "v1"); err != nil {
			t.Fatal(err)
		}
		e.create(t, fmt.Sprintf("app-%d", i), d, "k")
	}
	ctx := context.Background()
	holder := func(d string) (string, error) {
		var l coordinationv1.Lease
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.opts.LeaseNamespace, Name: lease.ShardName(e.opts.Ring, sharding.ShardOf(d, e.opts.Shards))}, &l); err != nil {
			return "", err
		}
		return lease.HolderReplica(ptr.Deref(l.Spec.HolderIdentity, "")), nil
	}
	// Wait for a stable ring where each mirror is written by its holder and
	// both replicas write some.
	controlplane.Eventually(t, 3*time.Minute, "mirrors written by their shard holders", func() error {
		writers := map[string]int{}
		for i, d := range domains {
			var ed configv1alpha1.ExternalDomain
			if err := e.c.Get(ctx, client.ObjectKey{Name: d}, &ed); err != nil {
				return err
			}
			h, err := holder(d)
			if err != nil {
				return err
			}
			if ed.Status.Replica != h {
				return fmt.Errorf("%s written by %q, shard held by %q", d, ed.Status.Replica, h)
			}
			writers[h]++
			var cb configv1alpha1.ConfigBinding
			if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: fmt.Sprintf("app-%d", i)}, &cb); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(cb.Status.Conditions, configbinding.ConditionReady) {
				return fmt.Errorf("%s not ready", cb.Name)
			}
		}
		if len(writers) != 2 {
			return fmt.Errorf("writers %v: want both replicas", writers)
		}
		return nil
	})

	// Record every mirror write from here on.
	w, err := newWatchClient(t).Watch(ctx, &configv1alpha1.ExternalDomainList{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	writes := map[string][]string{}
	go func() {
		for ev := range w.ResultChan() {
			ed, ok := ev.Object.(*configv1alpha1.ExternalDomain)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			mu.Lock()
			writes[ed.Name] = append(writes[ed.Name], ed.Status.Replica)
			mu.Unlock()
		}
	}()

	// The first replica leaves gracefully; the second takes every shard.
	e.stopFirst()
	for _, d := range domains {
		if _, err := e.cc.Put(d, "k", "v2"); err != nil {
			t.Fatal(err)
		}
	}
	for i, d := range domains {
		e.mirrorOf(t, d, mirrored("k", "v2"))
		e.waitData(t, fmt.Sprintf("app-%d-config", i), map[string]string{"k": "v2"})
	}
	mu.Lock()
	defer mu.Unlock()
	for _, d := range domains {
		seq := writes[d]
		if len(seq) == 0 || seq[len(seq)-1] != "mirror-move-1" {
			t.Errorf("%s: writes by %v, want the last by mirror-move-1", d, seq)
		}
		for i := 1; i < len(seq); i++ {
			if seq[i-1] == "mirror-move-1" && seq[i] != "mirror-move-1" {
				t.Errorf("%s written by %s after the new holder: writes %v", d, seq[i], seq)
			}
		}
	}
}

// TestMirrorLongRetryAfterIsCapped: the config center (or a proxy in front
// of it) answers 503 with Retry-After: 1h while a domain's mirror syncs. The
// mirror says Unavailable meanwhile, and once the service is back it catches
// up within the cap (--cache-max-retry-after), not an hour later.
func TestMirrorLongRetryAfterIsCapped(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnvWith(t, "mirror-ra", withStandin, func(o *replica.Options) { mirrorMode(o); o.Cache.MaxRetryAfter = 2 * time.Second })
	const domain = "mirror-ra"
	e.deleteMirrors(t, domain)
	if _, err := e.cc.Put(domain, "a", "v1"); err != nil {
		t.Fatal(err)
	}
	e.create(t, "app", domain, "a")
	e.waitReason(t, "app", configbinding.ReasonSynced)
	e.mirrorOf(t, domain, mirrored("a", "v1"))

	if err := e.standin.SetFaults(configcenter.Faults{Outage: true, RetryAfter: configcenter.Duration{Duration: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	// The change wakes the mirror's poll; its fetch (or the next poll) is
	// answered 503 with Retry-After: 1h.
	if _, err := e.cc.Put(domain, "a", "v2"); err != nil {
		t.Fatal(err)
	}
	e.mirrorOf(t, domain, syncedReason(externaldomain.ReasonUnavailable))
	if err := e.standin.SetFaults(configcenter.Faults{}); err != nil {
		t.Fatal(err)
	}
	// Within two minutes (mirrorOf's bound), not the hour asked for.
	e.mirrorOf(t, domain, mirrored("a", "v2"))
	e.waitData(t, "app-config", map[string]string{"a": "v2"})
}

// TestMirrorRecoversWithoutAChange: a mirror that said Unavailable while
// the config center failed says Synced again once it answers, though no
// key changed meanwhile; before, it kept Unavailable until the next
// change, and its bindings kept ExternalUnavailable.
func TestMirrorRecoversWithoutAChange(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	const domain = "mirror-recover"
	e, _ := startMirroredApp(t, domain, withStandin)

	if err := e.standin.SetFaults(configcenter.Faults{FailPolls: true}); err != nil {
		t.Fatal(err)
	}
	// A change of another domain ends the poll held open, and the next
	// one fails.
	if _, err := e.cc.Put("mirror-recover-other", "k", "v"); err != nil {
		t.Fatal(err)
	}
	e.mirrorOf(t, domain, syncedReason(externaldomain.ReasonUnavailable))
	if err := e.standin.SetFaults(configcenter.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.mirrorOf(t, domain, mirrored("a", "v1"))
	e.waitReason(t, "app", configbinding.ReasonSynced)
}

// TestDeletedMirrorIsWrittenAgain: a mirror deleted while its loop runs
// (by hand, or by the holder's own release while its cache still showed the
// mirror to the loop the next binding started) is written again, though no
// key changes. Before, the loop kept the object it last wrote and wrote
// nothing until the domain next changed, and the domain's bindings stayed
// pending.
func TestDeletedMirrorIsWrittenAgain(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	const domain = "mirror-deleted"
	e, before := startMirroredApp(t, domain)

	if err := e.c.Delete(context.Background(), before); err != nil {
		t.Fatal(err)
	}
	e.mirrorOf(t, domain, func(ed *configv1alpha1.ExternalDomain) error {
		if ed.UID == before.UID {
			return fmt.Errorf("still the deleted mirror %s", ed.UID)
		}
		return mirrored("a", "v1")(ed)
	})
	e.waitReason(t, "app", configbinding.ReasonSynced)
}

// TestRefusedMirrorWriteIsRetried: the API server refuses the mirror's
// write of a change (an admission policy planted for it here; a timeout
// under load does the same). The mirror tries the write again until it is
// admitted, and never says the config center is unavailable: before, the
// refusal was written on the mirror as "config center unavailable", and its
// bindings said ExternalUnavailable. The refusal outlasts the backoff's
// climb to its cap (seven refusals, by the API server's count): the mirror
// used wait.ExponentialBackoffWithContext, which gives up once the delay
// reaches its cap (six tries, about half a minute), and the domain's mirror
// then stopped for good (make test, under load, took that long to see
// three refusals).
func TestRefusedMirrorWriteIsRetried(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	const domain = "mirror-refused"
	e, _ := startMirroredApp(t, domain)

	ctx := context.Background()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "refuse-" + domain},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{configv1alpha1.GroupVersion.Group}, APIVersions: []string{"*"},
						Resources: []string{"externaldomains/status"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "object.metadata.name != '" + domain + "' || !has(object.status.keys) || !object.status.keys.exists(k, k.value == 'v2')",
				Message:    "planted refusal of the mirror's write of v2",
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := e.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.c.Delete(context.Background(), o) })
	}
	// The policy is in force once it refuses a write of its own.
	probe := &configv1alpha1.ExternalDomain{}
	if err := e.c.Get(ctx, client.ObjectKey{Name: domain}, probe); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, time.Minute, "the planted policy refuses", func() error {
		p := probe.DeepCopy()
		p.Status.Keys = append(p.Status.Keys, configv1alpha1.MirroredKey{Name: "probe", Value: "v2"})
		if err := e.c.Status().Update(ctx, p, client.DryRunAll); err == nil {
			return errors.New("a write of v2 was admitted")
		}
		return nil
	})

	w, err := newWatchClient(t).Watch(ctx, &configv1alpha1.ExternalDomainList{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	unavailable := make(chan string, 1)
	go func() {
		for ev := range w.ResultChan() {
			ed, ok := ev.Object.(*configv1alpha1.ExternalDomain)
			if !ok || ed.Name != domain {
				continue
			}
			if c := meta.FindStatusCondition(ed.Status.Conditions, externaldomain.ConditionSynced); c != nil && c.Reason == externaldomain.ReasonUnavailable {
				select {
				case unavailable <- c.Message:
				default:
				}
			}
		}
	}()

	refusals := func() (float64, error) {
		fams, err := cp.Metrics(ctx)
		if err != nil {
			return 0, err
		}
		f := fams["apiserver_validating_admission_policy_check_total"]
		if f == nil {
			return 0, errors.New("the API server exports no apiserver_validating_admission_policy_check_total")
		}
		var n float64
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "policy" && l.GetValue() == policy.Name {
					n += m.GetCounter().GetValue()
				}
			}
		}
		return n, nil
	}
	before, err := refusals()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cc.Put(domain, "a", "v2"); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, 3*time.Minute, "the API server refuses the mirror's write of v2 seven times", func() error {
		n, err := refusals()
		if err != nil {
			return err
		}
		if n-before < 7 {
			return fmt.Errorf("%.0f refusals", n-before)
		}
		return nil
	})
	if err := e.c.Delete(ctx, binding); err != nil {
		t.Fatal(err)
	}
	e.mirrorOf(t, domain, mirrored("a", "v2"))
	e.waitData(t, "app-config", map[string]string{"a": "v2"})
	select {
	case msg := <-unavailable:
		t.Errorf("the mirror said Unavailable for a write the API server refused: %s", msg)
	default:
	}
}

// TestMirrorResumesTheEpoch: the config center restarts (a new epoch, its
// revisions start over) while a domain's shard changes hands, and its new
// history has passed the mirror's revision by the time the new holder
// resumes. The new holder resumes in the mirror's epoch, so it sees the
// restart and mirrors the domain again: a changed key gets its new value
// and a key that is gone leaves. Before, it resumed without the epoch, took
// the new history as news since that revision, and kept the old keys for
// good. No write on the way says Synced without the domain's keys.
func TestMirrorResumesTheEpoch(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnvWith(t, "mirror-epoch", withStandin, mirrorMode)
	const domain = "mirror-epoch"
	e.deleteMirrors(t, domain)
	for k, v := range map[string]string{"a": "old", "b": "gone"} {
		if _, err := e.cc.Put(domain, k, v); err != nil {
			t.Fatal(err)
		}
	}
	e.create(t, "app", domain, "a")
	e.waitReason(t, "app", configbinding.ReasonSynced)
	before := e.mirrorOf(t, domain, mirrored("b", "gone"))

	// The holder leaves; the config center restarts on the same address
	// with a new history, in which a changes and b is gone, and which then
	// passes the mirror's revision with changes of other domains.
	e.stopFirst()
	addr := e.standin.Addr()
	if err := e.standin.Close(); err != nil {
		t.Fatal(err)
	}
	cc, err := standin.Start(context.Background(), standin.Options{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	e.standin, e.cc = cc, standinCenter{cc}
	if _, err := cc.Put(domain, "a", "new"); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		v, err := cc.Put("mirror-epoch-other", "k", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		if v.Revision > before.Status.Revision {
			break
		}
	}

	ctx := context.Background()
	w, err := newWatchClient(t).Watch(ctx, &configv1alpha1.ExternalDomainList{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	var emptied []string
	go func() {
		for ev := range w.ResultChan() {
			ed, ok := ev.Object.(*configv1alpha1.ExternalDomain)
			if ok && ed.Name == domain && len(ed.Status.Keys) == 0 && meta.IsStatusConditionTrue(ed.Status.Conditions, externaldomain.ConditionSynced) {
				mu.Lock()
				emptied = append(emptied, fmt.Sprintf("%s at revision %d by %s", ev.Type, ed.Status.Revision, ed.Status.Replica))
				mu.Unlock()
			}
		}
	}()

	second := e.opts
	second.Identity = "mirror-epoch-1"
	e.startReplica(t, second)
	after := e.mirrorOf(t, domain, func(ed *configv1alpha1.ExternalDomain) error {
		if err := mirrored("a", "new")(ed); err != nil {
			return err
		}
		if len(ed.Status.Keys) != 1 {
			return fmt.Errorf("keys %+v: b is gone from the config center", ed.Status.Keys)
		}
		return nil
	})
	e.waitData(t, "app-config", map[string]string{"a": "new"})
	if after.Status.Epoch == "" || after.Status.Epoch == before.Status.Epoch || after.Status.Replica != "mirror-epoch-1" {
		t.Errorf("mirror epoch %q (was %q), written by %s", after.Status.Epoch, before.Status.Epoch, after.Status.Replica)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(emptied) > 0 {
		t.Errorf("the mirror said Synced with no keys: %v", emptied)
	}
}
