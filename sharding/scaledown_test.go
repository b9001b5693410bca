package sharding_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding/lease"
)

// TestScaleDownTakesNoShards: a StatefulSet scaled from three replicas to
// one, whose removed replicas leave one after another (highest ordinal
// first, as an OrderedReady StatefulSet stops them), moves every shard to
// the replica that stays, once. By the API server's audit log, the second
// replica to leave took no shard after the count dropped and started no
// cache of ConfigBindings, and the staying replica took every moved shard.
// Before, every replica computed the ring from the members still running:
// the second took shards from the first to leave (a cache, a full scan of
// the collection) and handed them over again moments later.
func TestScaleDownTakesNoShards(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ringName := "scale-down"
	sts := createStatefulSet(t, c, ns, 3)
	createBindings(t, c, ns, 200, 50)
	ids := []string{"kshard-0", "kshard-1", "kshard-2"}
	reps := map[string]*replica{}
	for _, id := range ids {
		rc := ringConfig(ns, ringName, id)
		rc.statefulSet = sts.Name
		reps[id] = startReplica(t, rc)
	}
	expectRingHeld(t, c, ns, ringName, ids)
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled", func() error { return allReconciled(c, ns, ringName, t) })

	from := time.Now()
	sts.Spec.Replicas = ptr.To(int32(1))
	if err := c.Update(context.Background(), sts); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"kshard-2", "kshard-1"} {
		reps[id].rep.Leave(context.Background())
		reps[id].stop(t)
	}
	expectRingHeld(t, c, ns, ringName, []string{"kshard-0"})
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled by kshard-0", func() error { return allReconciled(c, ns, ringName, t) })

	l, err := audit.ReadAPILogFile(apiAudit)
	if err != nil {
		t.Fatalf("reading the API server's audit log: %v", err)
	}
	// acquired[replica]: the shards whose Lease it took after the count
	// dropped (a new acquire time with it as holder).
	acquired := map[string][]string{}
	for _, w := range l.Writes {
		if w.Resource != "leases" || w.Namespace != ns || !strings.HasPrefix(w.Name, ringName+"-shard-") || w.Code >= 300 ||
			w.LeaseAcquired.Before(from) || w.LeaseHolder == "" {
			continue
		}
		if r := lease.HolderReplica(w.LeaseHolder); !slices.Contains(acquired[r], w.Name) {
			acquired[r] = append(acquired[r], w.Name)
		}
	}
	if got := acquired["kshard-1"]; len(got) > 0 {
		t.Errorf("kshard-1, which the StatefulSet no longer wanted, took %d shards after the scale-down: %v", len(got), got)
	}
	if len(acquired["kshard-0"]) == 0 {
		t.Errorf("kshard-0 took no shard after the scale-down (audit log since %s)", from.Format(time.StampMicro))
	}
	var caches []string
	for _, s := range l.Syncs {
		if s.Resource == "configbindings" && s.Shards != nil && strings.Contains(s.Group, "/namespaces/"+ns+"/") &&
			lease.HolderReplica(s.Holder) == "kshard-1" && s.Received.After(from) {
			caches = append(caches, fmt.Sprintf("%v at %s", s.Shards, s.Received.Format(time.StampMicro)))
		}
	}
	if len(caches) > 0 {
		t.Errorf("kshard-1 synced caches of ConfigBindings after the scale-down: %v", caches)
	}
}
