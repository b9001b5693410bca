package sharding_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
)

// shippedShardLabelPolicy is deploy/base's kshard-shard-label policy.
func shippedShardLabelPolicy(t *testing.T) *admissionregistrationv1.MutatingAdmissionPolicy {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "base", "shard-fence.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
		var p admissionregistrationv1.MutatingAdmissionPolicy
		if err := yaml.UnmarshalStrict(doc, &p); err == nil && p.Kind == "MutatingAdmissionPolicy" {
			return &p
		}
	}
	t.Fatal("deploy/base/shard-fence.yaml has no MutatingAdmissionPolicy")
	return nil
}

// bindShardLabelPolicy installs deploy/base's kshard-shard-label policy
// (once per control plane) and binds it, for the test's namespace only, to
// the shard table there.
func bindShardLabelPolicy(t *testing.T, c client.Client, ns, table string) {
	t.Helper()
	ctx := context.Background()
	p := shippedShardLabelPolicy(t)
	if err := c.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("installing the shipped policy: %v", err)
	}
	b := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "shard-label-" + ns},
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{
			PolicyName: p.Name,
			ParamRef: &admissionregistrationv1.ParamRef{Name: table, Namespace: ns,
				ParameterNotFoundAction: ptr.To(admissionregistrationv1.AllowAction)},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}},
		},
	}
	if err := c.Create(ctx, b); err != nil {
		t.Fatalf("binding the shipped policy: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), b) })
}

// created is what the API server recorded of one created object until its
// shard's holder reconciled it: the labels of its CREATE response, and the
// writes after it that changed its shard label, as its watch delivered
// them.
type created struct {
	labels      map[string]string
	labelWrites int
}

// createWatched creates a binding of domain and follows it, by a watch
// opened before the CREATE, until a replica reconciled it.
func createWatched(t *testing.T, ns, name, domain string, labels map[string]string) created {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ww, err := client.NewWithWatch(cp.Config, client.Options{Scheme: newScheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := ww.Watch(ctx, &configv1alpha1.ConfigBindingList{}, client.InNamespace(ns),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	cb := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: configv1alpha1.ConfigBindingSpec{Domain: domain, Keys: []configv1alpha1.ConfigKey{"k"},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: name}},
	}
	// Until the API server has published the CRD's schema to its admission
	// policies, a mutation of the kind fails the CREATE, failurePolicy
	// Ignore notwithstanding ("Resource kind … not found. There can be a
	// delay between when CustomResourceDefinitions are created and when
	// they are available"): seconds on a control plane that just started.
	start := time.Now()
	for {
		try := cb.DeepCopy()
		err := ww.Create(ctx, try)
		if err == nil {
			cb = try // the CREATE response
			break
		}
		if !strings.Contains(err.Error(), "There can be a delay between when CustomResourceDefinitions are created") || time.Since(start) > time.Minute {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("the policy refused %s/%s's CREATE for %s: the CRD's schema was not yet published to it", ns, name, d.Round(100*time.Millisecond))
	}
	out := created{labels: cb.Labels}
	last := cb.Labels[sharding.LabelShard]
	for ev := range w.ResultChan() {
		got, ok := ev.Object.(*configv1alpha1.ConfigBinding)
		if !ok || ev.Type != watch.Modified {
			continue
		}
		if s := got.Labels[sharding.LabelShard]; s != last {
			out.labelWrites++
			last = s
		}
		if reconciledBy(got) != "" {
			return out
		}
	}
	t.Fatalf("%s/%s: not reconciled within 2 minutes", ns, name)
	return out
}

// TestShardTableLabelsAtAdmission: the first object of a domain is labeled
// by the labeler (one write after its CREATE, which this test's checker
// sees), which adds the domain to the shard table; from then on the API
// server labels the domain's objects at admission, through deploy/base's
// policy: the label is in the CREATE response, no write changes it after,
// and a label set by hand is overwritten.
func TestShardTableLabelsAtAdmission(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ns := newNamespace(t, c)
	const ring, table, domain = "admission", "shard-table", "payments"
	bindShardLabelPolicy(t, c, ns, table)
	rc := ringConfig(ns, ring, "adm-0")
	rc.shardTable = table
	r := startReplica(t, rc)
	controlplane.Eventually(t, time.Minute, "replica ready", r.rep.Ready)
	want := strconv.Itoa(int(sharding.ShardOf(domain, shardsOf(ring))))

	first := createWatched(t, ns, "first", domain, nil)
	if _, ok := first.labels[sharding.LabelShard]; ok {
		t.Fatalf("the first object of %s was labeled at admission (%v), before the table knew the domain", domain, first.labels)
	}
	if first.labelWrites != 1 {
		t.Fatalf("the first object's label was written %d times after its CREATE, want 1 (the labeler's)", first.labelWrites)
	}
	controlplane.Eventually(t, time.Minute, "the shard table has "+domain, func() error {
		var cm corev1.ConfigMap
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: table}, &cm); err != nil {
			return err
		}
		if cm.Data[domain] != want || cm.Annotations[sharding.AnnotationShards] != strconv.Itoa(int(shardsOf(ring))) {
			return fmt.Errorf("table %v, annotations %v", cm.Data, cm.Annotations)
		}
		return nil
	})

	// The API server reads the table through an informer: a create right
	// after the write may still come unlabeled.
	var next created
	for i := 0; ; i++ {
		next = createWatched(t, ns, fmt.Sprintf("next-%d", i), domain, nil)
		if next.labels[sharding.LabelShard] != "" || i == 20 {
			break
		}
		time.Sleep(time.Second)
	}
	if next.labels[sharding.LabelShard] != want || next.labels[sharding.LabelDomain] != domain {
		t.Fatalf("CREATE response labels %v, want shard %s and domain %s", next.labels, want, domain)
	}
	if next.labelWrites != 0 {
		t.Errorf("an object labeled at admission had its label written %d times after", next.labelWrites)
	}

	wrong := "0"
	if want == wrong {
		wrong = "1"
	}
	byHand := createWatched(t, ns, "by-hand", domain, map[string]string{sharding.LabelShard: wrong})
	if byHand.labels[sharding.LabelShard] != want || byHand.labelWrites != 0 {
		t.Errorf("a label set by hand: CREATE response %v, %d writes after; want shard %s at admission", byHand.labels, byHand.labelWrites, want)
	}

	// The table deleted: a create still succeeds, unlabeled, the labeler
	// labels it, and writes the table again, whole. Twice in a row: the
	// second unlabeled object comes moments after the labeler's check of
	// the first, within the recheck interval, and its check must wait for
	// the interval, not be dropped (under two make test runs at once the
	// table stayed deleted: nothing asked again).
	for round := range 2 {
		if err := c.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: table}}); err != nil {
			t.Fatal(err)
		}
		var gone created
		for i := 0; ; i++ {
			gone = createWatched(t, ns, fmt.Sprintf("table-gone-%d-%d", round, i), domain, nil)
			if gone.labels[sharding.LabelShard] == "" || i == 20 {
				break
			}
			time.Sleep(time.Second)
		}
		if gone.labels[sharding.LabelShard] != "" || gone.labelWrites != 1 {
			t.Fatalf("with the table gone (round %d): CREATE labels %v and %d label writes, want none and 1", round, gone.labels, gone.labelWrites)
		}
		controlplane.Eventually(t, 2*time.Minute, fmt.Sprintf("the shard table written again (round %d)", round), func() error {
			var cm corev1.ConfigMap
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: table}, &cm); err != nil {
				return err
			}
			if cm.Data[domain] != want {
				return fmt.Errorf("table %v", cm.Data)
			}
			return nil
		})
	}
}

// TestFullShardTable: a table that holds its 1 MiB of names takes no more
// domains, and their objects are labeled by the labeler.
func TestFullShardTable(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ns := newNamespace(t, c)
	const ring, table = "fulltable", "shard-table"
	bindShardLabelPolicy(t, c, ns, table)
	// Filler up to the table's 1 MiB of names and numbers.
	full := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: table,
			Annotations: map[string]string{sharding.AnnotationShards: strconv.Itoa(int(shardsOf(ring)))}},
		Data: map[string]string{},
	}
	size := 0
	for i := 0; ; i++ {
		k := fmt.Sprintf("filler-%04d-%s", i, strings.Repeat("x", 200))
		if size+len(k)+1 > 1<<20 {
			break
		}
		full.Data[k] = "0"
		size += len(k) + 1
	}
	if err := c.Create(context.Background(), full); err != nil {
		t.Fatal(err)
	}
	rc := ringConfig(ns, ring, "full-0")
	rc.shardTable = table
	r := startReplica(t, rc)
	controlplane.Eventually(t, time.Minute, "replica ready", r.rep.Ready)

	got := createWatched(t, ns, "past-full", "late-domain", nil)
	if got.labelWrites != 1 {
		t.Fatalf("an object of a domain a full table cannot take: %d label writes, want 1 (the labeler's)", got.labelWrites)
	}
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(full), &cm); err != nil {
		t.Fatal(err)
	}
	if _, ok := cm.Data["late-domain"]; ok || len(cm.Data) != len(full.Data) {
		t.Fatalf("a full table took a domain: %d entries, had %d", len(cm.Data), len(full.Data))
	}

}

// TestShardTableWrittenFromWhatItRead: the labeler writes the shard table
// conditionally on the resourceVersion it read. Someone edits the table
// after the labeler read it (a domain's shard set wrong); the labeler's next
// write, for a new domain, conflicts, and it reads the table again before
// writing: the new domain is added and the edited entry put right. A write
// from the stale read (the merge patch without a precondition, before)
// added the new domain and left the wrong entry in the table, where the
// admission policy labels the domain's objects by it.
func TestShardTableWrittenFromWhatItRead(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ns := newNamespace(t, c)
	const ring, table = "reread", "shard-table"
	rc := ringConfig(ns, ring, "reread-0")
	rc.shardTable = table
	r := startReplica(t, rc)
	controlplane.Eventually(t, time.Minute, "replica ready", r.rep.Ready)
	shards := shardsOf(ring)
	right := func(domain string) string { return strconv.Itoa(int(sharding.ShardOf(domain, shards))) }
	tableHas := func(want map[string]string) func() error {
		return func() error {
			var cm corev1.ConfigMap
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: table}, &cm); err != nil {
				return err
			}
			for d, v := range want {
				if cm.Data[d] != v {
					return fmt.Errorf("table %v, want %s: %s", cm.Data, d, v)
				}
			}
			return nil
		}
	}
	createWatched(t, ns, "alpha-0", "alpha", nil)
	controlplane.Eventually(t, time.Minute, "the table has alpha", tableHas(map[string]string{"alpha": right("alpha")}))

	wrong := strconv.Itoa((int(sharding.ShardOf("alpha", shards)) + 1) % int(shards))
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: table}}
	if err := c.Patch(context.Background(), cm, client.RawPatch("application/merge-patch+json", []byte(`{"data":{"alpha":"`+wrong+`"}}`))); err != nil {
		t.Fatal(err)
	}
	createWatched(t, ns, "beta-0", "beta", nil)
	controlplane.Eventually(t, time.Minute, "the table has beta, and alpha put right", tableHas(map[string]string{
		"alpha": right("alpha"), "beta": right("beta"),
	}))
}
