package configbinding_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
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
			e := startEnvWith(t, "churn-"+mode.name, mode.adjust)
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
				if got := e.cc.WaitingPolls(); got != n {
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
				if got := e.cc.WaitingPolls(); got != 0 {
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
					sum += e.cc.Stats().Count("", d, "", 0)
				}
				return sum
			}
			before := calls()
			time.Sleep(3 * time.Second)
			if got := calls(); got != before || e.cc.WaitingPolls() != 0 {
				t.Fatalf("the deleted domains were called %d times more (%d polls wait) after they were released", got-before, e.cc.WaitingPolls())
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
			if got := e.cc.Stats().Count("", domains[0], configcenter.RouteChanges, 0); got == 0 {
				t.Fatalf("no change-feed poll of %s", domains[0])
			}
		})
	}
}
