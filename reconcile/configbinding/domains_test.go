package configbinding_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
)

// TestDeletedDomainsLeaveNothing: once the last binding of a domain is
// deleted, the replica keeps nothing of the domain: no change-feed long
// poll (cache) or mirror loop (mirror) waits at the config center, no call
// for it is made any more, and its ExternalDomain is deleted (mirror). A
// binding created again for one of them works as a fresh one: Ready, and
// a later change of the config center reaches its ConfigMap. Before issue
// 24 all of it stayed until the shard left the replica.
func TestDeletedDomainsLeaveNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name   string
		adjust func(*replica.Options)
	}{
		{"cache", func(*replica.Options) {}},
		{"mirror", mirrorMode},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel() // own namespaces, ring, Lease namespace and config center
			e := startEnvWith(t, "churn-"+mode.name, withStandin, mode.adjust)
			const n = 20
			domains := make([]string, n)
			for i := range domains {
				domains[i] = fmt.Sprintf("churn-%s-%02d", mode.name, i)
				if _, err := e.cc.Put(domains[i], "k", "v"); err != nil {
					t.Fatal(err)
				}
			}
			e.deleteMirrors(t, domains...)
			for i, d := range domains {
				e.create(t, fmt.Sprintf("b%02d", i), d, "k")
			}
			for i := range domains {
				e.waitReason(t, fmt.Sprintf("b%02d", i), configbinding.ReasonSynced)
			}
			controlplane.Eventually(t, 2*time.Minute, "a long poll per domain", func() error {
				if got := e.standin.WaitingPolls(); got != n {
					return fmt.Errorf("%d long polls wait, want %d", got, n)
				}
				return nil
			})
			if mode.name == "mirror" {
				for _, d := range domains {
					e.mirrorOf(t, d, mirrored("k", "v"))
				}
			}

			for i := range domains {
				cb := &configv1alpha1.ConfigBinding{}
				cb.Namespace, cb.Name = e.ns, fmt.Sprintf("b%02d", i)
				if err := e.c.Delete(context.Background(), cb); err != nil {
					t.Fatal(err)
				}
			}
			// The config center's own count of waiting polls: every one
			// in this env's config center is the replica's.
			controlplane.Eventually(t, 2*time.Minute, "no long poll of a deleted domain", func() error {
				if got := e.standin.WaitingPolls(); got != 0 {
					return fmt.Errorf("%d long polls still wait", got)
				}
				return nil
			})
			controlplane.Eventually(t, 2*time.Minute, "no ExternalDomain of a deleted domain", func() error {
				for _, d := range domains {
					err := e.c.Get(context.Background(), client.ObjectKey{Name: d}, &configv1alpha1.ExternalDomain{})
					if !apierrors.IsNotFound(err) {
						return fmt.Errorf("ExternalDomain %s: %v", d, err)
					}
				}
				return nil
			})
			// Nothing calls for them any more: no poll and no fetch while
			// the replica runs on (a feed polls at least once a second).
			calls := func() int64 {
				var sum int64
				for _, d := range domains {
					sum += e.standin.Stats().Count("", d, "", 0)
				}
				return sum
			}
			before := calls()
			time.Sleep(3 * time.Second)
			if got := calls(); got != before || e.standin.WaitingPolls() != 0 {
				t.Fatalf("the deleted domains were called %d times more (%d polls wait) after they were released", got-before, e.standin.WaitingPolls())
			}

			// A binding created again is a fresh one.
			e.create(t, "again", domains[0], "k")
			e.waitReason(t, "again", configbinding.ReasonSynced)
			e.waitData(t, "again-config", map[string]string{"k": "v"})
			if mode.name == "mirror" {
				e.mirrorOf(t, domains[0], mirrored("k", "v"))
			}
			if _, err := e.cc.Put(domains[0], "k", "changed"); err != nil {
				t.Fatal(err)
			}
			e.waitData(t, "again-config", map[string]string{"k": "changed"})
			if got := e.standin.Stats().Count("", domains[0], configcenter.RouteChanges, 0); got == 0 {
				t.Fatalf("no change-feed poll of %s", domains[0])
			}
		})
	}
}

// TestMirrorsLeftByAnEarlierHolderAreCollected: a domain whose last binding
// is deleted while no replica holds its shard leaves an ExternalDomain that
// no deletion the next holder sees would release. The next holder collects
// it once the shard's informers synced, keeps the mirror of a domain still
// in use, and leaves alone another ring's mirror in the same shard (the
// objects are cluster-scoped, and this package's tests run many rings at
// once: before the ring label, their holders deleted each other's mirrors).
func TestMirrorsLeftByAnEarlierHolderAreCollected(t *testing.T) {
	t.Parallel()
	e := startEnvWith(t, "orphans", mirrorMode)
	const gone, kept, foreign = "orphans-gone", "orphans-kept", "orphans-foreign"
	for _, d := range []string{gone, kept} {
		if _, err := e.cc.Put(d, "k", "v"); err != nil {
			t.Fatal(err)
		}
	}
	e.deleteMirrors(t, gone, kept, foreign)
	other := &configv1alpha1.ExternalDomain{Spec: configv1alpha1.ExternalDomainSpec{Domain: foreign}}
	other.Name = foreign
	other.Labels = map[string]string{
		sharding.LabelShard: fmt.Sprint(sharding.ShardOf(gone, e.opts.Shards)), sharding.LabelRing: "another-ring",
	}
	if err := e.c.Create(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	e.create(t, "gone", gone, "k")
	e.create(t, "kept", kept, "k")
	e.waitReason(t, "gone", configbinding.ReasonSynced)
	e.waitReason(t, "kept", configbinding.ReasonSynced)
	e.mirrorOf(t, gone, mirrored("k", "v"))

	// The only replica leaves; the binding goes while nobody holds its
	// shard.
	e.stopFirst()
	cb := &configv1alpha1.ConfigBinding{}
	cb.Namespace, cb.Name = e.ns, "gone"
	if err := e.c.Delete(context.Background(), cb); err != nil {
		t.Fatal(err)
	}
	// The garbage collector deletes its ConfigMap (this control plane runs
	// none): no event of the binding is left for the next holder to see.
	cm := &corev1.ConfigMap{}
	cm.Namespace, cm.Name = e.ns, "gone-config"
	if err := e.c.Delete(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	next := e.opts
	next.Identity = "orphans-1"
	e.startReplica(t, next)

	controlplane.Eventually(t, 2*time.Minute, "the next holder collects the mirror of "+gone, func() error {
		err := e.c.Get(context.Background(), client.ObjectKey{Name: gone}, &configv1alpha1.ExternalDomain{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("ExternalDomain %s: %v", gone, err)
		}
		return nil
	})
	// The foreign mirror sorts before the collected one.
	if err := e.c.Get(context.Background(), client.ObjectKey{Name: foreign}, &configv1alpha1.ExternalDomain{}); err != nil {
		t.Fatalf("another ring's mirror: %v", err)
	}
	if _, err := e.cc.Put(kept, "k", "changed"); err != nil {
		t.Fatal(err)
	}
	e.mirrorOf(t, kept, mirrored("k", "changed"))
	e.waitData(t, "kept-config", map[string]string{"k": "changed"})
}
