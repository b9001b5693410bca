package configbinding_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/promtext"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/ring"
)

// objectWrites counts the API server's mutating requests on ConfigBindings
// and ConfigMaps (status included, failed ones too), by verb and resource:
// the server's own count, not the controller's idea of it.
func objectWrites(t *testing.T) map[string]float64 {
	t.Helper()
	fams, err := cp.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range fams["apiserver_request_total"].GetMetric() {
		resource, verb := promtext.Label(m, "resource"), promtext.Label(m, "verb")
		if !slices.Contains([]string{"configbindings", "configmaps"}, resource) ||
			!slices.Contains([]string{"POST", "PUT", "PATCH", "APPLY", "DELETE"}, verb) {
			continue
		}
		key := verb + " " + resource
		if sub := promtext.Label(m, "subresource"); sub != "" {
			key += "/" + sub
		}
		out[key] += promtext.Value(m)
	}
	return out
}

// writesSince is the difference of two objectWrites, without zero entries.
func writesSince(before, after map[string]float64) (map[string]float64, float64) {
	diff, total := map[string]float64{}, 0.0
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			diff[k] = d
			total += d
		}
	}
	return diff, total
}

// notReconciledBy lists the objects of names that replica has not reconciled
// (an audit "end") since the given time.
func (a *auditBuffer) notReconciledBy(replica, namespace string, names []string, since time.Time) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	done := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(a.buf.Bytes()))
	for sc.Scan() {
		var rec sharding.AuditRecord
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Event == "end" && rec.Replica == replica &&
			rec.Namespace == namespace && !rec.Time.Before(since) {
			done[rec.Name] = true
		}
	}
	var out []string
	for _, n := range names {
		if !done[n] {
			out = append(out, n)
		}
	}
	return out
}

// lastRecord is the time of the newest audit record.
func (a *auditBuffer) lastRecord() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var last time.Time
	sc := bufio.NewScanner(bytes.NewReader(a.buf.Bytes()))
	for sc.Scan() {
		var rec sharding.AuditRecord
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Time.After(last) {
			last = rec.Time
		}
	}
	return last
}

// waitQuiet waits until no reconcile started or ended for a while: the
// fleet has done what the last event asked. The quiet time only makes the
// check that follows more thorough: a late write is missed, never invented.
func (e *env) waitQuiet(t *testing.T) {
	t.Helper()
	controlplane.Eventually(t, 2*time.Minute, "no reconcile for 3s", func() error {
		if idle := time.Since(e.audit.lastRecord()); idle < 3*time.Second {
			return fmt.Errorf("last reconcile %s ago", idle.Round(time.Millisecond))
		}
		return nil
	})
}

// TestHandoverWritesNothing: when a replica leaves, its up-to-date bindings
// move to the other replica without one write to a ConfigBinding or a
// ConfigMap, as the API server counts them; the new owner reconciles each
// (its cache starts cold) and none leaves Ready on the way.
func TestHandoverWritesNothing(t *testing.T) {
	e := startEnv(t, "handover", externalcache.Options{})
	second := e.opts
	second.Identity = "handover-1"
	e.startReplica(t, second)
	var names []string
	for i := range 16 {
		name := fmt.Sprintf("app-%d", i)
		names = append(names, name)
		e.create(t, name, fmt.Sprintf("domain-%d", i%4), "key-0", "key-1")
	}
	ctx := context.Background()
	gvk := configv1alpha1.GroupVersion.WithKind("ConfigBinding")
	byHolder := func() (map[string][]string, error) {
		st, err := ring.ReadStatus(ctx, e.c, ring.StatusOptions{Namespace: e.opts.LeaseNamespace, Ring: e.opts.Ring, Kind: gvk, LabelPrefix: sharding.DefaultLabelPrefix})
		if err != nil {
			return nil, err
		}
		out := map[string][]string{}
		for _, n := range names {
			var cb configv1alpha1.ConfigBinding
			if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: n}, &cb); err != nil {
				return nil, err
			}
			c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
			if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != cb.Generation {
				return nil, fmt.Errorf("%s not Ready: %+v", n, cb.Status.Conditions)
			}
			shard, ok := ring.KeysFor(sharding.DefaultLabelPrefix).ShardLabel(cb.Labels, st.ShardCount)
			if !ok {
				return nil, fmt.Errorf("%s has no shard label", n)
			}
			h := st.Shards[shard].Holder
			out[h] = append(out[h], n)
		}
		return out, nil
	}
	var moving []string
	controlplane.Eventually(t, 2*time.Minute, "bindings Ready on both replicas", func() error {
		got, err := byHolder()
		if err == nil && (len(got["handover-0"]) == 0 || len(got["handover-1"]) == 0) {
			err = fmt.Errorf("by holder %v: want some on each", got)
		}
		moving = got["handover-0"]
		return err
	})
	e.waitQuiet(t)

	w, err := newWatchClient(t).Watch(ctx, &configv1alpha1.ConfigBindingList{}, client.InNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	var flaps []string
	go func() {
		for ev := range w.ResultChan() {
			cb, ok := ev.Object.(*configv1alpha1.ConfigBinding)
			if !ok {
				continue
			}
			if c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady); c != nil && c.Status != metav1.ConditionTrue {
				mu.Lock()
				flaps = append(flaps, fmt.Sprintf("%s: %s %s", cb.Name, c.Reason, c.Message))
				mu.Unlock()
			}
		}
	}()
	before := objectWrites(t)
	t0 := time.Now()
	e.stopFirst()
	controlplane.Eventually(t, 2*time.Minute, "every binding held and reconciled by handover-1", func() error {
		got, err := byHolder()
		if err == nil && len(got["handover-1"]) != len(names) {
			return fmt.Errorf("by holder %v", got)
		}
		if err == nil {
			if left := e.audit.notReconciledBy("handover-1", e.ns, moving, t0); len(left) > 0 {
				return fmt.Errorf("%d of %d moved bindings not reconciled by handover-1 yet, e.g. %s", len(left), len(moving), left[0])
			}
		}
		return err
	})
	e.waitQuiet(t)
	if diff, total := writesSince(before, objectWrites(t)); total != 0 {
		t.Errorf("moving %d bindings wrote %.0f times to ConfigBindings and ConfigMaps, want 0: %v", len(moving), total, diff)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(flaps) > 0 {
		t.Fatalf("bindings left Ready during the handover: %v", flaps)
	}
}

// TestSpecUpdateWritesTwice: a spec update costs one ConfigMap apply and one
// status patch, as the API server counts them, even when it adds a key the
// cache has never fetched (no "Fetching" status in between), and even though
// the ConfigMap's own event requeues the binding before the status patch is
// back in the cache (no repeated or conflicting patch).
func TestSpecUpdateWritesTwice(t *testing.T) {
	e := startEnv(t, "writes", externalcache.Options{})
	const n = 6 // two domains of 4 keys: key-1 to key-3 are new to each
	var names []string
	for i := range n {
		name := fmt.Sprintf("app-%d", i)
		names = append(names, name)
		e.create(t, name, fmt.Sprintf("domain-%d", i%2), "key-0")
	}
	for _, name := range names {
		e.waitReason(t, name, configbinding.ReasonSynced)
	}
	e.waitQuiet(t)
	before := objectWrites(t)
	ctx := context.Background()
	for i, name := range names {
		// A key of its own per binding: never fetched before.
		key := fmt.Sprintf("key-%d", 1+i/2)
		patch := fmt.Sprintf(`{"spec":{"keys":["key-0",%q]}}`, key)
		cb := &configv1alpha1.ConfigBinding{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}}
		if err := e.c.Patch(ctx, cb, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		controlplane.Eventually(t, time.Minute, name+" Ready at its new generation", func() error {
			var cb configv1alpha1.ConfigBinding
			if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: name}, &cb); err != nil {
				return err
			}
			c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
			if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != cb.Generation || cb.Generation < 2 {
				return fmt.Errorf("generation %d, status %+v", cb.Generation, cb.Status)
			}
			return nil
		})
	}
	e.waitQuiet(t)
	diff, total := writesSince(before, objectWrites(t))
	// Our own n spec patches, then at most two writes per update.
	if want := float64(n + 2*n); total > want {
		var parts []string
		for k, v := range diff {
			parts = append(parts, fmt.Sprintf("%s=%.0f", k, v))
		}
		slices.Sort(parts)
		t.Errorf("%d spec updates cost %.0f writes (%d of them ours), want at most %.0f: %s", n, total, n, want, strings.Join(parts, " "))
	}
}
