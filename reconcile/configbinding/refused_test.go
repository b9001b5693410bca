package configbinding_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// setKeys replaces a binding's keys (a spec update).
func (e *env) setKeys(t *testing.T, name string, keys ...string) {
	t.Helper()
	var cb configv1alpha1.ConfigBinding
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &cb); err != nil {
		t.Fatal(err)
	}
	cb.Spec.Keys = nil
	for _, k := range keys {
		cb.Spec.Keys = append(cb.Spec.Keys, configv1alpha1.ConfigKey(k))
	}
	if err := e.c.Update(context.Background(), &cb); err != nil {
		t.Fatal(err)
	}
}

// patchConfigMap changes a ConfigMap as someone other than kshard would (a
// merge patch of its own field manager).
func (e *env) patchConfigMap(t *testing.T, name, patch string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}}
	if err := e.c.Patch(context.Background(), cm, client.RawPatch(types.MergePatchType, []byte(patch)), client.FieldOwner("someone-else")); err != nil {
		t.Fatal(err)
	}
}

// waitRefused waits for the binding to say reason with Ready=False and a
// message containing each of words, and checks that its ConfigMap still
// holds the last good values.
func (e *env) waitRefused(t *testing.T, name, reason string, kept map[string]string, words ...string) {
	t.Helper()
	cb := e.waitReason(t, name, reason)
	c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
	if c.Status != metav1.ConditionFalse {
		t.Errorf("%s: Ready is %s with reason %s", name, c.Status, c.Reason)
	}
	for _, w := range words {
		if !strings.Contains(c.Message, w) {
			t.Errorf("%s: the message does not say %q: %q", name, w, c.Message)
		}
	}
	if got := e.configMap(t, name+"-config").Data; !maps.Equal(got, kept) {
		t.Errorf("%s: the ConfigMap lost its last good values: %d keys, want %d", name, len(got), len(kept))
	}
}

// TestApplyRefusalsAreNamed: a ConfigMap the API server cannot accept (its
// values above the 1 MiB limit, an immutable ConfigMap, a data key that its
// binaryData has too) used to fail every reconcile with backoff and no
// status, and a binding that was Ready stayed Ready over a stale ConfigMap.
// Each now says Ready=False with its reason and the API server's words, the
// ConfigMap keeps its last good values, a value set that cannot fit is
// refused before anything is written, and each heals when its cause goes.
func TestApplyRefusalsAreNamed(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	// A refusal looks again every RetryAfter: 10 s instead of the flag's
	// minute keeps the healing below short; it is long enough that a quiet
	// window sees the binding at rest.
	e := startEnvWith(t, "refused", func(o *replica.Options) { o.RetryAfter = 10 * time.Second })
	put := func(domain, key, value string) {
		t.Helper()
		if _, err := e.cc.Put(domain, key, value); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("too large", func(t *testing.T) {
		// 18 values of 60 KiB: each passes the CRD and the cache, together
		// they are above the API server's 1 MiB.
		var keys []string
		for i := range 18 {
			k := fmt.Sprintf("k%02d", i)
			keys = append(keys, k)
			put("big", k, strings.Repeat(string(rune('a'+i)), 60<<10))
		}
		e.create(t, "big", "big", keys[:10]...)
		e.waitReason(t, "big", configbinding.ReasonSynced)
		good := e.configMap(t, "big-config").Data

		e.setKeys(t, "big", keys...)
		e.waitRefused(t, "big", configbinding.ReasonTargetTooLarge, good, "1048576", "k00 61440")
		// At rest: one look per RetryAfter, not a retry at the rate limit.
		// Of the next three reconciles, two may be late events of the
		// refusal's own writes; the third is a look, at least RetryAfter
		// after the refusal. A retry loop (an error's backoff: 5 ms, 10 ms,
		// ...) makes all three within a fraction of a second. A loaded
		// machine only spaces them further: the bound cannot flake.
		since := time.Now()
		var looks []time.Time
		controlplane.Eventually(t, time.Minute, "three reconciles after the refusal", func() error {
			if looks = e.audit.startTimes(e.ns, "big", since); len(looks) < 3 {
				return fmt.Errorf("%d reconciles so far", len(looks))
			}
			return nil
		})
		if d := looks[2].Sub(looks[0]); d < e.opts.RetryAfter/2 {
			t.Errorf("three reconciles of a TargetTooLarge binding within %v (RetryAfter %v): a retry loop", d, e.opts.RetryAfter)
		}

		// The API server's own limit counts binaryData someone else added:
		// 10 values fit beside 400 KiB of binaryData, 11 do not.
		e.setKeys(t, "big", keys[:10]...)
		e.waitReason(t, "big", configbinding.ReasonSynced)
		e.patchConfigMap(t, "big-config", fmt.Sprintf(`{"binaryData":{"blob":%q}}`, strings.Repeat("QUFB", 400<<10/3)))
		e.setKeys(t, "big", keys[:11]...)
		e.waitRefused(t, "big", configbinding.ReasonTargetTooLarge, good, "Too long")
		e.patchConfigMap(t, "big-config", `{"binaryData":null}`)
		e.waitReason(t, "big", configbinding.ReasonSynced)
		e.waitData(t, "big-config", map[string]string{"k10": strings.Repeat("k", 60<<10)})
	})

	t.Run("immutable", func(t *testing.T) {
		put("imm", "a", "v1")
		e.create(t, "imm", "imm", "a")
		e.waitReason(t, "imm", configbinding.ReasonSynced)
		e.patchConfigMap(t, "imm-config", `{"immutable":true}`)
		put("imm", "a", "v2")
		e.waitRefused(t, "imm", configbinding.ReasonTargetImmutable, map[string]string{"a": "v1"}, "immutable")
		// Deleting it lets the binding write it again.
		if err := e.c.Delete(context.Background(), e.configMap(t, "imm-config")); err != nil {
			t.Fatal(err)
		}
		e.waitReason(t, "imm", configbinding.ReasonSynced)
		e.waitData(t, "imm-config", map[string]string{"a": "v2"})
	})

	t.Run("binaryData key clash", func(t *testing.T) {
		put("clash", "a", "v-a")
		put("clash", "b", "v-b")
		e.create(t, "clash", "clash", "a")
		e.waitReason(t, "clash", configbinding.ReasonSynced)
		e.patchConfigMap(t, "clash-config", `{"binaryData":{"b":"eA=="}}`)
		e.setKeys(t, "clash", "a", "b")
		e.waitRefused(t, "clash", configbinding.ReasonTargetKeyConflict, map[string]string{"a": "v-a"}, "(b)", "duplicate of key present in binaryData")
		// Once the clashing key is gone the next look (RetryAfter) writes.
		e.patchConfigMap(t, "clash-config", `{"binaryData":{"b":null}}`)
		e.waitReason(t, "clash", configbinding.ReasonSynced)
		e.waitData(t, "clash-config", map[string]string{"a": "v-a", "b": "v-b"})
	})

	// Every refusal above was a Warning Event too (a change of reason).
	controlplane.Eventually(t, time.Minute, "Warning Events for each refusal", func() error {
		var evs corev1.EventList
		if err := e.c.List(context.Background(), &evs, client.InNamespace(e.ns)); err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, ev := range evs.Items {
			if ev.Type == corev1.EventTypeWarning {
				seen[ev.Reason] = true
			}
		}
		for _, r := range []string{configbinding.ReasonTargetTooLarge, configbinding.ReasonTargetImmutable, configbinding.ReasonTargetKeyConflict} {
			if !seen[r] {
				return fmt.Errorf("no Warning Event %s among %v", r, seen)
			}
		}
		return nil
	})
}
