package sharding_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/controlplane"
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
