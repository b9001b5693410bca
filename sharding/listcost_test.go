package sharding_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
)

// bindingSyncs counts the API server's initial syncs of ConfigBindings (LIST
// requests and watch-lists) and the objects it scanned for them: its own
// count, from its /metrics.
func bindingSyncs(t *testing.T) (syncs, scanned float64) {
	t.Helper()
	c := apiCounts(t, cp)
	return c.requests, c.scanned
}

// quietSyncs waits until the count of syncs has not changed for a while (a
// compaction may follow readiness) and returns it. Waiting longer only
// makes the next count stricter.
func quietSyncs(t *testing.T) (syncs, scanned float64) {
	t.Helper()
	syncs, scanned = bindingSyncs(t)
	controlplane.Eventually(t, time.Minute, "no new sync of ConfigBindings for 3s", func() error {
		time.Sleep(3 * time.Second)
		s, sc := bindingSyncs(t)
		if s != syncs {
			syncs, scanned = s, sc
			return fmt.Errorf("%.0f syncs so far", s)
		}
		return nil
	})
	return syncs, scanned
}

// TestFleetListsOncePerAcquisition: a ring of three replicas started together
// syncs ConfigBindings a few times per replica, not once per shard: shards
// acquired together share one cache (`kshard.dev/shard in (…)`), and the
// API server scans the whole collection for every sync whatever its
// selector. A graceful leave costs each replica that gains shards one more
// sync at most (and the labeler's new leader one, if it moved).
//
// It counts every sync the API server made, so it runs alone (not
// parallel): the package's parallel tests start after it ends. Alone, its
// replicas may watch every namespace, as a controller deployed without
// --namespaces does.
func TestFleetListsOncePerAcquisition(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "lists"
	createBindings(t, c, ns, 200, 40)
	syncs0, scanned0 := bindingSyncs(t)
	ids := []string{"l-0", "l-1", "l-2"}
	var reps []*replica
	for _, id := range ids {
		rc := ringConfig(ns, ring, id)
		rc.everyNamespace = true
		reps = append(reps, startReplica(t, rc))
	}
	expectRingHeld(t, c, ns, ring, ids)
	for _, r := range reps {
		controlplane.Eventually(t, time.Minute, r.id+" ready", r.rep.Ready)
	}
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled by their shard's holder", func() error { return allReconciled(c, ns, ring, t) })
	syncs1, scanned1 := quietSyncs(t)
	started := syncs1 - syncs0
	t.Logf("fleet start: %.0f syncs of ConfigBindings, %.0f objects scanned", started, scanned1-scanned0)
	// Three replicas joining one after another: a first cache each, a cache
	// per batch of shards gained while the others join, a compaction each,
	// and the labeler's: 7 to 11 here. One cache per shard is 64 and more.
	if limit := float64(6 * len(ids)); started > limit {
		t.Errorf("starting %d replicas synced ConfigBindings %.0f times, want at most %.0f (one cache per acquisition, not per shard)", len(ids), started, limit)
	}

	before := sharding.NewRing(fullShards, ids)
	after := sharding.NewRing(fullShards, ids[:2])
	moved := 0
	for n := range int32(fullShards) {
		if before.Owner(n) != after.Owner(n) {
			moved++
		}
	}
	reps[2].stop(t)
	expectRingHeld(t, c, ns, ring, ids[:2])
	for _, r := range reps[:2] {
		controlplane.Eventually(t, time.Minute, r.id+" ready", r.rep.Ready)
	}
	syncs2, _ := quietSyncs(t)
	// Usually one per replica gaining shards, and one more if the leaver
	// was the elected labeler (the new leader lists unlabeled objects). A
	// gainer whose acquisition raced the leaver's release retries after
	// its backoff and may list the late shards in a second batch, so the
	// bound is set against the cost this guards against, one cache per
	// moved shard, not against the best case.
	left := syncs2 - syncs1
	t.Logf("graceful leave: %d shards moved, %.0f syncs of ConfigBindings", moved, left)
	if limit := float64(moved) / 3; left > limit {
		t.Errorf("a graceful leave moving %d shards synced ConfigBindings %.0f times, want at most %.0f (one cache per batch of shards gained, not per shard)", moved, left, limit)
	}
}
