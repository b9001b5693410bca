package sharding_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// TestSecondProcessWithOneIdentityWaits: a second process started with an
// identity in use (a duplicated --replica-id, a StatefulSet pod
// force-deleted during a partition while the old one still runs) takes no
// shard the first holds: it reports not ready, saying why, until the first
// leaves, and then takes over.
func TestSecondProcessWithOneIdentityWaits(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "dup"
	createBindings(t, c, ns, 100, 30)
	history := watchLeases(t, ns, ring)
	first := startReplica(t, ringConfig(ns, ring, "dup-0"))
	expectRingHeld(t, c, ns, ring, []string{"dup-0"})
	controlplane.Eventually(t, time.Minute, "first process ready", first.rep.Ready)
	firstHolder := holderIdentity(shardHolders(t, c, ns, ring)[0])

	second := startReplica(t, ringConfig(ns, ring, "dup-0"))
	controlplane.Eventually(t, time.Minute, "second process says why it is not ready", func() error {
		err := second.rep.Ready()
		if err == nil || !strings.Contains(err.Error(), "in use by another process") {
			return fmt.Errorf("readiness: %v", err)
		}
		return nil
	})
	// Long enough for the second process to take every shard it would
	// take: two lease durations.
	for end := time.Now().Add(2 * fastTiming.lease); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if held := second.rep.HeldShards(); len(held) > 0 {
			t.Fatalf("the second process runs shards %v that the first holds", held)
		}
		if second.rep.Ready() == nil {
			t.Fatal("the second process is ready while the first runs")
		}
	}
	for n, l := range shardHolders(t, c, ns, ring) {
		if holderIdentity(l) != firstHolder {
			t.Errorf("shard %d held by %q while the first process (%q) runs", n, holderIdentity(l), firstHolder)
		}
	}

	first.stop(t)
	controlplane.Eventually(t, time.Minute, "second process ready once the first left", second.rep.Ready)
	expectRingHeld(t, c, ns, ring, []string{"dup-0"})
	for n, l := range shardHolders(t, c, ns, ring) {
		if h := holderIdentity(l); h == firstHolder {
			t.Errorf("shard %d still held by the first process after it left", n)
		}
	}
	history.check(t)
}

// TestWaitingProcessDoesNotCampaign: a process whose identity another
// process runs (its member Lease renewed by another incarnation) does not
// campaign for the labeler Lease, even when no other replica does, and
// labels once the identity is its own. It used to win the labeler Lease at
// once and label nothing: no object created while the other process lived
// was ever reconciled.
func TestWaitingProcessDoesNotCampaign(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "waiter"
	// The other process of identity w-0 is the test, renewing its member
	// Lease every retry period until renewing() stops it.
	renewing := renewMemberLease(t, c, ns, ring, "w-0", "w-0_other")
	w := startReplica(t, ringConfig(ns, ring, "w-0"))
	controlplane.Eventually(t, time.Minute, "the process says why it is not ready", func() error {
		if err := w.rep.Ready(); err == nil || !strings.Contains(err.Error(), "in use by another process") {
			return fmt.Errorf("readiness: %v", err)
		}
		return nil
	})
	createBindings(t, c, ns, 20, 20)
	// Two lease durations: long enough to campaign and win many times over.
	for end := time.Now().Add(2 * fastTiming.lease); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if h := labelerHolder(t, c, ns, ring); h != "" {
			t.Fatalf("the labeler Lease is held by %q while its identity's member Lease is another process's", h)
		}
	}
	renewing()
	controlplane.Eventually(t, 2*time.Minute, "every object labeled and reconciled once the identity is its own", func() error {
		return allReconciled(c, ns, ring, t)
	})
}

// renewMemberLease is another process running identity id in a ring: it
// creates the member Lease with holder, renews it every retry period, and
// stops when the returned func is called (then the Lease expires).
func renewMemberLease(t *testing.T, c client.Client, ns, ring, id, holder string) (stop func()) {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lease.MemberName(ring, id),
			Labels:      map[string]string{sharding.LabelRing: ring, sharding.LabelLeaseKind: lease.KindMember},
			Annotations: map[string]string{sharding.AnnotationShards: fmt.Sprint(shardsOf(ring))}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(int32(fastTiming.lease / time.Second)),
			AcquireTime: &now, RenewTime: &now},
	}
	if err := c.Create(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(fastTiming.retry):
			}
			_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				var cur coordinationv1.Lease
				if err := c.Get(ctx, client.ObjectKeyFromObject(l), &cur); err != nil {
					return err
				}
				if ptr.Deref(cur.Spec.HolderIdentity, "") != holder {
					return nil
				}
				cur.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
				return c.Update(ctx, &cur)
			})
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}
