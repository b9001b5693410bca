package sharding_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/sharding"
)

// TestRenewalsSpreadOverThePeriod: a replica that takes all of its shards at
// once (its start) renews them at random points of the retry period, not
// together: shards renewed together stay together, a burst of Lease writes
// every period that a replica held to a CPU limit pays with its reconciles
// stalled (the capacity scenario's single replica at 50m spent 73–93 % of
// its CFS periods throttled). Each shard's first renewal, from its
// acquisition, is therefore anywhere within the period; on the old code
// every one came a full period after it. Each still comes within the renew
// deadline.
func TestRenewalsSpreadOverThePeriod(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "spread"
	ww, err := client.NewWithWatch(cp.Config, client.Options{Scheme: newScheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := ww.Watch(ctx, &coordinationv1.LeaseList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	rc := ringConfig(ns, ring, "spread-0")
	startReplica(t, rc)

	shards := shardsOf(ring)
	names := map[string]int32{}
	for n := range shards {
		names[sharding.ShardLeaseName(ring, n)] = n
	}
	// first[n] is shard n's first renewal after its acquisition.
	first := map[int32]time.Duration{}
	for len(first) < int(shards) {
		var ev any
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the Lease watch ended with %d of %d shards renewed", len(first), shards)
			}
			ev = e.Object
		case <-ctx.Done():
			t.Fatalf("%d of %d shards renewed: %v", len(first), shards, ctx.Err())
		}
		l, ok := ev.(*coordinationv1.Lease)
		if !ok || l.Spec.AcquireTime == nil || l.Spec.RenewTime == nil {
			continue
		}
		n, ok := names[l.Name]
		if _, seen := first[n]; !ok || seen || !l.Spec.RenewTime.After(l.Spec.AcquireTime.Time) {
			continue
		}
		first[n] = l.Spec.RenewTime.Sub(l.Spec.AcquireTime.Time)
	}
	early := 0
	for n, d := range first {
		if d > rc.timing.renew {
			t.Errorf("shard %d first renewed %s after its acquisition, past the renew deadline %s", n, d, rc.timing.renew)
		}
		if d < rc.timing.retry/2 {
			early++
		}
	}
	// With first renewals uniform over the period, none in its first half
	// has the probability 2^-16 for the ring's 16 shards.
	if early == 0 {
		t.Errorf("no shard of %d first renewed within half a retry period (%s) of its acquisition: the renewals keep the phase of the acquisitions: %v", shards, rc.timing.retry/2, fmt.Sprint(first))
	}
}
