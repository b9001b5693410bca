package sharding_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding/lease"
)

// TestWarmLeave: a replica that leaves through Leave hands its shards over
// warm. By the API server's audit log, the replica that takes them synced
// a cache of exactly those shards before the leaving replica released the
// first of them, and synced no cache of moved shards alone during its first
// tenure of them: each shard ran as soon as its new owner held it. Before,
// the new owner's cache (a LIST or watch-list that scans the whole
// collection, 9–13 s at 100,000 objects) came after the release, while
// nobody ran the shards. And every object is reconciled by its new owner.
//
// Later syncs are no cold start and are let be: a cache that merges the
// taken shards with the replica's own (compaction), and a cache started
// after a later acquisition of a shard (its first tenure fenced, as on a
// loaded machine the renewals can miss their deadline).
func TestWarmLeave(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases
	c := newClient(t)
	ns := newNamespace(t, c)
	ringName := "warm-leave"
	createBindings(t, c, ns, 200, 50)
	reps := map[string]*replica{}
	for _, id := range []string{"w-0", "w-1"} {
		reps[id] = startReplica(t, ringConfig(ns, ringName, id))
	}
	expectRingHeld(t, c, ns, ringName, []string{"w-0", "w-1"})
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled", func() error { return allReconciled(c, ns, ringName, t) })
	var moved []int32
	released := map[string]bool{}
	for n, l := range shardHolders(t, c, ns, ringName) {
		if holderOf(l) == "w-1" {
			moved = append(moved, n)
			released[lease.ShardName(ringName, n)] = true
		}
	}
	slices.Sort(moved)
	if len(moved) == 0 {
		t.Fatal("w-1 holds no shard")
	}

	from := time.Now()
	reps["w-1"].rep.Leave(context.Background())
	reps["w-1"].stop(t)
	expectRingHeld(t, c, ns, ringName, []string{"w-0"})
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled by w-0", func() error { return allReconciled(c, ns, ringName, t) })

	l, err := audit.ReadAPILogFile(apiAudit)
	if err != nil {
		t.Fatalf("reading the API server's audit log: %v", err)
	}
	var release time.Time
	for _, w := range l.Writes {
		if w.Resource == "leases" && w.Namespace == ns && released[w.Name] && lease.HolderReplica(w.Holder) == "w-1" && w.LeaseHolder == "" &&
			w.Code < 300 && w.Received.After(from) && (release.IsZero() || w.Received.Before(release)) {
			release = w.Received
		}
	}
	if release.IsZero() {
		t.Fatalf("no release of w-1's shards %v in the audit log since %s", moved, from.Format(time.StampMicro))
	}
	// retaken[n]: when w-0 first took shard n again after its first tenure
	// of it since from began (a new acquire time), zero if it did not.
	retaken := map[int32]time.Time{}
	for _, n := range moved {
		var acquisitions []time.Time
		for _, w := range l.Writes {
			if w.Resource == "leases" && w.Namespace == ns && w.Name == lease.ShardName(ringName, n) && lease.HolderReplica(w.LeaseHolder) == "w-0" &&
				w.Code < 300 && w.LeaseAcquired.After(from) && !slices.ContainsFunc(acquisitions, w.LeaseAcquired.Equal) {
				acquisitions = append(acquisitions, w.LeaseAcquired)
			}
		}
		if len(acquisitions) > 1 {
			slices.SortFunc(acquisitions, time.Time.Compare)
			retaken[n] = acquisitions[1]
		}
	}
	inFirstTenure := func(s audit.Sync) bool {
		for _, n := range s.Shards {
			if !slices.Contains(moved, n) {
				return false // a cache that merges the moved shards with w-0's own
			}
		}
		for _, n := range s.Shards {
			if r := retaken[n]; r.IsZero() || s.Received.Before(r) {
				return true
			}
		}
		return false
	}
	seen := map[string]bool{}
	var warm, late []string
	for _, s := range l.Syncs {
		if s.Resource != "configbindings" || s.Shards == nil || !strings.Contains(s.Group, "/namespaces/"+ns+"/") || lease.HolderReplica(s.Holder) != "w-0" {
			continue
		}
		switch {
		case s.Received.Before(from):
			seen[s.Group] = true
		case seen[s.Group]:
		case s.Received.Before(release) && slices.Equal(slices.Sorted(slices.Values(s.Shards)), moved):
			seen[s.Group] = true
			warm = append(warm, s.Group)
		case s.Received.After(release) && inFirstTenure(s):
			late = append(late, fmt.Sprintf("%s at %s", s.Group, s.Received.Format(time.StampMicro)))
		}
	}
	if len(warm) == 0 {
		t.Errorf("w-0 synced no cache of w-1's shards %v before w-1 released the first at %s", moved, release.Format(time.StampMicro))
	}
	if len(late) > 0 {
		t.Errorf("w-0 synced caches of moved shards in its first tenure of them, after w-1 released its shards at %s: %v", release.Format(time.StampMicro), late)
	}
}
