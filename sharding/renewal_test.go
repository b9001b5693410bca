package sharding_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/sharding/lease"
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
		names[lease.ShardName(ring, n)] = n
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

// TestRenewalsStartNoRingPass: every renewal of every Lease of a ring
// reaches every replica's Lease watch, 16 a second here (16 shards and a
// member, renewed every second). A renewal changes no holder: the
// coordinator notes when it saw it and reads it at its next pass, which
// comes at the latest a retry period later. So a replica at rest passes
// about once per retry period, not once per renewal (before, ~17 a second:
// each pass lists every Lease and recomputes the ring).
func TestRenewalsStartNoRingPass(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "quiet"
	rc := ringConfig(ns, ring, "quiet-0")
	startReplica(t, rc)
	expectRingHeld(t, c, ns, ring, []string{"quiet-0"})
	time.Sleep(2 * rc.timing.retry) // the acquisitions' own passes
	before, err := gathered("kshard_ring_syncs_total", ring)
	if err != nil {
		t.Fatal(err)
	}
	const window = 5 * time.Second
	time.Sleep(window)
	after, err := gathered("kshard_ring_syncs_total", ring)
	if err != nil {
		t.Fatal(err)
	}
	renewals := float64(shardsOf(ring)+1) * float64(window/rc.timing.retry)
	if passes, bound := after-before, 3*float64(window/rc.timing.retry); passes > bound {
		t.Errorf("the coordinator passed %.0f times in %s of %.0f renewals and no change; want at most %.0f (one per retry period, with room)", passes, window, renewals, bound)
	}
}
